"""Vectorised kNN scoring vs a brute-force per-token Python reference (Eq. 2 / Eq. 5)."""
import math

import numpy as np
import pytest

from knnlm.scoring.interpolation import (interpolate, knn_log_prob, knn_log_prob_from_cache, oracle_log_prob,
                                         perplexity, scores_from_distances, tune_lambda)


def brute_p_knn(scores, vals, target, tau, valid=None):
    """p_kNN(target) for one query, by explicit loops over neighbours."""
    num = den = 0.0
    for j in range(len(scores)):
        if valid is not None and not valid[j]:
            continue
        w = math.exp(scores[j] / tau)
        den += w
        if vals[j] == target:
            num += w
    return num / den if den > 0 else 0.0


def brute_interp(p_lm, p_knn, lam):
    return (1 - lam) * p_lm + lam * p_knn


@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_knn_log_prob_matches_bruteforce(tau):
    rng = np.random.default_rng(0)
    T, k, V = 50, 16, 6  # small vocab: many duplicate vals per query
    scores = rng.normal(size=(T, k)).astype(np.float32) * 3
    vals = rng.integers(0, V, size=(T, k))
    targets = rng.integers(0, V + 2, size=T)  # V, V+1 are never retrieved -> absent
    valid = rng.random((T, k)) > 0.1
    got = knn_log_prob(scores, vals, targets, tau, valid)
    for t in range(T):
        p = brute_p_knn(scores[t].astype(np.float64), vals[t], targets[t], tau, valid[t])
        if p == 0:
            assert got[t] == -np.inf
        else:
            assert got[t] == pytest.approx(math.log(p), rel=1e-9, abs=1e-9)
    assert np.isneginf(got).any() and np.isfinite(got).any()


def test_duplicate_vals_are_summed():
    scores = np.array([[0.0, 0.0, 0.0, 0.0]])
    vals = np.array([[7, 7, 7, 3]])
    got = knn_log_prob(scores, vals, np.array([7]), 1.0)
    assert got[0] == pytest.approx(math.log(0.75))


def test_large_scores_are_stable():
    scores = np.array([[-1e4, -1e4 - 1.0]])  # squared L2 distances of realistic magnitude
    got = knn_log_prob(scores, np.array([[1, 2]]), np.array([2]), 1.0)
    assert got[0] == pytest.approx(-1.0 - math.log1p(math.exp(-1.0)))


@pytest.mark.parametrize("lam", [0.0, 0.25, 0.5, 1.0])
def test_interpolate_matches_bruteforce(lam):
    rng = np.random.default_rng(1)
    p_lm = rng.uniform(1e-6, 1, size=40)
    p_knn = rng.uniform(0, 1, size=40)
    p_knn[:5] = 0.0  # target absent from the neighbours
    lp_knn = np.log(np.where(p_knn > 0, p_knn, 1)) + np.where(p_knn > 0, 0, -np.inf)
    got = interpolate(np.log(p_lm), lp_knn, lam)
    for i in range(40):
        want = brute_interp(p_lm[i], p_knn[i], lam)
        if want == 0:
            assert got[i] == -np.inf
        else:
            assert got[i] == pytest.approx(math.log(want), rel=1e-12, abs=1e-12)
    if lam == 0.0:
        np.testing.assert_array_equal(got, np.log(p_lm))


def test_perplexity_and_oracle():
    lp = np.log(np.array([0.5, 0.25]))
    assert perplexity(lp, 2) == pytest.approx(math.sqrt(8))
    assert perplexity(lp, 1) == pytest.approx(8.0)  # per word with one word
    assert perplexity(np.array([-1.0, -np.inf]), 2) == math.inf
    np.testing.assert_array_equal(oracle_log_prob(np.array([-1.0, -3.0]), np.array([-2.0, -np.inf])), [-1.0, -3.0])


def test_tune_lambda_picks_grid_minimum():
    rng = np.random.default_rng(2)
    lp_lm = np.log(rng.uniform(0.01, 1, 200))
    lp_knn = np.log(rng.uniform(0.01, 1, 200))
    grid = np.linspace(0, 1, 11)
    lam, nll = tune_lambda(lp_lm, lp_knn, grid)
    brute = [-sum(math.log(brute_interp(math.exp(a), math.exp(b), l)) for a, b in zip(lp_lm, lp_knn)) for l in grid]
    np.testing.assert_allclose(nll, brute, rtol=1e-10)
    assert lam == grid[int(np.argmin(brute))]


