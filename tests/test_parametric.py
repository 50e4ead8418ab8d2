"""Parametric alternatives (learned W_ds, nV, adaptive counts, MoS, clustered keys) vs brute-force references."""
import re

import numpy as np
import pytest
import torch

from knnlm.parametric import (Aggregation, AggregatedSoftmax, KeyBatches, MixtureOfSoftmaxes, adaptive_counts,
                              cluster_aggregation, evaluate_log_probs, train)

V, D, B = 7, 5, 11


@pytest.fixture
def hy():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, D, generator=g), torch.randint(0, V, (B,), generator=g)


def test_one_row_per_word_is_the_plain_softmax(hy):
    h, y = hy
    model = AggregatedSoftmax(Aggregation.from_counts(np.ones(V, dtype=int)), D)
    ref = torch.log_softmax(h @ model.weight.T, 1)
    torch.testing.assert_close(model.full_log_probs(h), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.log_prob(h, y), ref[torch.arange(B), y], rtol=1e-5, atol=1e-5)
    assert model.weight.std().item() == pytest.approx(D ** -0.5, rel=0.5)  # N(0, D^-1/2) init


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_multi_embedding_sums_row_probabilities(hy, metric):
    h, y = hy
    counts = np.array([1, 3, 2, 1, 4, 1, 2])
    model = AggregatedSoftmax(Aggregation.from_counts(counts), D, metric=metric)
    w = model.weight.detach().double()
    hd = h.double()
    scores = hd @ w.T if metric == "ip" else -((hd[:, None] - w[None]) ** 2).sum(-1)
    p_rows = torch.softmax(scores, 1)
    owner = np.repeat(np.arange(V), counts)
    p = torch.stack([p_rows[:, owner == v].sum(1) for v in range(V)], 1)
    torch.testing.assert_close(model.full_log_probs(h).double(), p.log(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.log_prob(h, y).double(), p.log()[torch.arange(B), y], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tau", [1.0, 7.5])
def test_clustered_keys_use_cluster_word_frequencies(hy, tau):
    h, y = hy
    rng = np.random.default_rng(0)
    n_clusters, n = 4, 60
    assign, vals = rng.integers(0, n_clusters, n), rng.integers(0, V - 1, n)  # word V-1 never seen
    agg = cluster_aggregation(assign, vals, n_clusters, V)
    m = np.zeros((n_clusters, V))
    np.add.at(m, (assign, vals), 1)
    m /= m.sum(1, keepdims=True)
    model = AggregatedSoftmax(agg, D, metric="l2", temperature=tau)
    assert model.temperature == pytest.approx(tau)
    w = model.weight.detach().double()
    p_c = torch.softmax(-((h.double()[:, None] - w[None]) ** 2).sum(-1) / tau, 1)
    p = p_c @ torch.as_tensor(m)
    got = model.full_log_probs(h).double()
    assert torch.isneginf(got[:, V - 1]).all()
    torch.testing.assert_close(got[:, :V - 1], p[:, :V - 1].log(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.log_prob(h, y).double(), p.log()[torch.arange(B), y], rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("metric,agg", [("ip", "one"), ("ip", "multi"), ("l2", "multi"), ("l2", "clusters")])
def test_fused_backward_equals_autograd_through_logsumexp(metric, agg):
    """The fused log-softmax backward (_TargetLogProb) gives autograd's gradient of the plain formula, including
    words with several rows, log-weights (clusters) and targets the model gives no row (log p = −inf, left out)."""
    g = torch.Generator().manual_seed(1)
    n, vocab, dim = 40, 9, 6
    if agg == "one":
        a = Aggregation.from_counts(np.ones(vocab, dtype=int))
    elif agg == "multi":
        a = Aggregation.from_counts(np.array([1, 3, 2, 1, 4, 1, 2, 1, 2]))
    else:  # 4 clusters over words 0..7: word 8 has no row
        rng = np.random.default_rng(0)
        a = cluster_aggregation(rng.integers(0, 4, 60), rng.integers(0, 8, 60), 4, vocab)
    model = AggregatedSoftmax(a, dim, metric=metric)
    h, y, w = torch.randn(n, dim, generator=g), torch.randint(0, vocab, (n,), generator=g), torch.randn(n, generator=g)
    y[:3] = vocab - 1

    def reference():
        logits = model.logits(h)
        b, rows, lw = a.target_entries(y)
        m = torch.full((n,), -torch.inf).scatter_reduce(0, b, (logits[b, rows] + lw).detach(), "amax")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        s = torch.zeros(n).index_add(0, b, torch.exp(logits[b, rows] + lw - m[b]))
        return torch.log(s) + m - torch.logsumexp(logits, 1)

    got = model.log_prob(h, y)
    fin = torch.isfinite(got)
    assert torch.equal(~fin, (y == vocab - 1) if agg == "clusters" else torch.zeros(n, dtype=torch.bool))
    if metric == "l2":
        model.set_temperature(2.5)  # τ's gradient too (log_temperature)
    got = model.log_prob(h, y)
    (got[fin] * w[fin]).sum().backward()
    params = [q for q in model.parameters()]
    grads = [q.grad.clone() for q in params]
    model.zero_grad()
    ref = reference()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    (ref[fin] * w[fin]).sum().backward()
    assert len(params) == (2 if metric == "l2" else 1)
    for g_fused, q in zip(grads, params):
        torch.testing.assert_close(g_fused, q.grad, rtol=1e-5, atol=1e-5)


def test_blas_row_scores_equal_torch_matmul_and_its_gradients():
    """row_scores (numpy's BLAS on the CPU, the W_ds training GEMMs) gives torch.mm's scores and gradients for both
    inputs; under autocast it is torch's own matmul."""
    from knnlm.parametric import row_scores

    g = torch.Generator().manual_seed(3)
    h, w, up = torch.randn(37, 11, generator=g), torch.randn(23, 11, generator=g), torch.randn(37, 23, generator=g)
    grads = []
    for fn in (row_scores, lambda a, b: a @ b.T):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(a, b)
        (out * up).sum().backward()
        grads.append((out.detach(), a.grad, b.grad))
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert row_scores(h, w).grad_fn is None  # no autograd graph when neither input requires a gradient
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert row_scores(h, w).dtype == torch.bfloat16


def test_l2_temperature_tuned_on_valid_is_the_grid_argmin():
    """tune_l2_temperature picks the grid τ of lowest valid NLL (checked against evaluate_log_probs at every τ), and
    on unnormalised keys (|h| ~ 20) that τ is far above 1 and lowers the NLL by nats, as on wikitext2 (App. C.3)."""
    from knnlm.parametric import TEMPERATURE_GRID, tune_l2_temperature

    rng = np.random.default_rng(3)
    n_clusters, vocab, dim, n = 12, 10, 16, 600
    cent = torch.from_numpy(rng.normal(0, 5, (n_clusters, dim)).astype(np.float32))
    assign = rng.integers(0, n_clusters, n)
    vals = (assign + rng.integers(0, 3, n)) % vocab  # each cluster has a few words
    agg = cluster_aggregation(assign, vals, n_clusters, vocab)
    q = cent.numpy()[assign] + rng.normal(0, 5, (n, dim)).astype(np.float32)  # noisy: the nearest is often wrong
    model = AggregatedSoftmax(agg, dim, weight=cent, metric="l2")
    best, nll = tune_l2_temperature(model, q, vals, batch_size=128)
    ref = {}
    for tau in TEMPERATURE_GRID:
        model.set_temperature(tau)
        lp = evaluate_log_probs(model, q, vals, batch_size=97, bf16=False)
        ref[tau] = -lp[np.isfinite(lp)].mean()
        assert nll[tau] == pytest.approx(ref[tau], rel=1e-5)
    assert best == min(ref, key=ref.get) and best > 4
    assert nll[1.0] - nll[best] > 1.0
    with pytest.raises(ValueError, match="'l2' model"):
        tune_l2_temperature(AggregatedSoftmax(agg, dim), q, vals)


@pytest.mark.parametrize("embed", [False, True])
def test_mixture_of_softmaxes(hy, embed):
    h, y = hy
    w_sm = torch.randn(V, D)
    model = MixtureOfSoftmaxes(w_sm, mixtures=3, train_embed=embed)
    with torch.no_grad():
        model.prior.weight.normal_()
    assert model.w_sm.requires_grad == embed
    prior = torch.softmax(model.prior(h), 1)
    p = sum(prior[:, r:r + 1] * torch.softmax((h @ model.proj[r].T + model.proj_bias[r]) @ model.w_sm.T, 1)
            for r in range(3))
    torch.testing.assert_close(model.full_log_probs(h), p.log(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.log_prob(h, y), p.log()[torch.arange(B), y], rtol=1e-4, atol=1e-4)


def test_adaptive_counts_total_and_rule():
    f = np.array([0, 1, 3, 10, 50, 400, 2000, 9000.0])
    for total in (8, 12, 24, 40):
        c, b = adaptive_counts(f, total)
        assert c.sum() == total and (c >= 1).all()
        assert (np.diff(c) >= 0).all()  # more frequent words never get fewer rows
        rule = 1 + np.floor(np.log(np.maximum(f, 1)) / np.log(b) + 1e-12)
        assert (c - rule >= 0).all() and (c - rule <= 1).all()  # the top-up adds at most one row per word
    with pytest.raises(ValueError, match="total"):
        adaptive_counts(f, 3)


def _clustered(n: int = 600, t: int = 200):
    """(keys [n, D] fp16, vals [n] int32, queries [t, D] fp32, their targets [t]): keys and queries around one
    centre per word, so that a trained W_ds can learn them (seed 0)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(V, D)) * 3
    vals = rng.integers(0, V, n).astype(np.int32)
    keys = (centers[vals] + rng.normal(size=(n, D))).astype(np.float16)
    qv = rng.integers(0, V, t)
    return keys, vals, (centers[qv] + rng.normal(size=(t, D))).astype(np.float32), qv


def test_training_learns_and_resumes_identically(tmp_path):
    keys, vals, queries, qv = _clustered()

    def run(ckpt, epochs, lr=0.05, settings=None):
        model = AggregatedSoftmax(Aggregation.from_counts(np.full(V, 2)), D, seed=3)
        hist = train(model, KeyBatches(keys, vals, None, 64, seed=1), (queries, qv), ckpt, lr=lr,
                     max_epochs=epochs, patience=5, bf16=False, log_every=2, settings=settings)
        return model, hist

    before = -np.mean(evaluate_log_probs(AggregatedSoftmax(Aggregation.from_counts(np.full(V, 2)), D, seed=3),
                                         queries, qv, bf16=False))
    full, hist = run(tmp_path / "a.pt", 3)
    assert hist["valid"][-1][2] < before - 0.5 and hist["epochs"] == 3 and hist["steps"] == 3 * 10
    run(tmp_path / "b.pt", 1)  # "killed" after one epoch ...
    resumed, hist_b = run(tmp_path / "b.pt", 3)  # ... and resumed
    assert hist_b["valid"] == hist["valid"]
    torch.testing.assert_close(resumed.weight, full.weight)
    # a checkpoint saved under other settings (lr; a settings dict) is not continued: the run starts over
    fresh, hist_c = run(tmp_path / "c.pt", 2, lr=0.01)
    other, hist_d = run(tmp_path / "b.pt", 2, lr=0.01)
    assert hist_d["valid"] == hist_c["valid"] and hist_d["steps"] == 20
    torch.testing.assert_close(other.weight, fresh.weight)
    run(tmp_path / "c.pt", 1, lr=0.01, settings={"train_rows": 600})
    assert torch.load(tmp_path / "c.pt", weights_only=False)["history"]["steps"] == 10  # started over at 1 epoch


def test_clustered_training_skips_targets_without_rows(tmp_path):
    """Words no cluster has seen get p = 0: they are left out of the loss, the rest still trains."""
    rng = np.random.default_rng(1)
    vals = rng.integers(0, V - 1, 300).astype(np.int32)  # word V-1 never in the training data
    keys = rng.normal(size=(300, D)).astype(np.float16)
    assign = rng.integers(0, 6, 300)
    model = AggregatedSoftmax(cluster_aggregation(assign, vals, 6, V), D, weight=torch.randn(6, D), metric="l2")
    qv = np.concatenate([rng.integers(0, V - 1, 40), [V - 1] * 5])
    queries = rng.normal(size=(45, D)).astype(np.float32)
    assert np.isneginf(evaluate_log_probs(model, queries, qv, bf16=False)[-5:]).all()
    hist = train(model, KeyBatches(keys, np.where(np.arange(300) % 7 == 0, V - 1, vals), None, 50, seed=1),
                 (queries, qv), tmp_path / "c.pt", lr=0.01, max_epochs=2, patience=2, bf16=False)
    assert hist["epochs"] == 2 and np.isfinite(hist["best_nll"]) and torch.isfinite(model.weight).all()


class _Killed(RuntimeError):
    pass


class _DyingBatches(KeyBatches):
    """Batches that 'kill the job' after `after` batches of this process."""

    def __init__(self, *a, after: int, **kw):
        super().__init__(*a, **kw)
        self.after = after

    def epoch(self, epoch, skip=0):
        for b in super().epoch(epoch, skip):
            if self.after == 0:
                raise _Killed
            self.after -= 1
            yield b


def test_training_evaluates_within_epochs_stops_early_and_resumes_mid_epoch(tmp_path):
    """evals_per_epoch > 1: valid NLL at fractions of an epoch, resumable between them with the same result; early
    stopping counts evaluations and says whether training converged (W_ds trained until valid stops
    improving, with its curve)."""
    keys, vals, queries, qv = _clustered()  # 10 batches of 64 per epoch

    def run(ckpt, batches, **kw):
        model = AggregatedSoftmax(Aggregation.from_counts(np.full(V, 2)), D, seed=3)
        args = dict(lr=0.05, max_epochs=2, patience=50, bf16=False, log_every=2, evals_per_epoch=3) | kw
        return model, train(model, batches, (queries, qv), ckpt, **args)

    full, hist = run(tmp_path / "a.pt", KeyBatches(keys, vals, None, 64, seed=1))
    assert [round(e, 3) for _, e, _ in hist["valid"]] == [0.3, 0.7, 1.0, 1.3, 1.7, 2.0]
    assert [s for s, _, _ in hist["valid"]] == [3, 7, 10, 13, 17, 20] and hist["converged"] is False
    with pytest.raises(_Killed):  # killed in epoch 0 after batch 5: the state of batch 3 is on disk
        run(tmp_path / "b.pt", _DyingBatches(keys, vals, None, 64, seed=1, after=5))
    resumed, hist_b = run(tmp_path / "b.pt", KeyBatches(keys, vals, None, 64, seed=1))
    assert hist_b["valid"] == hist["valid"]
    torch.testing.assert_close(resumed.weight, full.weight)
    # a learning rate that overshoots: the valid NLL stops improving and training stops after `patience` evals
    _, h = run(tmp_path / "c.pt", KeyBatches(keys, vals, None, 64, seed=1), lr=30.0, patience=1, max_epochs=20)
    assert h["converged"] is True and h["evals"] == h["best_eval"] + 2 and h["epochs"] < 20  # 1 eval without gain


def test_training_lr_schedule_and_plateau_rule(tmp_path):
    """lr_schedule 'plateau' halves the learning rate at exactly the evaluations that do not improve the best valid
    NLL (and resumes with its state); the plateau rule stops training, converged, once an epoch gains less than the
    given fraction of perplexity; without it training runs to max_epochs and says it did not converge."""
    keys, vals, queries, qv = _clustered()  # 10 batches of 64 per epoch

    def run(ckpt, batches=None, **kw):
        model = AggregatedSoftmax(Aggregation.from_counts(np.full(V, 2)), D, seed=3)
        args = dict(lr=0.05, max_epochs=3, patience=50, bf16=False, evals_per_epoch=2) | kw
        return model, train(model, batches or KeyBatches(keys, vals, None, 64, seed=1), (queries, qv), ckpt, **args)

    _, h = run(tmp_path / "a.pt", lr=3.0, lr_schedule="plateau")
    best, lr, halved = np.inf, 3.0, 0
    for (_, _, nll), (_, got) in zip(h["valid"], h["lr"], strict=True):
        if nll < best:
            best = nll
        else:
            lr, halved = lr / 2, halved + 1
        assert got == pytest.approx(lr)
    assert halved >= 1 and h["stop"] == "max_epochs" and h["converged"] is False
    with pytest.raises(_Killed):  # killed after 13 batches (2 evaluations on disk), resumed: the same run
        run(tmp_path / "b.pt", _DyingBatches(keys, vals, None, 64, seed=1, after=13), lr=3.0, lr_schedule="plateau")
    _, h_b = run(tmp_path / "b.pt", lr=3.0, lr_schedule="plateau")
    assert h_b["valid"] == h["valid"] and h_b["lr"] == h["lr"]
    _, h = run(tmp_path / "c.pt", plateau=10.0)  # any epoch gains less than 1,000 %: stops one epoch in
    assert h["stop"] == "plateau" and h["converged"] is True and h["evals"] == 3
    _, h = run(tmp_path / "d.pt", plateau=0.0)  # still improving at the cap
    assert h["stop"] == "max_epochs" and h["converged"] is False and h["evals"] == 6
    with pytest.raises(ValueError, match="lr_schedule"):
        run(tmp_path / "e.pt", lr_schedule="cosine")


def test_reduced_precision_paths_against_fp32():
    """bf16 autocast (config parametric.bf16) vs fp32 on LayerNorm-scale keys (D = 256): the clustered datastore's
    L2 logits (2 h·c − |c|², of the order of D) are computed in fp32 whatever the autocast, so they agree to 1e-4;
    the IP (W_ds, nV) and MoS paths stay within 0.01 nats/token on average (perplexity within 1 %) and 0.5 nats
    per token. Before the fp32 fix the L2 path was off by nats."""
    from knnlm.parametric import Aggregation, AggregatedSoftmax, MixtureOfSoftmaxes

    torch.manual_seed(0)
    v, d, b = 500, 256, 512
    h = torch.nn.functional.layer_norm(torch.randn(b, d) * 3 + 1, (d,)) * 4
    y = torch.randint(0, v, (b,))
    cent = h[torch.randint(0, b, (v,))] + 0.3 * torch.randn(v, d)
    models = {"l2": AggregatedSoftmax(Aggregation.from_counts(np.ones(v, int)), d, weight=cent, metric="l2"),
              "ip": AggregatedSoftmax(Aggregation.from_counts(np.full(v, 2)), d, weight=torch.randn(2 * v, d) * 0.2),
              "mos": MixtureOfSoftmaxes(torch.randn(v, d) * 0.2, 2, False)}
    for name, m in models.items():
        with torch.no_grad():
            ref = m.log_prob(h, y)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = m.log_prob(h, y).float()
        diff = low - ref
        if name == "l2":
            assert diff.abs().max() < 1e-4, name
        else:
            assert abs(float(diff.mean())) < 0.01 and diff.abs().max() < 0.5, (name, float(diff.mean()))


def test_cached_result_is_recomputed_under_other_settings(tmp_path):
    """The clustered datastore's k-means (experiments.parametric.cached): reused under the same settings, recomputed
    (and saved) under others, so a changed config never trains on stale centroids."""
    from knnlm.experiments.parametric import cached

    calls = []

    def compute(v):
        def f():
            calls.append(v)
            return {"centroids": torch.full((2, 2), float(v))}
        return f

    path = tmp_path / "kmeans.pt"
    a = cached(path, {"iters": 10}, compute(1))
    b = cached(path, {"iters": 10}, compute(2))  # same settings: the saved result
    c = cached(path, {"iters": 20}, compute(3))  # other settings: recomputed
    d = cached(path, {"iters": 20}, compute(4))
    assert calls == [1, 3] and b["centroids"][0, 0] == 1 and c["centroids"][0, 0] == 3 and d["centroids"][0, 0] == 3
    assert a["settings"] == {"iters": 10} and torch.load(path, weights_only=False)["settings"] == {"iters": 20}


def test_interpolated_loss_on_the_subset_is_trained_and_compared_as_nv1_sub():
    """hypotheses.interpolated_loss.rows = subset: variant 'iloss<λ>-sub' has W_ds-on-the-subset's rows and settings and
    is compared with nv1-sub; without a subset twin of W_ds (W_ds itself on the subset) it stays 'iloss<λ>' vs nv1."""
    from knnlm.config import interpolated_loss_reference, interpolated_loss_variants, validate_config
    from knnlm.parametric import parse_variant, training_settings

    par = {"key_types": ["att", "ffn"], "n_values": [1, 3], "train_tokens": 1000}
    cfg = validate_config({"name": "t", "data": {"dir": "."}, "parametric": par,
                           "hypotheses": {"interpolated_loss": {"rows": "subset", "key_types": ["att"]}}})
    assert interpolated_loss_variants(cfg) == [("iloss25-sub", "att")]
    assert interpolated_loss_reference("iloss25-sub") == "nv1-sub" and interpolated_loss_reference("iloss25") == "nv1"
    assert parse_variant("iloss25-sub") == {"kind": "nv", "n": 1, "interp_loss": 0.25, "subset": True}
    p = cfg["parametric"]
    assert training_settings(p, "iloss25-sub") == training_settings(p, "nv1-sub") != training_settings(p, "iloss25")
    assert training_settings(p, "iloss25-sub")["train_tokens"] == 1000
    same = validate_config({"name": "t", "data": {"dir": "."}, "parametric": {**par, "converge": {"train_tokens": 1000}},
                            "hypotheses": {"interpolated_loss": {"rows": "subset", "key_types": ["att"]}}})
    assert interpolated_loss_variants(same) == [("iloss25", "att")]


def test_variants_are_compared_at_equal_training_rows():
    """When W_ds (nv1) trains on all rows but the other variants on a subset, W_ds is trained again on that subset
    (nv1-sub) and every variant is compared with the W_ds of its key type that saw as many rows; a variant with
    fewer rows than what it is compared with cannot be declared worse ('inconclusive (subset-trained)')."""
    import pandas as pd

    from knnlm.config import parametric_variants, validate_config
    from knnlm.experiments.findings import CLAIMS, _tested
    from knnlm.experiments.parametric import equal_rows_pairs
    from knnlm.parametric import parse_variant, training_settings

    cfg = validate_config({"name": "t", "data": {"dir": "."}, "parametric": {
        "key_types": ["att", "ffn"], "n_values": [1, 3], "train_tokens": 1000, "adaptive": {"key_types": ["att"]},
        "mos": {"key_types": []}, "clustered": {"key_types": []}}})
    variants = parametric_variants(cfg)
    assert ("nv1-sub", "att") in variants and ("nv1-sub", "ffn") in variants
    assert parse_variant("nv1-sub") == {"kind": "nv", "n": 1, "subset": True}
    assert training_settings(cfg["parametric"], "nv1-sub")["train_tokens"] == 1000
    assert training_settings(cfg["parametric"], "nv1")["train_tokens"] is None  # converge: all rows
    cfg["parametric"]["train_tokens"] = None  # every variant on all rows: no second W_ds
    assert not [v for v, _ in parametric_variants(cfg) if v.endswith("-sub")]

    def res(variant, key, rows):
        return {"spec": parse_variant(variant), "key_type": key, "train_rows": rows}
    results = [res("nv1", "att", 5000), res("nv3", "att", 1000), res("nv1-sub", "att", 1000),
               res("adaptive-freq", "att", 1000), res("nv3", "ffn", 1000), res("nv1", "ffn", 5000)]
    names = ["W", "3V att", "W sub", "ada", "3V ffn", "W ffn"]
    assert equal_rows_pairs(results, names) == [("3V att", "W sub"), ("ada", "W sub")]  # ffn: no W_ds on 1000 rows
    gap = next(c for c in CLAIMS if c["claim"].startswith("no other way") and c["kind"] == "paper")
    row = pd.Series({"comparison": "kNN-LM att/IP vs 3V embeddings att", "relative difference": -0.05, "CI low": -0.07,
                     "CI high": -0.03, "verdict": "lower", "documents": 30, "converged": "yes", "steps": 9, "train rows": 1000,
                     "reference rows": 5000})
    assert _tested(gap, row, "", {}, 20)["verdict"] == "inconclusive (subset-trained)"
    assert _tested(gap, pd.Series({**row, "train rows": 5000}), "", {}, 20)["verdict"] == "reproduced"


def test_alternatives_on_a_subset_are_held_against_the_knn_lm_on_the_same_rows(tmp_path):
    """Store 'trainsubset' holds exactly the rows the alternatives train on (the same seeded subset as the parametric
    jobs'); the findings test a subset-trained alternative against that kNN-LM ('kNN-LM att/IP on the subset'),
    where a verdict stands, and leave its row against the all-rows kNN-LM to the parametric table."""
    import pandas as pd

    from knnlm.datastore.stores import (TRAINING_SUBSET, prepare_store, searches_every_token, training_subset_rows,
                                        training_subset_size)
    from knnlm.experiments.findings import CLAIMS, _equal_rows_twin, _tested

    n, cfg = 5000, {"parametric": {"train_tokens": 1000, "seed": 3}}
    keys = np.zeros((n, 4), dtype=np.float16)
    man = {"N": n, "D": 4, "checkpoint_sha256": "x"}
    meta = prepare_store(TRAINING_SUBSET, "att", keys, man, cfg, tmp_path / "sub")
    rows = np.load(tmp_path / "sub" / "rows.npy")
    assert meta["size"] == 1000 and np.array_equal(rows, training_subset_rows(n, 1000, 3))
    assert [training_subset_size(m, 1000) for m in (999, 1000, 1001, 2003)] == [999, 1000, 1000, 1000]
    assert searches_every_token(TRAINING_SUBSET) and searches_every_token("full") and not searches_every_token("r0.05")
    with pytest.raises(ValueError, match="parametric.train_tokens"):
        prepare_store(TRAINING_SUBSET, "att", keys, man, {"parametric": {"train_tokens": None, "seed": 3}}, tmp_path / "x")

    def row(comparison, ref_rows, **kw):
        return {"split": "test", "comparison": comparison, "relative difference": -0.05, "CI low": -0.07,
                "CI high": -0.03, "verdict": "lower", "documents": 30, "converged": "yes", "steps": 9,
                "train rows": 1000, "reference rows": ref_rows, **kw}
    full = row("kNN-LM att/IP vs 3V embeddings att", n, reference="the paper's (att/IP, config τ)")
    sub = row("kNN-LM att/IP on the subset vs 3V embeddings att", 1000, reference="the paper's (att/IP on the subset, config τ)")
    df = pd.DataFrame([full, sub])
    assert _equal_rows_twin(pd.Series(full), df) and not _equal_rows_twin(pd.Series(sub), df)
    assert not _equal_rows_twin(pd.Series(full), df.iloc[:1])  # no twin: the row stays (and is 'subset-trained')
    claim = next(c for c in CLAIMS if "exactly the rows" in c["claim"])
    assert re.fullmatch(claim["pattern"], sub["comparison"]) and claim["ref"] in sub["reference"]
    assert not re.fullmatch(claim["pattern"], full["comparison"])
    assert _tested(claim, pd.Series(sub), "", {}, 20)["verdict"] == "reproduced"


def test_table5_check_names_an_nv_worse_than_w_ds_on_the_same_rows():
    from knnlm.experiments.parametric import nv_check
    from knnlm.parametric import parse_variant

    def res(variant, rows, ppl, steps=10, converged=True):
        return {"spec": parse_variant(variant), "key_type": "att", "train_rows": rows,
                "history": {"steps": steps, "converged": converged},
                "stages": {"trained": {"test": {"interp": {"ppl_word": ppl}}}}}
    assert "no worse" in nv_check([res("nv1-sub", 100, 20.0), res("nv3", 100, 19.9)])
    text = nv_check([res("nv1", 900, 19.0), res("nv1-sub", 100, 20.0), res("nv3", 100, 20.5, 7, False)])
    assert "3V att is worse than W_ds on the same 100 rows (20.500 vs 20.000; 7 steps, under-trained)" in text
    assert "no W_ds trained on its 100 rows" in nv_check([res("nv1", 900, 19.0), res("nv3", 100, 20.5)])


def test_interpolated_loss_training_against_a_brute_force_loss(tmp_path):
    """App. E.6.3 (Eq. 12): with interp = (λ, valid log p_LM), training minimises −log(λ p_W_ds + (1 − λ) p_LM) with
    log p_LM(val) of every row computed once by compute_word_stats (= log softmax(W_sm h_ffn)[val], brute force) and
    read as the batches' third element; early stopping reads the same interpolated NLL on valid: the history's best
    NLL equals the brute-force value of the model it keeps."""
    from knnlm.parametric import compute_word_stats, parse_variant, training_settings

    assert parse_variant("iloss25") == {"kind": "nv", "n": 1, "interp_loss": 0.25}
    with pytest.raises(ValueError, match="0 < λ < 1"):
        parse_variant("iloss100")
    p = {"train_tokens": 20000, "max_epochs": 2, "patience": 1, "evals_per_epoch": 1, "plateau": 0.01,
         "converge": {"variants": ["nv1"], "train_tokens": None, "max_epochs": 9, "patience": 2, "evals_per_epoch": 4,
                      "plateau": 0.005}}
    assert training_settings(p, "iloss25") == training_settings(p, "nv1")  # trained exactly as W_ds
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(V, D)) * 3
    vals = rng.integers(0, V, 600).astype(np.int32)
    keys = (centers[vals] + rng.normal(size=(600, D))).astype(np.float16)
    ffn = rng.normal(size=(600, D)).astype(np.float16)
    w_sm = torch.randn(V, D, generator=torch.Generator().manual_seed(1))
    qv = rng.integers(0, V, 200)
    queries = (centers[qv] + rng.normal(size=(200, D))).astype(np.float32)
    lm_valid = np.log(rng.dirichlet(np.ones(V), 200)[np.arange(200), qv])
    lam = 0.25
    rows = np.full(600, np.nan, dtype=np.float32)
    stats = compute_word_stats(ffn, vals, w_sm, chunk=128, bf16=False, row_logprobs=rows)
    brute = torch.log_softmax(torch.from_numpy(ffn.astype(np.float32)) @ w_sm.T, 1)[torch.arange(600), vals].numpy()
    np.testing.assert_allclose(rows, brute, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats["loss"], np.bincount(vals, -brute.astype(np.float64), minlength=V), rtol=1e-5)
    with pytest.raises(ValueError, match="one entry per datastore row"):
        compute_word_stats(ffn, vals, w_sm, row_logprobs=rows[:10])
    model = AggregatedSoftmax(Aggregation.from_counts(np.full(V, 1)), D, seed=3)
    before = evaluate_log_probs(model, queries, qv, bf16=False)
    hist = train(model, KeyBatches(keys, vals, None, 64, seed=1, aux_keys=rows), (queries, qv), tmp_path / "i.pt",
                 lr=0.05, max_epochs=3, patience=3, bf16=False, log_every=1, interp=(lam, lm_valid))
    lp = evaluate_log_probs(model, queries, qv, bf16=False)
    mix = lambda x: -np.mean(np.log(lam * np.exp(x) + (1 - lam) * np.exp(lm_valid)))  # noqa: E731
    assert hist["best_nll"] == pytest.approx(mix(lp), rel=1e-6) and mix(lp) < mix(before)
    # the training loss is the interpolated one: its first logged value is that of the first batches
    h0, y0, a0 = next(KeyBatches(keys, vals, None, 64, seed=1, aux_keys=ffn).epoch(0))
    lm0 = torch.log_softmax(a0 @ w_sm.T, 1)[torch.arange(len(y0)), y0].numpy()  # the first batch's p_LM, brute force
    fresh = AggregatedSoftmax(Aggregation.from_counts(np.full(V, 1)), D, seed=3)
    with torch.no_grad():
        p0 = fresh.log_prob(h0, y0).numpy()
    first = -np.mean(np.log(lam * np.exp(p0) + (1 - lam) * np.exp(lm0)))
    assert torch.load(tmp_path / "i.pt", weights_only=False)["settings"]["interp_loss"] == lam
    assert hist["train"][0] == (1, pytest.approx(first, rel=1e-5))
