"""The analyses of App. D and App. E (knnlm.scoring.analysis) against brute-force references and hand-computed cases."""
import numpy as np
import pytest

from knnlm.scoring import analysis as an
from knnlm.statistics import regression as rg
from knnlm.statistics.intervals import jackknife_sums

pytestmark = pytest.mark.unit


def test_bigram_entropy_matches_a_hand_computed_example():
    # stream a b a c a b: after a: b, c, b -> p = 2/3, 1/3; after b: a (once); after c: a. before a: b, c -> 1/2 each
    a, b, c = 0, 1, 2
    fwd, bwd, count = an.bigram_entropy(np.array([a, b, a, c, a, b]), vocab=4)
    h = -(2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3))
    assert fwd[a] == pytest.approx(h) and fwd[b] == pytest.approx(0) and fwd[c] == pytest.approx(0)
    assert bwd[a] == pytest.approx(np.log(2)) and bwd[b] == pytest.approx(0) and bwd[c] == pytest.approx(0)
    assert np.isnan(fwd[3]) and np.isnan(bwd[3])
    assert count.tolist() == [3, 1, 1, 0]


def test_bigram_counts_are_the_same_in_chunks():
    s = np.random.default_rng(0).integers(0, 7, 1000)
    whole = an.bigram_counts(s, 7)
    parts = an.bigram_counts(s, 7, chunk=33)
    for x, y in zip(whole, parts):
        np.testing.assert_array_equal(x, y)
    assert whole[2].sum() == 999
    np.testing.assert_array_equal(an.token_counts(s, 9, chunk=77), np.bincount(s, minlength=9))
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        an.bigram_counts(np.array([0, 9]), 7)


def test_slope_and_correlation_from_sums_match_numpy():
    rng = np.random.default_rng(1)
    x, y, doc = rng.normal(size=200), rng.normal(size=200), rng.integers(0, 5, 200)
    y = y + 0.3 * x
    s = rg.regression_sums(x, y, doc, 5).sum(0)
    assert rg.slope_of(s)[0] == pytest.approx(np.polyfit(x, y, 1)[0])
    assert rg.correlation_of(s)[0] == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_type_slope_matches_a_direct_regression_and_its_jackknife():
    rng = np.random.default_rng(2)
    t, n_docs, types = 3000, 12, np.array([1, 3, 4, 7])
    target, doc = rng.choice([1, 3, 4, 7, 9], t), np.sort(rng.integers(0, n_docs, t))
    f_real, f_faiss = rng.random(t) < 0.4, rng.random(t) < 0.5
    x = np.array([2.0, 5.0, 3.0, 9.0])
    counts = rg.type_counts(target, doc, n_docs, [f_real, f_faiss], types)
    assert counts.shape == (n_docs, 4, 3) and counts[..., 0].sum() == np.isin(target, types).sum()

    def direct(mask):
        y = [f_real[mask & (target == v)].mean() - f_faiss[mask & (target == v)].mean() for v in types]
        return np.polyfit(x, y, 1)[0]

    stat = rg.type_slope(x)
    assert stat(counts.reshape(n_docs, -1).sum(0))[0] == pytest.approx(direct(np.ones(t, bool)))
    left_out = counts.reshape(n_docs, -1).sum(0) - counts[3].reshape(-1)
    assert stat(left_out)[0] == pytest.approx(direct(doc != 3))
    v, lo, hi = jackknife_sums(stat, counts.reshape(n_docs, -1), np.bincount(doc, minlength=n_docs))
    assert lo[0] < v[0] < hi[0]


def test_window_positions_follow_the_sliding_windows_of_the_dump():
    from knnlm.lm.windows import windows

    n, L, C = 50, 12, 4
    ref = np.empty(n, dtype=np.int64)
    for a, s, e in windows(n, L, C):
        ref[s:e] = np.arange(s, e) - a  # tokens of context before each target in its window
    np.testing.assert_array_equal(an.window_positions(n, L, C), ref)
    with pytest.raises(ValueError):
        an.window_positions(n, 4, 4)


def test_document_positions():
    np.testing.assert_array_equal(an.document_positions(np.array([0, 0, 0, 1, 1, 2, 3, 3])), [0, 1, 2, 0, 1, 0, 0, 1])