def test_lambda_one_with_absent_target_is_inf_not_nan():
    lam, nll = tune_lambda(np.array([-1.0, -1.0]), np.array([-0.5, -np.inf]), np.array([0.0, 0.5, 1.0]))
    assert nll[2] == np.inf and not np.isnan(nll).any()
    assert lam == 0.0  # λ=0.5 costs more than it gains on this input: nll [2.0, 2.41, inf]
    assert nll[0] == pytest.approx(2.0)


def test_from_cache_matches_direct_and_handles_missing_ids():
    rng = np.random.default_rng(3)
    N, T, k = 100, 30, 8
    vals = rng.integers(0, 5, N).astype(np.int32)
    ids = rng.integers(0, N, (T, k)).astype(np.int32)
    ids[0, 3:] = -1  # faiss found fewer than k
    dists = rng.uniform(0, 10, (T, k)).astype(np.float32)
    targets = rng.integers(0, 5, T)
    for metric in ("l2", "ip"):
        got = knn_log_prob_from_cache(ids, dists, vals, targets, metric, 2.0, chunk=7)
        for t in range(T):
            sc = scores_from_distances(dists[t].astype(np.float64), metric)
            p = brute_p_knn(sc, vals[np.maximum(ids[t], 0)], targets[t], 2.0, ids[t] >= 0)
            assert (got[t] == -np.inf) if p == 0 else got[t] == pytest.approx(math.log(p), rel=1e-6)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="metric"):
        scores_from_distances(np.zeros((1, 1)), "cos")
    with pytest.raises(ValueError, match="temperature"):
        knn_log_prob(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros(1), 0.0)
    with pytest.raises(ValueError, match="lambda"):
        interpolate(np.zeros(1), np.zeros(1), 1.5)


def test_temperature_sweep_equals_per_tau_scoring():
    from knnlm.scoring.interpolation import neighbour_hits, nll_grid, sweep_temperature

    rng = np.random.default_rng(4)
    N, T, k = 200, 40, 12
    vals = rng.integers(0, 6, N).astype(np.int32)
    ids = rng.integers(0, N, (T, k))
    ids[1, 5:] = -1
    scores = rng.normal(size=(T, k)) * 4
    targets = rng.integers(0, 8, T)
    hit, valid = neighbour_hits(ids, vals, targets)
    scores[2] *= 60  # far-apart scores: at τ = 0.05 the hits' mass underflows float32 (the float64 redo path)
    scores[3, :4] = scores[3].max() + 1  # a tie at the best score (the τ = 0 limit shares the mass)
    taus = [0.0, 0.05, 0.3, 1.0, 2.5]
    sweep = sweep_temperature(scores, hit, valid, taus)
    for i, tau in enumerate(taus[1:], 1):
        direct = knn_log_prob(scores, vals[np.maximum(ids, 0)], targets, tau, ids >= 0)
        assert np.array_equal(np.isneginf(sweep[i]), np.isneginf(direct))
        fin = np.isfinite(direct)
        np.testing.assert_allclose(sweep[i][fin], direct[fin], rtol=1e-5, atol=1e-5)
    best = np.where(valid, scores, -np.inf) == np.where(valid, scores, -np.inf).max(1, keepdims=True)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(sweep[0], np.log((best & hit).sum(1) / best.sum(1)))
    lp_lm = np.log(rng.uniform(0.01, 1, T))
    lams = np.array([0.0, 0.3, 1.0])
    grid = nll_grid(lp_lm, sweep[1:], lams, chunk=7)
    assert grid.shape == (4, 3)
    for i in range(4):
        for j, lam in enumerate(lams):
            want = -np.sum(interpolate(lp_lm, sweep[1 + i], lam))
            assert grid[i, j] == pytest.approx(want, rel=1e-5) or (np.isinf(want) and np.isinf(grid[i, j]))


