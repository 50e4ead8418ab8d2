"""kNN-LM scoring: p_kNN, interpolation with the base LM, λ tuning, oracle, perplexity.

Paper notation (Xu et al. 2023, Eq. 5; Khandelwal et al. 2020, Eq. 2):
  P = (1-λ) softmax(W_sm h_sm) + λ M softmax(mask-to-k(W_ds ⊗ h_ds) / τ)
The second term, evaluated at the target w, is p_kNN(w) = Σ_{i: v_i = w} exp(s_i/τ) / Σ_i exp(s_i/τ)
over the k retrieved neighbours i with vals v_i and scores s_i (s = −squared L2 distance, or the
inner product). All functions work in natural-log space and return float64 where they reduce.
"""
from __future__ import annotations

import math

import numpy as np

from ..io import ArtifactError, iter_chunks


def scores_from_distances(dists: np.ndarray, metric: str) -> np.ndarray:
    """Similarity scores (higher = closer) from faiss distances.

    dists: [T, k] float32 — squared L2 distances for metric 'l2', inner products for 'ip'.
    Returns [T, k] float32: −dists for 'l2', dists for 'ip'. Raises ValueError for other metrics.
    """
    if metric == "l2":
        return -dists
    if metric == "ip":
        return dists
    raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")


def knn_log_prob(scores: np.ndarray, nb_vals: np.ndarray, targets: np.ndarray, temperature: float = 1.0,
                 valid: np.ndarray | None = None) -> np.ndarray:
    """log p_kNN(target) per query (Eq. 2 / Eq. 5's second term at the target).

    scores: [T, k] float (higher = closer); nb_vals: [T, k] int, the neighbours' vals (next-token ids);
    targets: [T] int; temperature τ > 0; valid: optional [T, k] bool, False for missing neighbours
    (faiss id −1), which get no mass. Returns [T] float64; −inf where no neighbour's val is the target.
    Duplicate vals are summed (the aggregation matrix M).
    """
    hit = nb_vals == targets[:, None]
    return knn_log_prob_from_hits(scores, hit, np.ones_like(hit) if valid is None else valid, temperature)


def knn_log_prob_from_hits(scores: np.ndarray, hit: np.ndarray, valid: np.ndarray, temperature: float) -> np.ndarray:
    """knn_log_prob from hit/valid masks ([T, k] bool, see neighbour_hits) instead of vals and targets; [T] float64."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, found {temperature}")
    logits = np.where(valid, np.asarray(scores, dtype=np.float64) / temperature, -np.inf)
    return _log_p_hit(logits, hit)


def _log_p_hit(logits: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """log of the softmax(logits) mass on the `hit` entries, per row; −inf where a row has no hit."""
    lse_all = _logsumexp(logits)
    lse_hit = _logsumexp(np.where(hit, logits, -np.inf))
    with np.errstate(invalid="ignore"):
        out = lse_hit - lse_all
    return np.where(np.isneginf(lse_hit), -np.inf, out)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=1)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(x - m_safe[:, None]), axis=1)) + m_safe


def interpolate(lp_lm: np.ndarray, lp_knn: np.ndarray, lam: float) -> np.ndarray:
    """log((1−λ) p_LM + λ p_kNN), computed in log space. λ ∈ [0, 1]; λ=0 gives lp_lm exactly, λ=1 lp_knn."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], found {lam}")
    if lam == 0.0:
        return np.asarray(lp_lm, dtype=np.float64)
    if lam == 1.0:
        return np.asarray(lp_knn, dtype=np.float64)
    return np.logaddexp(np.log1p(-lam) + lp_lm.astype(np.float64), math.log(lam) + lp_knn.astype(np.float64))


def perplexity(log_probs: np.ndarray, count: int) -> float:
    """exp(−Σ log p / count): per token with count = len(log_probs), per word with count = word count.

    Returns inf if any log p is −inf (e.g. kNN-only PPL when a target is absent from the neighbours).
    """
    total = float(np.sum(log_probs, dtype=np.float64))
    if not np.isfinite(total):
        return math.inf
    return math.exp(-total / count)