def test_argmaxable_finds_the_point_inside_the_hull_of_a_hand_enumerated_case():
    # the 4 corners of a square and its centre (0, 0): the centre can never win (w·h = 0 < the best corner's for
    # any h ≠ 0); a point inside the triangle of three others, too; every corner can
    w = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1], [0, 0], [0.5, 0.5 - 0.1]], dtype=float)
    out = an.argmaxable(w)
    assert sorted(out["unargmaxable"]) == [4, 5] and out["unresolved"] == []
    assert [an.lp_argmaxable(w, i)[0] for i in range(6)] == [True, True, True, True, False, False]


def test_argmaxable_against_sampled_directions():
    # points on a circle are all argmaxable; shrink some inside: brute force over many directions h agrees
    rng = np.random.default_rng(3)
    ang = np.sort(rng.uniform(0, 2 * np.pi, 12))
    w = np.stack([np.cos(ang), np.sin(ang)], 1)
    w[[2, 7]] *= 0.5
    h = np.stack([np.cos(np.linspace(0, 2 * np.pi, 20000)), np.sin(np.linspace(0, 2 * np.pi, 20000))], 1)
    winners = set(np.argmax(h @ w.T, 1).tolist())
    out = an.argmaxable(w)
    assert set(range(12)) - set(out["unargmaxable"]) == winners


def test_topk_log_prob_against_a_dense_computation():
    rng = np.random.default_rng(4)
    logits, targets, k, temp = rng.normal(size=(30, 50)), rng.integers(0, 50, 30), 8, 1.7
    got = an.topk_log_prob(logits, targets, k, temp)
    for i in range(30):
        keep = np.argsort(-logits[i])[:k]
        p = np.zeros(50)
        p[keep] = np.exp(logits[i, keep] / temp) / np.exp(logits[i, keep] / temp).sum()
        assert got[i] == (pytest.approx(np.log(p[targets[i]])) if p[targets[i]] > 0 else -np.inf)


@pytest.mark.parametrize("dedup", [False, True])
def test_subset_log_prob_against_a_dense_computation(dedup):
    rng = np.random.default_rng(5)
    logits, targets = rng.normal(size=(40, 20)), rng.integers(0, 20, 40)
    ids = rng.integers(0, 20, (40, 6))
    ids[0] = -1  # no neighbours at all
    ids[1, 3:] = -1
    temp = 0.8
    got = an.subset_log_prob(logits, targets, ids, temp, dedup)
    for i in range(40):
        c = np.zeros(20)
        for v in ids[i][ids[i] >= 0]:
            c[v] = 1 if dedup else c[v] + 1
        p = c * np.exp(logits[i] / temp)
        ref = np.log(p[targets[i]] / p.sum()) if p[targets[i]] > 0 else -np.inf
        assert got[i] == (pytest.approx(ref) if np.isfinite(ref) else -np.inf)


@pytest.mark.parametrize("dedup", [False, True])
def test_subset_grid_equals_one_temperature_at_a_time(dedup):
    rng = np.random.default_rng(8)
    logits, targets = rng.normal(size=(40, 20)) * 5, rng.integers(0, 20, 40)
    ids = rng.integers(0, 20, (40, 6))
    ids[0] = -1
    ids[1, 3:] = -1
    temps = [0.5, 1.0, 3.0]
    tokens = an.unique_tokens(ids) if dedup else ids
    for lg in (logits, logits.astype(np.float32)):  # the float32 logits of the job, the float64 reference
        grid = an.subset_log_prob_grid(lg, targets, tokens, temps)
        for j, temp in enumerate(temps):
            ref = an.subset_log_prob(lg, targets, ids, temp, dedup)
            assert np.array_equal(np.isneginf(grid[j]), np.isneginf(ref))
            # float32 denominators (the τ sweep's kernel) against the float64 reference
            np.testing.assert_allclose(grid[j], ref, rtol=2e-6, atol=2e-6)


def test_topk_grid_equals_one_topk_at_a_time():
    rng = np.random.default_rng(6)
    logits, targets = rng.normal(size=(25, 40)), rng.integers(0, 40, 25)
    ks, temps = [1, 4, 16, 40], [0.5, 1.0, 2.5]
    grid = an.topk_log_prob_grid(logits, targets, ks, temps)
    for i, k in enumerate(ks):
        for j, temp in enumerate(temps):
            np.testing.assert_allclose(grid[i, j], an.topk_log_prob(logits, targets, k, temp), rtol=1e-10)
    # float32 logits: selected in float32, the same as the float64 path on the same (float32-exact) values
    l32 = logits.astype(np.float32)
    np.testing.assert_array_equal(an.topk_log_prob_grid(l32, targets, ks, temps),
                                  an.topk_log_prob_grid(l32.astype(np.float64), targets, ks, temps))
    # k = V keeps every token: the LM's own distribution at temperature 1
    full = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(grid[3, 1], full[np.arange(25), targets], rtol=1e-10)


