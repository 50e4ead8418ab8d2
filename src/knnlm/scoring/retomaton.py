"""RetoMaton's pointers over a cached kNN search (Alon et al. 2022, "Neuro-Symbolic Language Modeling with
Automaton-augmented Retrieval", Sec. 3 and 5.1; the reference code: neulab/retomaton and neulab/knn-transformers
retomaton.py).

Every datastore entry i (key, val) carries a pointer to entry i + 1: the context one token further on in the
datastore's text. Reading a text token by token, the entries of the last step whose val is the token that came
(and that are not the last entry) are followed to their successors; a kNN search is made only when fewer than
`min_pointers` of them survive, and then its neighbours join the pointed-to entries. p_kNN of the step is the
softmax over the scores of all those entries (searched ones with their cached distances, pointed-to ones with
their distance recomputed from the keys: the "real score"), at temperature τ:

    p_kNN(w) ∝ Σ_{i ∈ states, val_i = w} exp(s_i / τ),   s_i = −‖q − k_i‖² (L2) or q · k_i (IP).

At most `max_pointers` pointers are kept (the highest-scoring, as the reference code keeps the first max_knns of
its entries sorted by distance); an entry that is both searched and pointed to counts once (the reference code
concatenates both lists and may count it twice). Pointers are reset at the start of each document, so documents
are independent (they are the resampling unit of every interval) and run in parallel. The optional clustering of
entries into states (the paper's second component) is not applied here.

The fraction of saved searches (FoSS) is the share of tokens with no search.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..search._select import _distance

_TABLE = 4096  # slots of the per-step hash set of searched ids (a power of two ≥ 2 × the neighbours per query)


@njit(cache=True, inline='always')
def _slot(i, mask):
    return (np.uint64(i) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40) & np.uint64(mask)


@njit(parallel=True, cache=True, fastmath={'nnan', 'nsz', 'contract', 'arcp', 'reassoc'})
def _follow(starts, nb_ids, nb_dists, queries, keys_bits, keys_f32, f16, vals, targets, l2, min_ptr, max_ptr,
            inv_taus, table_size, lp, searched, states):
    """The pointer-following pass over documents [starts[d], starts[d+1]) in parallel; see follow_pointers."""
    n_keys = vals.shape[0]
    k = nb_ids.shape[1]
    d_dim = queries.shape[1]
    cap = k + max_ptr
    n_tau = inv_taus.shape[0]
    mask = table_size - 1
    two112 = np.float32(5.192296858534828e33)
    for d in prange(starts.shape[0] - 1):
        ptr = np.empty(max(max_ptr, 1), dtype=np.int64)
        n_ptr = 0
        cand_i = np.empty(cap, dtype=np.int64)
        cand_s = np.empty(cap, dtype=np.float64)
        cand_hit = np.empty(cap, dtype=np.bool_)
        nxt_i = np.empty(cap, dtype=np.int64)
        nxt_s = np.empty(cap, dtype=np.float64)
        table = np.full(table_size, -1, dtype=np.int64)
        bits = np.empty(d_dim, dtype=np.uint32)
        x16 = bits.view(np.float32)
        q = np.empty(d_dim, dtype=np.float32)
        for t in range(starts[d], starts[d + 1]):
            for c in range(d_dim):
                q[c] = queries[t, c]
            tgt = targets[t]
            do_search = n_ptr < min_ptr
            n = 0
            if do_search:
                table[:] = -1
                for j in range(k):
                    i = nb_ids[t, j]
                    if i < 0:
                        continue
                    cand_i[n] = i
                    cand_s[n] = -np.float64(nb_dists[t, j]) if l2 else np.float64(nb_dists[t, j])
                    n += 1
                    h = _slot(i, mask)
                    while table[h] >= 0 and table[h] != i:
                        h = (h + np.uint64(1)) & np.uint64(mask)
                    table[h] = i
            for p in range(n_ptr):
                i = ptr[p]
                if do_search:
                    h = _slot(i, mask)
                    seen = False
                    while table[h] >= 0:
                        if table[h] == i:
                            seen = True
                            break
                        h = (h + np.uint64(1)) & np.uint64(mask)
                    if seen:
                        continue
                if f16:
                    row = keys_bits[i]
                    for c in range(d_dim):
                        b = np.uint32(row[c])
                        bits[c] = ((b & np.uint32(0x8000)) << np.uint32(16)) | ((b & np.uint32(0x7FFF)) << np.uint32(13))
                    dist = _distance(x16, two112, q, l2)
                else:
                    dist = _distance(keys_f32[i], np.float32(1.0), q, l2)
                cand_i[n] = i
                cand_s[n] = -np.float64(dist) if l2 else np.float64(dist)
                n += 1
            searched[t] = do_search
            states[t] = n
            top = -np.inf
            n_hit = 0
            for c in range(n):
                cand_hit[c] = vals[cand_i[c]] == tgt
                top = max(top, cand_s[c])
            for a in range(n_tau):
                tot = 0.0
                hit = 0.0
                if inv_taus[a] == np.inf:  # τ → 0: the mass shared by the entries tied at the best score
                    for c in range(n):
                        if cand_s[c] == top:
                            tot += 1.0
                            if cand_hit[c]:
                                hit += 1.0
                else:
                    for c in range(n):
                        e = np.exp((cand_s[c] - top) * inv_taus[a])
                        tot += e
                        if cand_hit[c]:
                            hit += e
                lp[a, t] = np.log(hit) - np.log(tot) if hit > 0.0 else -np.inf
            for c in range(n):  # the entries whose val came, followed to their successors
                if cand_hit[c] and cand_i[c] < n_keys - 1:
                    nxt_i[n_hit] = cand_i[c] + 1
                    nxt_s[n_hit] = cand_s[c]
                    n_hit += 1
            if n_hit > max_ptr:
                order = np.argsort(-nxt_s[:n_hit], kind='mergesort')
                for p in range(max_ptr):
                    ptr[p] = nxt_i[order[p]]
                n_ptr = max_ptr
            else:
                for p in range(n_hit):
                    ptr[p] = nxt_i[p]
                n_ptr = n_hit


def follow_pointers(nb_ids: np.ndarray, nb_dists: np.ndarray, queries: np.ndarray, keys: np.ndarray,
                    vals: np.ndarray, targets: np.ndarray, doc: np.ndarray, metric: str, min_pointers: int,
                    temperatures, max_pointers: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RetoMaton's p_kNN(target) of every token of a text from its cached search (Alon et al. 2022, Sec. 3).

    nb_ids [T, K] int (−1 = none) and nb_dists [T, K] float32: each token's searched neighbours and their distances
    in faiss convention (squared L2 or IP; the real score: knnlm.search.exact.recompute_distances); queries [T, D]
    float32; keys [N, D] float16 or float32 (a memmap: only the pointed-to rows are read); vals [N] int; targets [T]
    int; doc [T] int: document of each token, non-decreasing (pointers start empty in each document); metric 'l2' |
    'ip'; min_pointers ≥ 1: a search is made when fewer pointers than this survive (min_pointers > max_pointers: at
    every token, the pointed-to entries joining the searched ones); temperatures: τ ≥ 0 values (τ = 0: the limit
    τ → 0, the mass shared by the entries tied at the best score); max_pointers: pointers
    kept per step (default K, as the reference code's max_knns = k).

    Returns (lp [len(temperatures), T] float64 log p_kNN(target), −inf where no state has the target; searched [T]
    bool; states [T] int32, the entries of each step's softmax). Raises ValueError for another metric, a
    min_pointers < 1, a τ < 0, mismatched shapes or a doc that decreases.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    if min_pointers < 1:
        raise ValueError(f"min_pointers must be ≥ 1 (a search when fewer pointers survive), found {min_pointers}")
    t, k = nb_ids.shape
    max_pointers = k if max_pointers is None else int(max_pointers)
    if nb_dists.shape != (t, k) or len(targets) != t or len(doc) != t or queries.shape[0] != t:
        raise ValueError(f"nb_ids {nb_ids.shape}, nb_dists {nb_dists.shape}, queries {queries.shape}, targets "
                         f"{len(targets)} and doc {len(doc)} must describe the same {t} tokens")
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"queries of dimension {queries.shape[1]} for keys of dimension {keys.shape[1]}")
    doc = np.asarray(doc)
    if t and np.any(np.diff(doc) < 0):
        raise ValueError("doc must be non-decreasing (the tokens of each document together, in order)")
    starts = np.concatenate([[0], np.flatnonzero(np.diff(doc)) + 1, [t]]).astype(np.int64) if t else np.zeros(1, np.int64)
    taus = np.atleast_1d(np.asarray(temperatures, dtype=np.float64))
    if (taus < 0).any():
        raise ValueError(f"temperature must be >= 0, found {taus.min()}")
    with np.errstate(divide="ignore"):
        inv_taus = np.where(taus > 0, 1.0 / np.where(taus > 0, taus, 1.0), np.inf)
    lp = np.empty((len(taus), t))
    searched = np.zeros(t, dtype=np.bool_)
    states = np.zeros(t, dtype=np.int32)
    k_arr = np.asarray(keys)
    f16 = k_arr.dtype == np.float16
    bits = k_arr.view(np.uint16) if f16 else np.zeros((1, 1), np.uint16)
    f32 = np.zeros((1, 1), np.float32) if f16 else np.ascontiguousarray(k_arr, dtype=np.float32)
    table = max(_TABLE, 1 << int(2 * k).bit_length())
    _follow(starts, np.ascontiguousarray(nb_ids), np.ascontiguousarray(nb_dists, dtype=np.float32),
            np.ascontiguousarray(queries, dtype=np.float32), bits, f32, f16, np.asarray(vals),
            np.asarray(targets, dtype=np.int64), metric == "l2", int(min_pointers), max_pointers, inv_taus, table,
            lp, searched, states)
    return lp, searched, states


def saved_searches(searched: np.ndarray) -> float:
    """The fraction of saved searches (FoSS, Alon et al. 2022, Sec. 5.1): the share of tokens with no search."""
    return float(1.0 - np.mean(searched)) if len(searched) else 0.0


def seen_ngram_share(train: np.ndarray, text: np.ndarray, n: int = 5) -> float:
    """The share of the n-grams of `text` [T] int (token ids) that occur in `train` [L] int (the datastore's token
    stream), by 64-bit rolled hashes (knnlm.scoring.ngram): Alon et al. tie RetoMaton's savings to it (21 % of
    WikiText-103's validation 5-grams occur in its training set). nan when text has fewer than n tokens."""
    from .ngram import _hashes

    if len(text) < n:
        return float("nan")
    a = b = None
    for j in range(1, n + 1):
        a, b = _hashes(train, j, a), _hashes(text, j, b)
    ref = np.unique(a)
    pos = np.minimum(np.searchsorted(ref, b), len(ref) - 1)
    return float(np.mean(ref[pos] == b)) if len(ref) else 0.0
