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
def _weighted_sweeps(scores, hit, weights, inv_taus, out):
    nv = weights.shape[0]
    t, k = scores.shape
    for r in prange(t):
        top = np.full(nv, -np.inf)
        for v in range(nv):
            for j in range(k):
                if weights[v, r, j] > 0 and scores[r, j] > top[v]:
                    top[v] = scores[r, j]
        best = top.max()
        if best == -np.inf:  # no neighbour in any of the datastores
            out[:, :, r] = -np.inf
            continue
        tot = np.zeros(nv)
        h = np.zeros(nv)
        for a in range(inv_taus.shape[0]):
            it = inv_taus[a]
            tot[:] = 0.0
            h[:] = 0.0
            for j in range(k):
                if it == np.inf:
                    for v in range(nv):
                        e = np.float64(weights[v, r, j]) if scores[r, j] == top[v] else 0.0
                        tot[v] += e
                        if hit[r, j]:
                            h[v] += e
                    continue
                if scores[r, j] > best:  # in none of the datastores (best is the best present in any)
                    continue
                e = np.exp((np.float64(scores[r, j]) - best) * it)
                for v in range(nv):
                    we = np.float64(weights[v, r, j]) * e
                    tot[v] += we
                    if hit[r, j]:
                        h[v] += we
            for v in range(nv):
                if it != np.inf and (top[v] - best) * it < -600.0:  # its own best far below: sum relative to it
                    tot[v] = 0.0
                    h[v] = 0.0
                    for j in range(k):
                        wj = np.float64(weights[v, r, j])
                        if wj > 0:
                            e = wj * np.exp((np.float64(scores[r, j]) - top[v]) * it)
                            tot[v] += e
                            if hit[r, j]:
                                h[v] += e
                out[v, a, r] = np.log(h[v]) - np.log(tot[v]) if h[v] > 0.0 else -np.inf


def weighted_sweep(scores: np.ndarray, hit: np.ndarray, weight: np.ndarray, temperatures) -> np.ndarray:
    """log p_kNN(target) for every τ of a datastore whose entries carry counts: p ∝ Σ_hits s_i exp(score_i / τ).

    scores [T, k] float (higher = closer), hit [T, k] bool (the neighbour's val is the target), weight [T, k] float:
    each neighbour's count s_i (0 = not in the datastore: a removed entry or a missing neighbour); temperatures: τ ≥ 0
    (τ = 0: the limit τ → 0, the mass shared by the best-scoring entries present, by their counts). Returns
    [len(temperatures), T] float64, −inf where no present neighbour is a hit. With every weight 1 it is
    knnlm.scoring.interpolation.sweep_temperature. Raises ValueError for mismatched shapes or a τ < 0.
    """
    return weighted_sweeps(scores, hit, np.asarray(weight)[None], temperatures)[0]


def weighted_sweeps(scores: np.ndarray, hit: np.ndarray, weights: np.ndarray, temperatures) -> np.ndarray:
    """weighted_sweep for V datastores over the same neighbours at once: weights [V, T, k] (each datastore's counts of
    the neighbours, as float32); returns [V, len(temperatures), T] float64. Each exp(score / τ) is computed once for all V
    (relative to the best score present in any of them; a datastore whose own best lies more than 600 nats below
    it is summed relative to its own, so nothing underflows). Raises ValueError as weighted_sweep."""
    scores, hit = np.asarray(scores), np.asarray(hit, dtype=bool)
    weights = np.asarray(weights, dtype=np.float32)  # counts: exact in float32 below 2**24
    if scores.ndim != 2 or hit.shape != scores.shape or weights.ndim != 3 or weights.shape[1:] != scores.shape:
        raise ValueError(f"scores and hit must be [T, k] and weights [V, T, k] of that shape, found {scores.shape}, "
                         f"{hit.shape}, {weights.shape}")
    taus = np.array([float(x) for x in temperatures], dtype=np.float64)
    if (taus < 0).any():
        raise ValueError(f"temperature must be >= 0, found {taus.min()}")
    with np.errstate(divide="ignore"):
        inv = np.where(taus > 0, 1.0 / np.where(taus > 0, taus, 1.0), np.inf)
    out = np.empty((weights.shape[0], len(taus), scores.shape[0]))
    _weighted_sweeps(np.ascontiguousarray(scores, dtype=np.float32), np.ascontiguousarray(hit),
                     np.ascontiguousarray(weights), inv, out)
    return out


def random_counts(n: int, remove: int, seed: int = 0) -> np.ndarray:
    """[n] int32 counts of a seeded uniform random subset of n − remove entries (1 kept, 0 removed): the equal-size
    baseline of greedy merging."""
    counts = np.ones(n, dtype=np.int32)
    counts[np.random.default_rng(seed).choice(n, size=min(max(remove, 0), n), replace=False)] = 0
    return counts
