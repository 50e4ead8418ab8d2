"""numba kernel of the τ sweep (knnlm.scoring.interpolation.sweep_temperature): log p_kNN(target) for every τ from one pass per row.

For each query row (rows in parallel): the valid scores are shifted by the row's best score (in float64, then
stored as float32, so every exponent is ≤ 0), and for each τ the softmax denominator Σ_j exp(z_j / τ) is summed
with a float32 exp (2^x = 2^round(x) · 2^frac(x): the integer part built in the float's exponent bits,
the fraction by a degree-7 polynomial, relative error < 1e-7). Rows sorted best first (neighbour caches are) sum
only the prefix whose terms are above e^−cut of the best one. The hits' mass is summed the same way over the hits'
scores shifted by the best hit's (so it is ≥ 1 and never underflows), or, while the best hit's term is not far below
the best neighbour's (HIT_SHIFT), in the same pass as the denominator, masked.

The kernels' fast-math flags (FAST) leave out 'reassoc' and 'contract', and the sums fold pairwise in a fixed order
(_fold_sum), so a row's log-probs are the same bits wherever the code came from. With 'reassoc', numba's freshly
compiled code and the same function loaded from its cache vectorise the sums differently (numba issue #10617), and
a job's τ sweep and its recomputation in another process differ by ~1e-7 per log-prob. Measured at 16,384 rows ×
k = 1,024 × 10 τ on 2 cores (Intel Xeon): 0.097 s, against 0.075 s with reassociated sums and 0.13 s with sums in
index order.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_LOG2E = np.float32(1.4426950408889634)
_LN2 = 0.6931471805599453
# Taylor coefficients of e^y, y = r·ln 2 with |r| ≤ 0.5: |y| ≤ 0.347, truncation error y^8/8! < 6e-9
_C = tuple(np.float32(_LN2 ** i / math.factorial(i)) for i in range(8))
# fast-math without 'reassoc' and 'contract': the same float32 results from fresh and cached code (module docstring)
FAST = {"nnan", "ninf", "nsz", "arcp", "afn"}


@njit(cache=True, fastmath=FAST, inline='always')
def _exp_terms(z, w, inv_tau, frac, expo):
    """exp(z[j] · inv_tau) for j < w as frac[j] · 2^n[j] (z ≤ 0): the fraction by the polynomial into frac, the power of
    two as float32 exponent bits into expo (read as float32: expo.view(np.float32)). Terms below 2^−126 are flushed to
    2^−126 · poly, i.e. kept at ~1e-38, far under float32 resolution of a total ≥ 1. Inlined into the FAST callers
    only (both sums below)."""
    c0, c1, c2, c3, c4, c5, c6, c7 = _C
    a = inv_tau * _LOG2E
    for j in range(w):
        x = max(z[j] * a, np.float32(-126.0))
        n = np.floor(x + np.float32(0.5))
        r = x - n  # in [−0.5, 0.5]
        frac[j] = c0 + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))))
        expo[j] = (np.int32(n) + np.int32(127)) << np.int32(23)


@njit(cache=True, inline='always')
def _fold_size(w):
    """The power of two n ≥ max(w, 8) that _fold_sum folds: the length its scratch needs."""
    n = 8
    while n < w:
        n *= 2
    return n


@njit(cache=True, fastmath=FAST, inline='always')
def _fold_sum(e, w):
    """Σ_{j < w} e[j] in float32 by pairwise folding, a fixed order: e[w:n] set to 0 for the power of two n ≥ w, then
    e[j] += e[j + n/2] for j < n/2 while n > 8 (elementwise: vectorised without reassociation), then a tree of the
    last 8. e: [≥ _fold_size(w)] float32 scratch, overwritten."""
    n = _fold_size(w)
    for j in range(w, n):
        e[j] = np.float32(0.0)
    while n > 8:
        h = n // 2
        for j in range(h):
            e[j] += e[j + h]
        n = h
    return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]))


@njit(cache=True, fastmath=FAST)  # not inlined at numba's IR level: the caller runs without fast-math
def _exp_sum(z, w, inv_tau, frac, expo):
    """Σ_{j < w} exp(z[j] · inv_tau) for z ≤ 0 (float32, _exp_terms, summed by _fold_sum). frac/expo: float32/int32
    scratch of at least _fold_size(w)."""
    _exp_terms(z, w, inv_tau, frac, expo)
    scale = expo.view(np.float32)
    for j in range(w):
        frac[j] *= scale[j]
    return _fold_sum(frac, w)


@njit(cache=True, fastmath=FAST)
def _exp_sum_hits(z, hmask, w, inv_tau, frac, expo):
    """(Σ_{j < w} exp(z[j] · inv_tau), Σ_{j < w} hmask[j] · exp(z[j] · inv_tau)): _exp_sum with the hits' mass from
    the same terms (hmask [≥ w] float32, 1 at a hit, else 0), both summed by _fold_sum."""
    _exp_terms(z, w, inv_tau, frac, expo)
    scale = expo.view(np.float32)
    for j in range(w):
        frac[j] *= scale[j]
        scale[j] = frac[j] * hmask[j]
    return _fold_sum(frac, w), _fold_sum(scale, w)


@njit(cache=True, inline='always')
def _prefix(z, m, lim):
    """Length of the prefix of the sorted (descending) z[:m] whose values are > lim (at least 1)."""
    lo, hi = 1, m
    while lo < hi:
        mid = (lo + hi) // 2
        if z[mid] > lim:
            lo = mid + 1
        else:
            hi = mid
    return lo


# the hits' mass comes from the main pass while the best hit's term is ≥ e^−HIT_SHIFT of the best neighbour's (far
# above float32's smallest normal, 1.2e-38 ≈ e^−87, so the hits' terms that flush are < 1e-11 of it); below that a
# separate pass sums the hits shifted by the best hit's score
HIT_SHIFT = 60.0


@njit(parallel=True, cache=True)
def sweep_kernel(scores, hit, valid, inv_taus, cut, out):
    """out[i, t] = log p_kNN(target of t) at τ_i = 1 / inv_taus[i] (inv_taus[i] = inf: the τ → 0 limit, the mass of
    the neighbours tied at the best score). scores [T, k] float, hit/valid [T, k] bool, out [n_tau, T] float64.
    Rows with no valid hit get −inf for every τ."""
    T, k = scores.shape
    n_tau = inv_taus.shape[0]
    for t in prange(T):
        z = np.empty(k, dtype=np.float32)
        hz = np.empty(k, dtype=np.float64)
        hmask = np.zeros(k, dtype=np.float32)
        frac = np.empty(_fold_size(k), dtype=np.float32)  # _fold_sum's scratch, for any w ≤ k
        expo = np.empty(_fold_size(k), dtype=np.int32)
        m = 0
        nh = 0
        best = -np.inf
        for j in range(k):
            if valid[t, j]:
                best = max(best, np.float64(scores[t, j]))
        is_sorted = True
        n_top = 0
        n_top_hit = 0
        best_hit = -np.inf
        for j in range(k):
            if valid[t, j]:
                s = np.float64(scores[t, j]) - best  # exact in float64 (scores are float32)
                z[m] = np.float32(s)
                if m > 0 and z[m] > z[m - 1]:
                    is_sorted = False
                m += 1
                if s == 0.0:
                    n_top += 1
                if hit[t, j]:
                    hmask[m - 1] = np.float32(1.0)
                    hz[nh] = s
                    nh += 1
                    best_hit = max(best_hit, s)
                    if s == 0.0:
                        n_top_hit += 1
        hz32 = np.empty(nh, dtype=np.float32)  # the hits' scores shifted by the best hit's: ≤ 0, 0 at the best
        for h in range(nh):
            hz32[h] = np.float32(hz[h] - best_hit)
        for i in range(n_tau):
            if nh == 0:
                out[i, t] = -np.inf
                continue
            it = inv_taus[i]
            if np.isinf(it):
                out[i, t] = -np.inf if n_top_hit == 0 else math.log(n_top_hit / n_top)
                continue
            w = m
            if is_sorted:  # the terms above e^−cut are a prefix: binary search its length
                w = _prefix(z, m, np.float32(-cut / it))
            if best_hit * it >= -HIT_SHIFT:  # one pass: the terms and the hits' mass (the hits above e^−cut of
                if is_sorted:                # the best hit's included)
                    w = max(w, _prefix(z, m, np.float32(best_hit - cut / it)))
                total, hm_abs = _exp_sum_hits(z, hmask, w, np.float32(it), frac, expo)
                out[i, t] = math.log(np.float64(hm_abs)) - math.log(np.float64(total))
                continue
            total = _exp_sum(z, w, np.float32(it), frac, expo)
            hm = _exp_sum(hz32, nh, np.float32(it), frac, expo)  # ≥ 1: the best hit's term is 1
            out[i, t] = math.log(np.float64(hm)) + best_hit * it - math.log(np.float64(total))