def test_output_embedding_scores_against_brute_force():
    rng = np.random.default_rng(7)
    q, w = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(9, 4)).astype(np.float32)
    ids = rng.integers(0, 9, (6, 5))
    ids[2, 3] = -1
    got = an.output_embedding_scores(q, w, ids)
    for i in range(6):
        for j in range(5):
            ref = -np.inf if ids[i, j] < 0 else -((w[ids[i, j]].astype(float) - q[i]) ** 2).sum()
            assert got[i, j] == (pytest.approx(ref, rel=1e-5) if np.isfinite(ref) else -np.inf)


def test_mixture_weights_maximise_the_likelihood():
    """EM's weights reach the likelihood's maximum over the simplex (scipy's optimiser on a softmax
    parametrisation as the reference); a useless component gets ~0 weight; two components give the λ of a grid."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(8)
    p = rng.dirichlet(np.ones(3), 500)  # three 'models' probabilities of the target, per token
    lps = [np.log(p[:, 0]), np.log(0.5 * p[:, 0] + 0.5 * p[:, 1]), np.log(np.full(500, 1e-6))]
    w = an.mixture_weights(lps)
    assert w.sum() == pytest.approx(1) and w[2] < 1e-3
    nll = lambda z: -an.mixture_log_prob(lps, np.exp(z) / np.exp(z).sum()).mean()  # noqa: E731
    ref = minimize(nll, np.zeros(3), method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-12, "maxiter": 5000})
    assert nll(np.log(np.maximum(w, 1e-300))) <= ref.fun + 1e-7
    grid = np.linspace(0, 1, 10001)
    two = [lps[0], lps[1]]
    best = grid[np.argmin([-an.mixture_log_prob(two, [1 - g, g]).mean() for g in grid])]
    assert an.mixture_weights(two)[1] == pytest.approx(best, abs=2e-4)


def test_quarter_difference_against_a_loop_and_its_jackknife():
    """E.3's effect: mean y over the last quarter of positions minus the first, per document or over the window."""
    rng = np.random.default_rng(3)
    doc = np.repeat(np.arange(6), [7, 12, 4, 30, 9, 16])
    pos = an.document_positions(doc)
    frac = an.position_fraction(pos, doc)
    y = rng.normal(size=len(doc)) + 0.1 * frac
    first, last = [], []
    for d in range(6):  # brute force: each document's own quarters
        idx = np.flatnonzero(doc == d)
        n = len(idx)
        first += [y[i] for j, i in enumerate(idx) if j / n < 0.25]
        last += [y[i] for j, i in enumerate(idx) if j / n >= 0.75]
    qs = an.quarter_sums(frac, y, doc, 6)
    want = np.mean(last) - np.mean(first)
    assert an.quarter_difference(qs.sum(0))[0] == pytest.approx(want)
    v, lo, hi = jackknife_sums(an.quarter_difference, qs, qs[:, 1] + qs[:, 3])
    loo = [np.mean([y[i] for i in np.flatnonzero((doc != d) & (frac >= 0.75))])
           - np.mean([y[i] for i in np.flatnonzero((doc != d) & (frac < 0.25))]) for d in range(6)]
    se = np.sqrt(5 / 6 * ((np.array(loo) - np.mean(loo)) ** 2).sum())
    assert v[0] == pytest.approx(want) and lo[0] < want < hi[0] and hi[0] - want == pytest.approx(want - lo[0])
    assert (hi[0] - lo[0]) / 2 / se > 2  # a t quantile on few effective documents times the jackknife SE
    # window positions: quarters of the range of positions over all tokens, or of a given range [lo, hi]
    w = np.array([0, 1, 2, 3, 4, 5, 6, 7])
    f = an.position_fraction(w)
    assert np.array_equal(f < 0.25, w < 2) and np.array_equal(f >= 0.75, w >= 6)
    # the sliding windows (L = 8, C = 4): only the first block has fewer than C tokens of context; the quarters are
    # those of positions 4..7, and the first block's tokens fall in none
    w = an.window_positions(20, 8, 4)
    f = an.position_fraction(w, lo=4, hi=7)
    assert np.isnan(f[w < 4]).all() and np.array_equal(f < 0.25, w == 4) and np.array_equal(f >= 0.75, w == 7)
    qs = an.quarter_sums(f, np.ones(20), np.zeros(20, dtype=int), 1)
    assert qs[0, 1] == (w == 4).sum() and qs[0, 3] == (w == 7).sum()


