"""What a generation experiment measures per step and per continuation (Wang et al. 2023, "kNN-LM does not improve
open-ended text generation"): the entropy of a next-token distribution, nucleus (top-p) sampling, and the
diversity of a continuation (distinct-n, Li et al. 2016; the share of repeated n-grams, Welleck et al. 2020's seq-rep-n).
"""
from __future__ import annotations

import numpy as np


def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats of each row of p [B, V] (non-negative, rows summing to 1; 0 · log 0 = 0): [B] float64."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(1)


def top_p_sample(p: np.ndarray, top_p: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row of p [B, V] (probabilities, rows summing to 1) by nucleus sampling (Holtzman et al. 2020): the
    smallest set of most probable tokens whose mass reaches top_p (ties by token id), renormalised; top_p = 1 samples
    from the whole distribution. Returns [B] int64. Raises ValueError unless 0 < top_p ≤ 1."""
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], found {top_p}")
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(-p, axis=1, kind="stable")
    sp = np.take_along_axis(p, order, 1)
    cum = np.cumsum(sp, 1)
    # keep a token while the mass before it is below top_p: the first token always, the one that crosses top_p too
    keep = (cum - sp) < top_p * cum[:, -1:]
    sp = np.where(keep, sp, 0.0)
    u = rng.random(len(p)) * sp.sum(1)
    pick = np.minimum((np.cumsum(sp, 1) <= u[:, None]).sum(1), keep.sum(1) - 1)
    return order[np.arange(len(p)), pick].astype(np.int64)


def distinct_n(seqs: np.ndarray, n: int) -> np.ndarray:
    """Per sequence of seqs [S, L] int, its distinct n-grams over its n-grams (L − n + 1 of them): [S] float64 in
    (0, 1]. 1 − distinct_n(seqs, 4) is seq-rep-4, the share of repeated 4-grams. Raises ValueError unless 1 ≤ n ≤ L."""
    seqs = np.asarray(seqs, dtype=np.int64)
    s, length = seqs.shape
    if not 1 <= n <= length:
        raise ValueError(f"n-grams of n = {n} in sequences of {length} tokens")
    grams = np.lib.stride_tricks.sliding_window_view(seqs, n, axis=1)  # [S, L − n + 1, n]
    return np.array([len(np.unique(g, axis=0)) / len(g) for g in grams], dtype=np.float64)
