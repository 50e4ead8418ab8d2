"""numba kernels of the exact search's running top-k on the CPU (knnlm.exact._RunningTopKCPU).

select_block: for every row (in parallel), one pass over its scores; a score ≥ the row's threshold is appended to
the row's candidate buffer; a full buffer is merged with the row's top-k (merge_row), which raises the threshold
to the new k-th best. merge_buffers: the final merge of what is left in the buffers. Scores are float32, ids int64.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True)
def merge_row(top_s, top_i, buf_s, buf_i, f):
    """Merge the first f buffered candidates of one row into its top-k (in place, by partial sort: the k-th best
    is found with np.partition, then the entries above it and as many ties as fit are kept); returns the new
    k-th best score."""
    k = top_s.shape[0]
    n = k + f
    s = np.empty(n, dtype=np.float32)
    ids = np.empty(n, dtype=np.int64)
    s[:k] = top_s
    ids[:k] = top_i
    s[k:] = buf_s[:f]
    ids[k:] = buf_i[:f]
    kth = np.partition(s.copy(), n - k)[n - k]
    j = 0
    for a in range(n):  # strictly better than the k-th best: fewer than k of them
        if s[a] > kth:
            top_s[j] = s[a]
            top_i[j] = ids[a]
            j += 1
    for a in range(n):  # ties at the k-th best fill the rest, first come first kept
        if j == k:
            break
        if s[a] == kth:
            top_s[j] = s[a]
            top_i[j] = ids[a]
            j += 1
    return kth


GROUP = 16  # scores per group: a group whose maximum is below the row's threshold is skipped whole


@njit(cache=True, fastmath=True, inline='always')
def _group_max(row, g0, g1):
    """max of row[g0:g1] (a vectorised reduction: fastmath lets LLVM reorder it)."""
    gm = row[g0]
    for j in range(g0 + 1, g1):
        gm = max(gm, row[j])
    return gm


@njit(parallel=True, cache=True)
def select_block(sc, col_ids, thr, buf_s, buf_i, fill, top_s, top_i):
    """Offer a [m, n] block of scores (col_ids [n]) to the running top-k of its m rows (see the module doc).

    Scores are read in groups of GROUP: the group's maximum (vectorised) decides whether any of its scores can
    pass the threshold; only then are its scores compared one by one. Once the threshold is near the k-th best,
    almost every group is skipped, so the pass costs about one vectorised max per score."""
    m, n = sc.shape
    cap = buf_s.shape[1]
    for r in prange(m):
        t = thr[r]
        f = fill[r]
        row = sc[r]
        for g0 in range(0, n, GROUP):
            g1 = min(n, g0 + GROUP)
            if _group_max(row, g0, g1) < t:
                continue
            for j in range(g0, g1):
                v = row[j]
                if v >= t:
                    if f == cap:
                        kth = merge_row(top_s[r], top_i[r], buf_s[r], buf_i[r], f)
                        f = 0
                        if kth > t:
                            t = kth
                        if v < t:
                            continue
                    buf_s[r, f] = v
                    buf_i[r, f] = col_ids[j]
                    f += 1
        fill[r] = f
        thr[r] = t


@njit(parallel=True, cache=True)
def merge_buffers(buf_s, buf_i, fill, top_s, top_i):
    """Merge every row's remaining candidates into its top-k."""
    for r in prange(top_s.shape[0]):
        if fill[r] > 0:
            merge_row(top_s[r], top_i[r], buf_s[r], buf_i[r], fill[r])
            fill[r] = 0



@njit(parallel=True, cache=True)
def neighbour_hits_kernel(ids, vals, targets, hit, valid):
    """hit[t, j] = ids[t, j] ≥ 0 and vals[ids[t, j]] == targets[t]; valid[t, j] = ids[t, j] ≥ 0 (in place, one pass;
    knnlm.scoring.neighbour_hits)."""
    for t in prange(ids.shape[0]):
        y = targets[t]
        for j in range(ids.shape[1]):
            i = ids[t, j]
            ok = i >= 0
            valid[t, j] = ok
            hit[t, j] = ok and vals[i] == y