def test_memorisation_check_of_an_overfitted_lm():
    from knnlm.experiments.hypotheses import memorisation

    tr = {"train_loss_last": np.log2(5.0), "valid": [(100, 80.0), (200, 60.0)], "updates": 200}
    row = memorisation("overfit", tr)
    assert row["verdict"] == "memorised" and row["relative difference"] == pytest.approx(5 / 60)
    assert "train PPL 5.00, valid PPL 60.00" in row["on"]
    row = memorisation("overfit", {**tr, "train_loss_last": np.log2(40.0)})
    assert row["verdict"] == "not memorised"
    assert memorisation("overfit", None)["verdict"] == "unknown"


def test_hypotheses_per_token_chunks_on_threads_equal_one_pass(monkeypatch):
    """App. E.1-E.2's per-token pass (experiments.hypotheses._per_token) in small chunks on two threads gives the same
    numbers, bit for bit, as one chunk on one thread: every quantity is per token, so neither the chunking nor the
    order the threads finish in may change a value. Also its LM drift check: exactly 0 when the dumped log p_LM is
    the recomputed one."""
    from types import SimpleNamespace

    from knnlm.experiments import hypotheses as hy
    from knnlm.scoring.analysis import GEMM_ROWS

    rng = np.random.default_rng(4)
    t, d, v, k, n = 300, 8, 40, 16, 500
    w_sm = rng.standard_normal((v, d)).astype(np.float32)
    vals = rng.integers(0, v, n)
    ffn = rng.standard_normal((t, d)).astype(np.float32)
    lg = (ffn @ w_sm.T).astype(np.float64)
    targets = rng.integers(0, v, t)
    lm = lg[np.arange(t), targets] - np.log(np.exp(lg).sum(1))
    ids = rng.integers(0, n, (t, k)).astype(np.int32)
    ids[5, 3:] = -1  # a token with few neighbours
    inputs = {split: {"targets": targets, "lm": lm, "ffn": ffn, "queries": {"att": rng.standard_normal((t, d)).astype(
        np.float32)}, "ids": {"att": (ids, np.arange(t))}} for split in ("valid", "test")}
    monkeypatch.setattr(hy, "_split_inputs", lambda job, split, keys: inputs[split])
    cfg = {"hypotheses": {"topk": [4, 16, 64], "sparsify_temperatures": [0.5, 1.0, 2.0]}}
    for split in ("valid", "test"):
        runs = []
        for chunk, threads in ((t // GEMM_ROWS * GEMM_ROWS + GEMM_ROWS, 1), (GEMM_ROWS, 2)):
            monkeypatch.setattr(hy, "CHUNK", chunk)
            runs.append(hy._per_token(SimpleNamespace(cfg=cfg, threads=threads), w_sm, vals, ["att"], [0.5, 1.0, 3.0],
                                      cfg["hypotheses"]["sparsify_temperatures"], split))
        (one, drift1), (many, drift2) = runs
        assert drift1 == drift2 and drift1 < 1e-5  # a float32 log-softmax against the float64 one
        assert one["topk"].shape[0] == 2  # k = 64 is above V
        np.testing.assert_array_equal(one["e1"]["att"], many["e1"]["att"])
        np.testing.assert_array_equal(one["topk"], many["topk"])
        for dd in (False, True):
            np.testing.assert_array_equal(one["subset"][("att", dd)], many["subset"][("att", dd)])
        assert np.isfinite(one["topk"]).any() and np.isfinite(one["e1"]["att"]).any()  # not all −inf
    # the drift check sees a log p_LM that is not the LM's
    inputs["valid"] = dict(inputs["valid"], lm=lm - 0.1)
    assert hy._per_token(SimpleNamespace(cfg=cfg, threads=1), w_sm, vals, ["att"], [1.0], [1.0], "valid")[1] > 0.09


def test_soft_label_lm_is_compared_with_its_one_hot_twin_only():
    """App. E.6.2: the one-hot twin of a soft-label LM is the LM of the same architecture, seed, budget and start
    without a teacher; a smaller LM or another seed is not."""
    from knnlm.experiments.hypotheses import one_hot_twin

    soft = {"source": "train", "teacher": "base", "lm": {"seed": 2}, "init_from": None, "checkpoint": "best"}
    assert one_hot_twin(soft, {"source": "train", "lm": {"seed": 2}, "init_from": None, "checkpoint": "best"})
    assert not one_hot_twin(soft, {"source": "train", "lm": {"seed": 2, "decoder_layers": 2}, "checkpoint": "best"})
    assert not one_hot_twin(soft, {"source": "train", "lm": {"seed": 3}, "checkpoint": "best"})
    assert not one_hot_twin(soft, {**soft, "teacher": "base"})


def test_e5_tests_its_identical_lm_claims_on_a_seed_twin_only():
    """App. E.5's "another identical LM, trained with another random seed": a seed twin is the base LM's entry with
    another seed and nothing else changed; a smaller LM, a soft-label LM, an LM trained further or the same seed is
    not. Table 8's comparisons say which, and Figure 8's K-LM rows say when another LM is among the K."""
    from knnlm.experiments.hypotheses import ensemble_reference, seed_twin

    base = {"source": "train", "lm": {}, "init_from": None, "checkpoint": "best", "teacher": None}
    s2 = {**base, "lm": {"seed": 2}}
    small = {**base, "lm": {"decoder_layers": 2, "max_update": 4000}}
    assert seed_twin(base, s2) and seed_twin(s2, {**base, "lm": {"seed": 3}})
    assert not seed_twin(base, small) and not seed_twin(base, {**s2, "teacher": "base"})
    assert not seed_twin(base, {**s2, "init_from": "base"}) and not seed_twin(base, base)
    assert not seed_twin({"source": "hf", "path": "gpt2"}, {"source": "hf", "path": "gpt2", "lm": {"seed": 2}})
    cfg = {"lms": {"base": base, "base-s2": s2, "small": small}}
    others = ["base-s2", "small"]
    assert ensemble_reference(cfg, "base", others, "base + base-s2 vs base alone") == "identical LM (another seed: 2)"
    assert ensemble_reference(cfg, "base", others, "base + small vs kNN-LM").startswith("another LM (decoder_layers")
    assert ensemble_reference(cfg, "base", others, "small alone vs base alone").startswith("another LM")
    assert ensemble_reference(cfg, "base", others, "1 LM + kNN vs 2 LMs") == "identical LMs (another seed each)"
    assert ensemble_reference(cfg, "base", others, "2 LMs + kNN vs 3 LMs") == "with another LM (small)"
    assert ensemble_reference(cfg, "base", others, "kNN-LM vs base alone") == "-"


def test_e2_temperature_grid_is_extended_at_its_edges(monkeypatch):
    """E.1's τ and E.2's T grids grow where a twin's tuned value sits on an edge of valid's (as the kNN-LM's τ grid
    does): the extra passes over valid compute only the new values, which land in the grid's order and equal one pass
    over the whole grid; test is computed at the values tuned on valid only, equal there to a pass over the whole
    final grids (nan at every other value)."""
    from types import SimpleNamespace

    from knnlm.experiments import hypotheses as hy
    from knnlm.scoring.interpolation import tune_temperature

    rng = np.random.default_rng(5)
    t, d, v, k, n = 200, 8, 30, 8, 300
    w_sm = (3 * rng.standard_normal((v, d))).astype(np.float32)  # peaked logits: the best T is below the grid
    vals = rng.integers(0, v, n)
    inputs = {}
    for split in ("valid", "test"):
        ffn = rng.standard_normal((t, d)).astype(np.float32)
        lg = (ffn @ w_sm.T).astype(np.float64)
        targets = lg.argmax(1)  # the LM's own argmax: a sharper distribution (lower T) always fits better
        lm = lg[np.arange(t), targets] - np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) - lg.max(1)
        inputs[split] = {"targets": targets, "lm": lm, "ffn": ffn, "queries": {"att": rng.standard_normal(
            (t, d)).astype(np.float32)}, "ids": {"att": (rng.integers(0, n, (t, k)).astype(np.int32), np.arange(t))}}
    monkeypatch.setattr(hy, "_split_inputs", lambda job, split, keys: inputs[split])
    cfg = {"hypotheses": {"topk": [4]}, "temperature": {"max_extensions": 2, "start": 0.0, "step": 0.5, "stop": 1.0}}
    job = SimpleNamespace(cfg=cfg, threads=1)
    lp_lm = {s: inputs[s]["lm"] for s in ("valid", "test")}
    passes, one_pass = [], hy._per_token
    monkeypatch.setattr(hy, "_per_token", lambda *a, **kw: passes.append((a[4], a[5], a[6])) or one_pass(*a, **kw))
    per, drift, taus, temps, ks = hy._grids(job, w_sm, vals, ["att"], lp_lm, 11, [0.5, 1.0], [1.0, 2.0])
    assert temps[:2] == [0.25, 0.5] and temps == sorted(temps) and ks == [4] and max(drift.values()) < 1e-5
    # the T grid's extensions were computed ahead in valid's one pass (every value two extensions can add); the
    # τ grid's, when there is one, gets a pass of its own new values
    assert passes[0] == ([0.5, 1.0], [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0], "valid")
    assert hy.speculative_temperatures([1.0, 2.0], 2) == [0.25, 0.5, 3.0, 4.0, 6.0, 8.0]
    assert [p[2] for p in passes] == ["valid"] * (len(passes) - 1) + ["test"]
    assert all(p[1] == [] for p in passes[1:-1]) and taus[:2] == [0.5, 1.0]
    monkeypatch.setattr(hy, "_per_token", one_pass)
    best = lambda a: tune_temperature(lp_lm["valid"], a, None, 11)  # noqa: E731
    for s in ("valid", "test"):
        whole, _ = hy._per_token(job, w_sm, vals, ["att"], taus, temps, s)
        pairs = [(per[s]["topk"][0], whole["topk"][0], best(per["valid"]["topk"][0])),
                 (per[s]["e1"]["att"], whole["e1"]["att"], best(per["valid"]["e1"]["att"]))]
        pairs += [(per[s]["subset"][c], whole["subset"][c], best(per["valid"]["subset"][c])) for c in whole["subset"]]
        chosen_t = {j for _, _, j in pairs[:1] + pairs[2:]}  # the T values some E.2 twin chose on valid
        for n, (got, ref, j) in enumerate(pairs):
            if s == "valid":
                np.testing.assert_array_equal(got, ref)
                continue
            np.testing.assert_array_equal(got[j], ref[j])
            others = [i for i in range(len(got)) if i not in (chosen_t if n != 1 else {j})]
            assert np.isnan(got[others]).all()  # no grid value that no twin chose was computed on test


def test_mixture_weights_equal_em_in_log_space():
    """The scaled-probability EM step equals the log-space one (a loop written here) step for step, on log-probs far
    below float64's smallest exponent where the scaling is what keeps them finite; an all −inf token is left out."""
    rng = np.random.default_rng(11)
    lps = np.stack([rng.normal(-900, 30, 400), rng.normal(-905, 30, 400), rng.normal(-3, 1, 400)])
    lps[:, 7] = -np.inf
    w = np.full(3, 1 / 3)
    ok = np.isfinite(lps).any(0)
    for _ in range(1000):
        lw = np.log(w)[:, None] + lps[:, ok]
        new = np.exp(lw - np.logaddexp.reduce(lw, axis=0)).mean(1)
        if np.abs(new - w).max() < 1e-10:
            break
        w = new
    np.testing.assert_allclose(an.mixture_weights(list(lps)), new, rtol=1e-8, atol=1e-12)


def test_fixed_shape_matmul_gives_a_row_the_same_bits_in_any_chunking():
    """fixed_shape_matmul: the float64 product to fp32 rounding, and each row's result the same bits when the rows are
    computed all at once or in pieces that start at multiples of GEMM_ROWS (the last piece short, padded)."""
    from knnlm.scoring.analysis import GEMM_ROWS, fixed_shape_matmul

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 24)).astype(np.float32)
    wt = rng.standard_normal((24, 50)).astype(np.float32)
    whole = fixed_shape_matmul(x, wt)
    np.testing.assert_allclose(whole, x.astype(np.float64) @ wt.astype(np.float64), rtol=1e-5, atol=1e-5)
    pieces = np.concatenate([fixed_shape_matmul(x[a:a + GEMM_ROWS], wt) for a in range(0, 300, GEMM_ROWS)])
    np.testing.assert_array_equal(whole, pieces)
    np.testing.assert_array_equal(fixed_shape_matmul(x[:7], wt), whole[:7])