def test_sweep_from_cache_in_chunks_equals_per_tau_scoring():
    """The chunked τ sweep over a whole cache (Table 1's tuned τ) equals knn_log_prob_from_cache at each τ > 0."""
    from knnlm.scoring.interpolation import knn_log_prob_from_cache, sweep_temperature_from_cache, tune_temperature

    rng = np.random.default_rng(0)
    t, k, n = 300, 16, 500
    ids = rng.integers(-1, n, size=(t, k)).astype(np.int32)
    dists = rng.gamma(2.0, 20.0, size=(t, k)).astype(np.float32)
    vals = rng.integers(0, 30, size=n).astype(np.int32)
    targets = rng.integers(0, 30, size=t)
    taus = [0.5, 1.0, 7.0, 30.0]
    sw = sweep_temperature_from_cache(ids, dists, vals, targets, "l2", taus, chunk=64)
    for i, tau in enumerate(taus):
        np.testing.assert_allclose(sw[i], knn_log_prob_from_cache(ids, dists, vals, targets, "l2", tau), rtol=1e-5,
                                   atol=1e-5)
    from knnlm.scoring.interpolation import interpolated_nll

    lp_lm = np.log(rng.uniform(0.001, 0.05, size=t))  # a weak LM: the kNN term helps, differently per τ
    best = tune_temperature(lp_lm, sw, taus, 51)
    nll = [interpolated_nll(lp_lm, sw[i], np.linspace(0, 1, 51)).min() for i in range(len(taus))]
    assert best == int(np.argmin(nll)) and nll[best] < min(nll[:2]) - 1  # a τ that helps, found


def test_temperature_sweep_with_l2_scale_scores_and_unsorted_columns():
    """Squared-L2 scores in the hundreds (wikitext2 keys), columns in no particular order (the real score of FAISS
    neighbours): the sweep's truncated denominators (terms below e^−30 left out) match direct scoring."""
    from knnlm.scoring.interpolation import neighbour_hits, sweep_temperature

    rng = np.random.default_rng(7)
    N, T, k = 500, 64, 256
    vals = rng.integers(0, 20, N).astype(np.int32)
    ids = rng.integers(0, N, (T, k))
    ids[5, 100:] = -1
    scores = -rng.uniform(150, 900, (T, k)).astype(np.float32)  # −squared distances, unsorted
    targets = rng.integers(0, 20, T)
    hit, valid = neighbour_hits(ids, vals, targets)
    taus = [0.1, 0.5, 1.0, 3.0, 10.0, 30.0]
    sweep = sweep_temperature(scores, hit, valid, taus)
    for i, tau in enumerate(taus):
        direct = knn_log_prob(scores.astype(np.float64), vals[np.maximum(ids, 0)], targets, tau, ids >= 0)
        assert np.array_equal(np.isneginf(sweep[i]), np.isneginf(direct))
        fin = np.isfinite(direct)
        np.testing.assert_allclose(sweep[i][fin], direct[fin], rtol=1e-5, atol=1e-5)


def test_temperature_sweep_sorted_rows_hits_near_and_far_from_the_best():
    """Rows sorted best first (neighbour caches): the hits' mass comes from the denominator's pass while the best
    hit's term is within e^−HIT_SHIFT of the best neighbour's, else from its own pass, and the prefix covers the hits
    above e^−cut of the best hit. Both branches, at every τ, match direct float64 scoring."""
    from knnlm.scoring._sweep import HIT_SHIFT
    from knnlm.scoring.interpolation import neighbour_hits, sweep_temperature

    rng = np.random.default_rng(11)
    N, T, k = 400, 96, 128
    vals = rng.integers(0, 10, N).astype(np.int32)
    ids = rng.integers(0, N, (T, k))
    targets = rng.integers(0, 10, T)
    scores = -np.sort(rng.uniform(0, 400, (T, k)), 1).astype(np.float32)  # sorted best first
    hit, valid = neighbour_hits(ids, vals, targets)
    for t in range(T):  # the best hit at least 40 ranks down: its shift ranges over both sides of HIT_SHIFT
        ids[t, :40] = np.flatnonzero(vals != targets[t])[0]
    hit, valid = neighbour_hits(ids, vals, targets)
    taus = [0.5, 1.0, 2.0, 5.0, 20.0]
    sweep = sweep_temperature(scores, hit, valid, taus)
    shift = np.array([(np.where(hit[t], scores[t], -np.inf).max() - scores[t].max()) for t in range(T)])
    sides = {bool(shift[t] / tau >= -HIT_SHIFT) for t in range(T) if np.isfinite(shift[t]) for tau in taus}
    assert sides == {True, False}
    for i, tau in enumerate(taus):
        direct = knn_log_prob(scores.astype(np.float64), vals[np.maximum(ids, 0)], targets, tau, ids >= 0)
        assert np.array_equal(np.isneginf(sweep[i]), np.isneginf(direct))
        fin = np.isfinite(direct)
        np.testing.assert_allclose(sweep[i][fin], direct[fin], rtol=1e-5, atol=1e-5)