def oracle_log_prob(lp_lm: np.ndarray, lp_knn: np.ndarray) -> np.ndarray:
    """Per token, the better of p_LM and p_kNN (the paper's oracle)."""
    return np.maximum(lp_lm.astype(np.float64), lp_knn.astype(np.float64))


def lambda_grid(steps: int) -> np.ndarray:
    """linspace(0, 1, steps) — the λ values tried on valid."""
    return np.linspace(0.0, 1.0, steps)


def tune_lambda(lp_lm: np.ndarray, lp_knn: np.ndarray, grid: np.ndarray) -> tuple[float, np.ndarray]:
    """Pick λ minimising the interpolated NLL over `grid` (the same λ minimises per-word and per-token PPL).

    Returns (best λ, [len(grid)] total NLL per λ in nats).
    """
    nll = interpolated_nll(lp_lm, lp_knn, grid)
    return float(grid[int(np.argmin(nll))]), nll


def interpolated_nll(lp_lm: np.ndarray, lp_knn: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """Total interpolated NLL (nats) per λ: [len(lambdas)]; NaN (from −inf − −inf) becomes inf."""
    nll = np.array([-np.sum(interpolate(lp_lm, lp_knn, float(l))) for l in lambdas])
    return np.where(np.isnan(nll), np.inf, nll)


def knn_log_prob_from_cache(ids: np.ndarray, dists: np.ndarray, vals: np.ndarray, targets: np.ndarray, metric: str,
                            temperature: float, chunk: int = 16384) -> np.ndarray:
    """log p_kNN(target) for every query from a neighbour cache, streaming in chunks of queries.

    ids: [T, k] int (−1 = no neighbour), dists: [T, k] float32 (faiss distances), vals: [N] int32 memmap
    (the datastore's vals), targets: [T] int. Returns [T] float64. Raises ArtifactError if an id is ≥ N.
    """
    T = ids.shape[0]
    out = np.empty(T, dtype=np.float64)
    n = vals.shape[0]
    for s, e in iter_chunks(T, chunk, ids, dists):  # the caches' pages leave the RSS chunk by chunk
        nb = np.asarray(ids[s:e])
        valid = nb >= 0
        if nb.size and nb.max() >= n:
            raise ArtifactError(f"neighbour id {int(nb.max())} out of range for a datastore of {n} vals")
        nb_vals = vals[np.where(valid, nb, 0)]  # fancy indexing reads only the pages it needs
        sc = scores_from_distances(np.asarray(dists[s:e]), metric)
        out[s:e] = knn_log_prob(sc, nb_vals, np.asarray(targets[s:e]), temperature, valid)
    return out


def knn_distribution(ids: np.ndarray, dists: np.ndarray, vals: np.ndarray, metric: str, temperature: float,
                     vocab: int) -> np.ndarray:
    """p_kNN over the whole vocabulary (Eq. 5's second term before λ: M softmax(mask-to-k(s) / τ)).

    ids: [B, k] int datastore rows (−1: no neighbour, no mass); dists: [B, k] float faiss distances (squared L2 for
    'l2', inner products for 'ip'); vals: [N] int the datastore's vals; temperature τ > 0; vocab: V. Returns [B, V]
    float64, each row summing to 1 (a row with no neighbour: all zeros). τ = 0 is the limit τ → 0, as in
    sweep_temperature: the mass shared by the neighbours tied at the best score. Raises ValueError for τ < 0 and
    ArtifactError for an id ≥ N or a val ≥ V."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, found {temperature}")
    ids = np.asarray(ids)
    valid = ids >= 0
    if ids.size and ids.max() >= len(vals):
        raise ArtifactError(f"neighbour id {int(ids.max())} out of range for a datastore of {len(vals)} vals")
    sc = np.where(valid, scores_from_distances(np.asarray(dists, dtype=np.float64), metric), -np.inf)
    if temperature == 0:
        top = sc.max(1, keepdims=True)
        w = (valid & (sc == top)).astype(np.float64)
    else:
        logits = sc / temperature
        top = logits.max(1, keepdims=True)
        w = np.where(valid, np.exp(logits - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = w.sum(1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    nb_vals = np.asarray(vals)[np.where(valid, ids, 0)].astype(np.int64)
    if nb_vals.size and nb_vals.max() >= vocab:
        raise ArtifactError(f"a neighbour's val {int(nb_vals.max())} is beyond the vocabulary of {vocab} tokens")
    flat = (np.arange(len(ids))[:, None] * vocab + nb_vals).ravel()
    return np.bincount(flat, weights=w.ravel(), minlength=len(ids) * vocab).reshape(len(ids), vocab)


def summarize(lp: np.ndarray, n_words: int) -> dict[str, float]:
    """{'ppl_word', 'ppl_token', 'nll_sum'} for per-token log-probs lp [T] (natural log)."""
    return {"ppl_word": perplexity(lp, n_words), "ppl_token": perplexity(lp, len(lp)),
            "nll_sum": float(-np.sum(lp, dtype=np.float64))}


def neighbour_hits(ids: np.ndarray, vals: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hit [T, k] bool: neighbour's val == target, valid [T, k] bool: id ≥ 0) — computed once, reused for every τ.

    Raises ValueError for mismatched shapes, IndexError for an id ≥ len(vals)."""
    from ..search._select import neighbour_hits_kernel

    ids, targets = np.asarray(ids), np.asarray(targets)
    if ids.ndim != 2 or targets.shape != ids.shape[:1]:
        raise ValueError(f"ids must be [T, k] and targets [T], found {ids.shape} and {targets.shape}")
    vals = np.asarray(vals)
    if ids.size and int(ids.max()) >= len(vals):  # the kernel does not bounds-check: refuse ids past the datastore
        raise IndexError(f"neighbour id {int(ids.max())} is out of range for a datastore of {len(vals)} vals")
    hit, valid = np.empty(ids.shape, dtype=bool), np.empty(ids.shape, dtype=bool)
    neighbour_hits_kernel(ids, vals, targets, hit, valid)  # one parallel pass (numba)
    return hit, valid


CUT = 30.0  # sweep_temperature leaves out softmax terms below e^−CUT of the best neighbour's


def sweep_temperature(scores: np.ndarray, hit: np.ndarray, valid: np.ndarray, temperatures) -> np.ndarray:
    """log p_kNN(target) for every τ in `temperatures` from one neighbour cache, no new search (paper Sec. 6, Fig. 5).

    scores: [T, k] float (higher = closer), hit/valid: [T, k] bool from neighbour_hits; temperatures: τ ≥ 0,
    where τ = 0 is the limit τ → 0 (the mass is shared by the neighbours tied at the best score).
    Returns [len(temperatures), T] float64; for τ > 0 each row equals knn_log_prob(scores, ·, ·, τ, valid) to
    ~1e-6 relative (float32 denominators). −inf where a row has no valid hit.
    Fast path (knnlm.scoring._sweep.sweep_kernel, numba): rows in parallel, every τ applied to a row while it is in
    cache, a vectorised float32 exp; rows sorted best first (neighbour caches are) sum only the terms above e^−CUT of
    the best neighbour's (≤ k · e^−30 ≈ 1e-10 of a total ≥ 1 is left out, under float32 resolution).
    Raises ValueError for τ < 0 or mismatched shapes.
    """
    from ._sweep import sweep_kernel

    taus = np.array([float(t) for t in temperatures], dtype=np.float64)
    if (taus < 0).any():
        raise ValueError(f"temperature must be >= 0, found {taus.min()}")
    scores, hit, valid = np.asarray(scores), np.asarray(hit, dtype=bool), np.asarray(valid, dtype=bool)
    if scores.ndim != 2 or hit.shape != scores.shape or valid.shape != scores.shape:
        raise ValueError(f"scores, hit and valid must be [T, k] of one shape, found {scores.shape}, {hit.shape}, "
                         f"{valid.shape}")
    if scores.dtype not in (np.float32, np.float64):
        scores = scores.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv_taus = np.where(taus > 0, 1.0 / np.where(taus > 0, taus, 1.0), np.inf)
    out = np.empty((len(taus), scores.shape[0]))
    sweep_kernel(scores, hit, valid, inv_taus, CUT, out)
    return out


def nll_grid(lp_lm: np.ndarray, lp_knn_per_tau: np.ndarray, lambdas: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Total interpolated NLL (nats) for every (τ, λ): [n_tau, n_lambda] float64 (the τ×λ sweep of Fig. 5).

    lp_lm: [T] log p_LM, lp_knn_per_tau: [n_tau, T] log p_kNN, lambdas: [n_lambda] in [0, 1].
    −log((1−λ) p_LM + λ p_kNN) is evaluated in probability space in float32 and summed in float64, so a
    grid point agrees with interpolated_nll to ~1e-6 relative; use it to pick (τ, λ), then report with
    interpolate(). inf where λ = 1 and some p_kNN = 0.
    """
    import torch

    lam = torch.as_tensor(np.asarray(lambdas, dtype=np.float32))[:, None]
    out = np.zeros((lp_knn_per_tau.shape[0], len(lam)))
    for s0, s1 in iter_chunks(len(lp_lm), chunk):
        p_lm = torch.as_tensor(np.asarray(lp_lm[s0:s1], dtype=np.float64)).exp().float()[None]
        for i in range(lp_knn_per_tau.shape[0]):
            p_knn = torch.as_tensor(np.asarray(lp_knn_per_tau[i, s0:s1], dtype=np.float64)).exp().float()[None]
            mix = torch.addcmul(p_lm, lam, p_knn - p_lm).clamp_min_(0)  # (1−λ) p_LM + λ p_kNN
            out[i] -= mix.log_().sum(1, dtype=torch.float64).numpy()
    return out


def sweep_temperature_from_cache(ids: np.ndarray, dists: np.ndarray, vals: np.ndarray, targets: np.ndarray, metric: str,
                                 temperatures, chunk: int = 32768) -> np.ndarray:
    """sweep_temperature over a whole neighbour cache, a chunk of queries at a time (the cache's memmaps are never
    whole in RAM): [len(temperatures), T] float64 log p_kNN(target) for every τ (paper Sec. 5, Figure 5).

    ids: [T, k] int (−1 = no neighbour), dists: [T, k] float32 faiss distances, vals: [N] int32, targets: [T].
    """
    out = np.empty((len(temperatures), ids.shape[0]))
    for s, e in iter_chunks(ids.shape[0], chunk, ids, dists):
        hit, valid = neighbour_hits(ids[s:e], vals, np.asarray(targets[s:e]))
        out[:, s:e] = sweep_temperature(scores_from_distances(np.asarray(dists[s:e]), metric), hit, valid, temperatures)
    return out


TIE_RTOL = 1e-9  # values this close (relative) are ties: the parallel sums' rounding differs from run to run


def first_minimum(values, rtol: float = TIE_RTOL, taus=None) -> int:
    """Index of the minimum of `values` (1-D, finite somewhere), values within `rtol` (relative) of it counting as
    ties (the rounding of the parallel sums), so the same data give the same choice on every run and machine. Ties
    go to the first value; with `taus` (the τ of each value, ascending) to the first tied τ > 0, so the limit τ = 0
    is chosen only when it alone is best, and when every τ ties (k = 1, or λ* = 0: the data cannot tell τ values
    apart) to the τ closest to 1 in log scale (the untuned τ of Khandelwal et al. 2020), the smaller on equal
    distance. The first of a tied run is robust to rounding (the run's far end is not), so it is what a flat curve
    gives."""
    v = np.asarray(values, dtype=np.float64)
    best = np.nanmin(v)
    tied = np.flatnonzero(v <= best + rtol * abs(best))
    if taus is None or len(tied) == 1:
        return int(tied[0])
    t = np.asarray(taus, dtype=np.float64)
    if len(tied) == len(v):
        with np.errstate(divide="ignore"):
            dist = np.where(t > 0, np.abs(np.log(np.where(t > 0, t, 1.0))), np.inf)
        return int(np.lexsort((t, dist))[0])
    positive = tied[t[tied] > 0]
    return int(positive[0] if len(positive) else tied[0])


def tune_temperature(lp_lm_valid: np.ndarray, sweep_valid: np.ndarray, temperatures, lambda_steps: int) -> int:
    """Index of the τ whose best λ (over linspace(0, 1, lambda_steps)) gives the lowest valid NLL (the minimum of
    nll_grid, found by best_lambda_per_tau; ties within TIE_RTOL go to the first τ > 0, or with every τ tied to
    the τ closest to 1: first_minimum; to the first value when `temperatures` is None)."""
    _, nll = best_lambda_per_tau(lp_lm_valid, sweep_valid, lambda_grid(lambda_steps))
    return first_minimum(nll, taus=temperatures)


def best_lambda_per_tau(lp_lm: np.ndarray, lp_knn_per_tau: np.ndarray, lambdas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every τ, the grid λ minimising the interpolated NLL, and that NLL: (idx [n_tau] int, nll [n_tau] float64).

    The NLL −Σ log((1−λ) p_LM + λ p_kNN) is convex in λ (a sum of −log of affine functions), so on a sorted grid
    its values are discretely convex and the first index whose forward difference is ≥ 0 is the grid's argmin
    (nll_grid(...).argmin(1), the same first minimum): a binary search evaluates ~2 log2(n_lambda) grid points
    instead of all of them (the τ × λ sweep of Figure 5). lambdas: sorted [n_lambda] in [0, 1].
    """
    lams = np.asarray(lambdas, dtype=np.float64)
    n_tau, n = lp_knn_per_tau.shape[0], len(lams)
    lo, hi = np.zeros(n_tau, dtype=np.int64), np.full(n_tau, n - 1, dtype=np.int64)
    cache: dict[tuple[int, int], float] = {}

    def f(rows: np.ndarray, idx: np.ndarray) -> np.ndarray:
        need = [(int(r), int(i)) for r, i in zip(rows, idx) if (int(r), int(i)) not in cache]
        if need:
            for (r, i), v in zip(need, _nll_points(lp_lm, lp_knn_per_tau, need, lams)):
                cache[(r, i)] = v
        return np.array([cache[(int(r), int(i))] for r, i in zip(rows, idx)])

    rows = np.arange(n_tau)
    while (lo < hi).any():  # invariant: the first i with f(i+1) − f(i) ≥ 0 (or i = n − 1) lies in [lo, hi]
        act = rows[lo < hi]
        mid = (lo[act] + hi[act]) // 2
        up = f(act, mid + 1) - f(act, mid) >= 0  # inf − inf (NaN) never happens: f(mid) < inf below λ = 1
        hi[act[up]] = mid[up]
        lo[act[~up]] = mid[~up] + 1
    return lo, f(rows, lo)


def _nll_points(lp_lm: np.ndarray, lp_knn_per_tau: np.ndarray, points: list[tuple[int, int]], lams: np.ndarray,
                chunk: int = 8192) -> np.ndarray:
    """Total interpolated NLL (nats) at the (τ row, λ index) points, evaluated like nll_grid (float32 in probability
    space, float64 sums), so the two agree on every grid point."""
    import torch

    r = np.array([p[0] for p in points])
    lam = torch.as_tensor(lams[[p[1] for p in points]].astype(np.float32))[:, None]
    out = np.zeros(len(points))
    for s0, s1 in iter_chunks(len(lp_lm), chunk):
        p_lm = torch.as_tensor(np.asarray(lp_lm[s0:s1], dtype=np.float64)).exp().float()[None]
        p_knn = torch.as_tensor(np.asarray(lp_knn_per_tau[r, s0:s1], dtype=np.float64)).exp().float()
        mix = torch.addcmul(p_lm, lam, p_knn - p_lm).clamp_min_(0)
        out -= mix.log_().sum(1, dtype=torch.float64).numpy()
    return out


EVAL_SPLITS = ("valid", "test")  # the splits every sweep covers (knnlm.scoring.results.SPLITS)


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |approx ∩ exact| / k: how many of the exact top-k neighbours ([t, k] ids, −1 = none)
    the approximate search found, i.e. how approximate "approximate" was (Xu et al. 2023, Sec. 5)."""
    import numba

    from ..search._select import overlap_counts_kernel

    a, e = np.asarray(approx), np.asarray(exact)
    if a.ndim != 2 or e.ndim != 2 or len(a) != len(e):
        raise ValueError(f"approx and exact must be [t, k] ids of the same t, found {a.shape} and {e.shape}")
    if a.size == 0:
        return float("nan")
    found = np.empty(len(a), dtype=np.int64)
    overlap_counts_kernel(a, e, found, 4 * numba.get_num_threads())  # numba, blocks of rows in parallel
    return float(found.mean() / e.shape[1])


def temperature_sweep(lp_lm: dict[str, np.ndarray], sweeps: dict[str, dict[str, np.ndarray]], words: dict[str, int],
                      taus: list[float], lambda_steps: int, docs: dict | None = None, stats: dict | None = None) -> dict:
    """The τ × λ sweep of Figure 5 (Xu et al. 2023, Sec. 5.2) from cached neighbours, per mask/score setting.

    lp_lm: {split: [T_s] float64}; sweeps: {setting: {split: [len(taus), T_s] float64 log p_kNN(target) per τ
    (knnlm.scoring.interpolation.sweep_temperature; load_settings)}}; words: {split: int}; taus: τ grid (τ = 0: the
    limit τ → 0); λ grid = linspace(0, 1, lambda_steps). Per τ, λ is tuned on valid (best_lambda_per_tau, the argmin of
    nll_grid); the interpolated perplexities of both
    splits at that λ are recomputed exactly (interpolate). The best τ minimises the valid NLL. With `docs`
    ({split: (doc [T_s], doc_words [D], ids)}) and `stats` (config 'stats'), each curve gets a 95 % band over
    documents ('{split}_lo', '{split}_hi'; knnlm.statistics.intervals.ppl_intervals, config 'stats.interval'). Returns
    per setting: {'tau', 'lambda', '{split}_interp_ppl_word', '{split}_interp_ppl_token', 'best': {'tau', 'lambda',
    ...}, 'lp_best': {split: [T_s] log p_kNN at the best τ}}; the caller pops 'lp_best' (arrays) before writing JSON.
    """
    from ..statistics.intervals import per_document, ppl_intervals

    lams = lambda_grid(lambda_steps)
    out = {}
    for setting, sweep in sweeps.items():
        best_l, _ = best_lambda_per_tau(lp_lm["valid"], sweep["valid"], lams)  # [n_tau], = nll_grid's argmin
        res = {"tau": list(taus), "lambda": [float(lams[j]) for j in best_l]}
        for split in EVAL_SPLITS:
            lp = np.stack([interpolate(lp_lm[split], sweep[split][i], float(lams[j])) for i, j in enumerate(best_l)])
            summ = [summarize(row, words[split]) for row in lp]
            res[f"{split}_interp_ppl_word"] = [x["ppl_word"] for x in summ]
            res[f"{split}_interp_ppl_token"] = [x["ppl_token"] for x in summ]
            if docs is not None:
                doc, doc_words, _ = docs[split]
                nll = per_document(-lp, doc, len(doc_words))
                lo, hi = ppl_intervals(nll, doc_words, stats)
                res[f"{split}_lo"], res[f"{split}_hi"] = lo.tolist(), hi.tolist()
        i = first_minimum(res["valid_interp_ppl_word"], taus=taus)  # ties (to rounding): first_minimum's rule
        res["best"] = {"tau": taus[i], "lambda": res["lambda"][i], "valid_interp_ppl_word": res["valid_interp_ppl_word"][i],
                       "test_interp_ppl_word": res["test_interp_ppl_word"][i],
                       "test_interp_ppl_token": res["test_interp_ppl_token"][i]}
        res["lp_best"] = {s: sweep[s][i] for s in EVAL_SPLITS}
        out[setting] = res
    return out
