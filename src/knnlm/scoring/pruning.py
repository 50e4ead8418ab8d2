"""A smaller datastore by greedy merging (He et al. 2021, "Efficient Nearest Neighbor Language Models", Sec. 4.2,
Algorithm 1; their reference code: jxhe/efficient-knnlm, dstore_compression/greedy_merge.py), and the kNN
distribution of a datastore whose entries carry counts.

Greedy merging visits the entries in a seeded random order; an entry still present absorbs each of its retrieved
neighbours that has the same val and has neither been absorbed nor absorbed another (count 1): the neighbour is
removed and the entry's count s_i grows by one. The kNN-LM over the merged datastore adds log s_i to each entry's
logit, p_kNN(w) ∝ Σ_{i: val_i = w} s_i exp(score_i / τ), so a merged entry weighs as much as the entries it stands
for. Stopping once a target number of entries is removed gives a datastore of a chosen size (the reference code
traverses every entry and sets the size through the neighbours per entry).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True)
def _merge(order, nb_ids, vals, target, counts):
    removed = 0
    for cur in order:
        if removed >= target:
            break
        if counts[cur] <= 0:
            continue
        for j in range(nb_ids.shape[1]):
            v = nb_ids[cur, j]
            if v < 0 or v == cur or counts[v] != 1 or vals[v] != vals[cur]:
                continue
            counts[v] = 0
            counts[cur] += 1
            removed += 1
            if removed >= target:
                break
    return removed


def greedy_merge(nb_ids: np.ndarray, vals: np.ndarray, remove: int, seed: int = 0) -> np.ndarray:
    """Counts after greedy merging (He et al. 2021, Algorithm 1) until `remove` entries are absorbed.

    nb_ids [N, K] int: each entry's retrieved neighbours (its own id among them is skipped; −1 = none); vals [N] int;
    remove ≥ 0: entries to absorb (fewer when the neighbours run out first); seed: the visiting order's. Returns
    counts [N] int32: 0 for an absorbed entry, else 1 + the entries it absorbed (they sum to N). Raises ValueError for
    mismatched shapes or a negative `remove`.
    """
    nb_ids = np.ascontiguousarray(nb_ids)
    n = len(vals)
    if nb_ids.ndim != 2 or nb_ids.shape[0] != n:
        raise ValueError(f"nb_ids must be [N, K] for the {n} entries of vals, found {nb_ids.shape}")
    if remove < 0:
        raise ValueError(f"remove must be ≥ 0, found {remove}")
    if n and int(nb_ids.max()) >= n:
        raise ValueError(f"neighbour id {int(nb_ids.max())} is out of range for a datastore of {n} entries")
    counts = np.ones(n, dtype=np.int32)
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    _merge(order, nb_ids, np.asarray(vals), int(remove), counts)
    return counts


@njit(parallel=True, cache=True, fastmath={'nsz', 'arcp', 'contract', 'afn'})
def _weighted_sweep(scores, hit, weight, inv_taus, out):
    t, k = scores.shape
    for r in prange(t):
        top = -np.inf
        for j in range(k):
            if weight[r, j] > 0 and scores[r, j] > top:
                top = scores[r, j]
        for a in range(inv_taus.shape[0]):
            tot = 0.0
            h = 0.0
            it = inv_taus[a]
            for j in range(k):
                wj = weight[r, j]
                if wj <= 0:
                    continue
                if it == np.inf:
                    e = wj if scores[r, j] == top else 0.0
                else:
                    e = wj * np.exp((np.float64(scores[r, j]) - top) * it)
                tot += e
                if hit[r, j]:
                    h += e
            out[a, r] = np.log(h) - np.log(tot) if h > 0.0 else -np.inf


def weighted_sweep(scores: np.ndarray, hit: np.ndarray, weight: np.ndarray, temperatures) -> np.ndarray:
    """log p_kNN(target) for every τ of a datastore whose entries carry counts: p ∝ Σ_hits s_i exp(score_i / τ).

    scores [T, k] float (higher = closer), hit [T, k] bool (the neighbour's val is the target), weight [T, k] float:
    each neighbour's count s_i (0 = not in the datastore: a removed entry or a missing neighbour); temperatures: τ ≥ 0
    (τ = 0: the limit τ → 0, the mass shared by the best-scoring entries present, by their counts). Returns
    [len(temperatures), T] float64, −inf where no present neighbour is a hit. With every weight 1 it is
    knnlm.scoring.interpolation.sweep_temperature. Raises ValueError for mismatched shapes or a τ < 0.
    """
    scores, hit, weight = np.asarray(scores), np.asarray(hit, dtype=bool), np.asarray(weight, dtype=np.float64)
    if scores.ndim != 2 or hit.shape != scores.shape or weight.shape != scores.shape:
        raise ValueError(f"scores, hit and weight must be [T, k] of one shape, found {scores.shape}, {hit.shape}, "
                         f"{weight.shape}")
    taus = np.array([float(x) for x in temperatures], dtype=np.float64)
    if (taus < 0).any():
        raise ValueError(f"temperature must be >= 0, found {taus.min()}")
    with np.errstate(divide="ignore"):
        inv = np.where(taus > 0, 1.0 / np.where(taus > 0, taus, 1.0), np.inf)
    out = np.empty((len(taus), scores.shape[0]))
    _weighted_sweep(np.ascontiguousarray(scores, dtype=np.float32), np.ascontiguousarray(hit),
                    np.ascontiguousarray(weight), inv, out)
    return out


def random_counts(n: int, remove: int, seed: int = 0) -> np.ndarray:
    """[n] int32 counts of a seeded uniform random subset of n − remove entries (1 kept, 0 removed): the equal-size
    baseline of greedy merging."""
    counts = np.ones(n, dtype=np.int32)
    counts[np.random.default_rng(seed).choice(n, size=min(max(remove, 0), n), replace=False)] = 0
    return counts