_SWEEP_IN_A_PROCESS = """
import sys
import numpy as np
from knnlm.scoring.interpolation import sweep_temperature
rng = np.random.default_rng(5)
scores = -np.sort(rng.gamma(2.0, 30.0, size=(2000, 200)).astype(np.float32), axis=1)
hit = rng.random(scores.shape) < 0.1
np.save(sys.argv[1], sweep_temperature(scores, hit, np.ones(scores.shape, bool), [0.5, 1.0, 4.0, 16.0]))
"""


def test_temperature_sweep_same_bits_compiled_or_loaded_from_numba_cache(tmp_path):
    """The τ sweep's kernel gives the same bits in a process that compiles it and in one that loads it from numba's
    cache: its sums run in a fixed order (knnlm.scoring._sweep.FAST has no 'reassoc'), so a job and its recomputation in
    another process agree exactly, whichever compiled the kernel first."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = [tmp_path / "compiled.npy", tmp_path / "cached.npy"]
    for f in out:  # the first run compiles and writes the cache, the second loads it
        subprocess.run([sys.executable, "-c", _SWEEP_IN_A_PROCESS, str(f)], env=env, check=True)
    assert any((tmp_path / "numba").rglob("*sweep_kernel*.nbc"))
    a, b = np.load(out[0]), np.load(out[1])
    assert np.isfinite(a).mean() > 0.5 and np.array_equal(a, b, equal_nan=True)


def test_best_lambda_per_tau_is_the_grid_argmin():
    """The binary search over λ (the NLL is convex in λ) finds nll_grid's first minimum for every τ, including
    τ rows where p_kNN = 0 for some tokens (λ = 1 costs inf) and flat rows (p_kNN = p_LM: every λ ties)."""
    from knnlm.scoring.interpolation import best_lambda_per_tau, lambda_grid, nll_grid

    rng = np.random.default_rng(11)
    T, n_tau = 3000, 12
    lp_lm = np.log(rng.uniform(1e-4, 1, T))
    lp_knn = np.log(rng.uniform(1e-6, 1, (n_tau, T))) * rng.uniform(0.1, 4, (n_tau, 1))
    lp_knn[2, :50] = -np.inf
    lp_knn[5] = lp_lm
    lp_knn[7] = lp_lm + 0.5 * rng.normal(size=T)  # sometimes better, sometimes worse
    for steps in (2, 21, 200):
        grid = nll_grid(lp_lm, lp_knn, lambda_grid(steps))
        idx, nll = best_lambda_per_tau(lp_lm, lp_knn, lambda_grid(steps))
        np.testing.assert_array_equal(idx, grid.argmin(1))
        np.testing.assert_array_equal(nll, grid.min(1))


def test_neighbour_hits_matches_numpy_and_refuses_ids_past_the_datastore():
    """The numba pass equals numpy's gather (−1 = no neighbour), and an id ≥ len(vals) is an IndexError, not a read
    past the array."""
    from knnlm.scoring.interpolation import neighbour_hits

    rng = np.random.default_rng(3)
    vals = rng.integers(0, 7, 500).astype(np.int32)
    ids = rng.integers(-1, 500, (40, 32))
    targets = rng.integers(0, 7, 40)
    hit, valid = neighbour_hits(ids, vals, targets)
    np.testing.assert_array_equal(valid, ids >= 0)
    np.testing.assert_array_equal(hit, (vals[np.where(ids >= 0, ids, 0)] == targets[:, None]) & (ids >= 0))
    ids[3, 5] = 500
    with pytest.raises(IndexError, match="out of range"):
        neighbour_hits(ids, vals, targets)


def test_tied_temperatures_give_the_smallest_tau():
    """τ* is the first value within rounding (TIE_RTOL) of the minimum: a flat valid curve (p_kNN one-hot for every
    τ past some point) gives the same τ* on every run, whatever order the parallel sums rounded in."""
    from knnlm.scoring.interpolation import first_minimum

    assert first_minimum([5.0, 4.0, 3.0, 3.0 * (1 + 1e-12), 3.0 * (1 - 1e-12)]) == 2
    assert first_minimum([5.0, 3.0 * (1 + 1e-6), 3.0]) == 2  # a real difference still counts
    assert first_minimum([float("nan"), 2.0, 1.0]) == 2


def test_a_tie_over_every_tau_never_picks_tau_zero():
    """When every τ ties (k = 1, or λ* = 0), τ* is the grid's τ closest to 1, never the limit τ = 0 (which no
    generation could use); a flat run of tied τ from 0 (one-hot p_kNN) gives its first τ > 0, whatever the rounding
    at the run's far end; τ = 0 is chosen only when it alone is best, and then p_kNN over the vocabulary is its limit
    (the mass shared by the neighbours tied at the best score), as the sweep's τ = 0 is; a tie at equal distance
    from 1 goes to the smaller τ. A k = 1 sweep through tune_temperature gives τ = 1."""
    from knnlm.scoring.interpolation import (first_minimum, knn_distribution, knn_log_prob_from_cache,
                                             sweep_temperature_from_cache, tune_temperature)

    taus = [round(0.1 * i, 9) for i in range(31)]  # the config's default grid, 0 … 3
    assert first_minimum([2.0] * len(taus), taus=taus) == taus.index(1.0)
    assert first_minimum([1.0] + [2.0] * 30, taus=taus) == 0
    flat = [2.0] * 5 + [2.0 * (1 + 5e-10), 2.0 * (1 - 5e-10)] + [3.0] * 24  # the run's end within rounding
    assert first_minimum(flat, taus=taus) == 1 and first_minimum(flat) == 0
    assert first_minimum([2.0, 2.0, 2.0, 2.0], taus=[0.25, 0.5, 2.0, 4.0]) == 1
    rng = np.random.default_rng(0)
    ids, dists = rng.integers(0, 50, (40, 1)), rng.random((40, 1)).astype(np.float32)
    vals, targets = rng.integers(0, 9, 50), rng.integers(0, 9, 40)
    sweep = sweep_temperature_from_cache(ids, dists, vals, targets, "l2", taus)
    lp_lm = np.log(np.full(40, 1 / 9))
    assert taus[tune_temperature(lp_lm, sweep, taus, 11)] == 1.0
    ids3 = np.array([[3, 4, 5]])
    d = np.array([[0.5, 0.5, 2.0]], dtype=np.float32)
    p0 = knn_distribution(ids3, d, np.array([0, 0, 0, 1, 2, 3]), "l2", 0.0, 4)
    np.testing.assert_allclose(p0[0], [0.0, 0.5, 0.5, 0.0])
    lp0 = knn_log_prob_from_cache(ids3, d, np.array([0, 0, 0, 1, 2, 3]), np.array([1]), "l2", 1e-6)
    assert np.exp(lp0[0]) == pytest.approx(0.5, rel=1e-6)


def test_soft_label_loss_matches_a_dense_computation():
    """App. E.6.2's objective (knnlm.lm.soft_labels.soft_label_loss) equals the cross-entropy of the student against the
    label (1 − w)·one-hot + w·teacher, computed token by token in float64 numpy, with padding skipped; w = 0 is the
    plain NLL, and torch's gradient of the objective is softmax(student) − label per kept token."""
    import torch

    from knnlm.lm.soft_labels import soft_label_loss

    rng = np.random.default_rng(0)
    T, V, pad = 13, 7, 1
    logits = torch.tensor(rng.normal(size=(T, V)) * 2, requires_grad=True)
    teacher = torch.softmax(torch.tensor(rng.normal(size=(T, V))), -1)
    target = torch.tensor(rng.integers(0, V, size=T))
    target[[2, 9]] = pad
    for w in (0.0, 0.3, 1.0):
        lp = torch.log_softmax(logits, -1)
        obj, nll = soft_label_loss(lp, teacher, target, w, pad)
        lpn, q, y = lp.detach().numpy(), teacher.numpy(), target.numpy()
        want_obj = want_nll = 0.0
        grad = np.zeros((T, V))
        for t in range(T):
            if y[t] == pad:
                continue
            label = w * q[t] + (1 - w) * np.eye(V)[y[t]]
            want_obj -= float(label @ lpn[t])
            want_nll -= float(lpn[t, y[t]])
            grad[t] = np.exp(lpn[t]) - label
        assert obj.item() == pytest.approx(want_obj, rel=1e-12) and nll.item() == pytest.approx(want_nll, rel=1e-12)
        if w == 0.0:
            assert obj.item() == pytest.approx(nll.item(), rel=1e-12)
        (g,) = torch.autograd.grad(obj, logits)
        np.testing.assert_allclose(g.numpy(), grad, atol=1e-12)
