"""knnlm.scoring.quality (when retrieval helps, token by token) against brute-force references on small data."""
import numpy as np
import pytest

from knnlm.scoring.quality import (bucket_lambdas, bucket_of, gain_concentration, interpolate_per_token, lm_entropy,
                                   longest_common_suffix, quantile_edges)
from knnlm.scoring.interpolation import interpolate, lambda_grid


def _suffix_brute(q, t, s, i, cap):
    n = 0
    while n < cap and t - 1 - n >= 0 and i - 1 - n >= 0 and q[t - 1 - n] == s[i - 1 - n]:
        n += 1
    return n


def test_longest_common_suffix_against_brute_force():
    rng = np.random.default_rng(0)
    store = rng.integers(0, 3, 500)  # a 3-token vocabulary: long overlaps happen
    query = np.concatenate([store[100:160], rng.integers(0, 3, 200)])  # a copied stretch: overlaps up to 60
    pos = rng.integers(0, len(query), 400)
    rows = rng.integers(-1, len(store), 400)
    rows[:20] = pos[:20] + 100  # the copied context's own row: overlap = position (up to the copy's start)
    pos[:20] = rng.integers(1, 60, 20)
    rows[:20] = pos[:20] + 100
    got = longest_common_suffix(query, pos, store, rows, cap=40)
    want = [0 if i < 0 else _suffix_brute(query, t, store, i, 40) for t, i in zip(pos, rows)]
    np.testing.assert_array_equal(got, want)
    assert (got[:20] == np.minimum(pos[:20], 40)).all() and got.max() == 40
    assert longest_common_suffix(query, [0], store, [5])[0] == 0  # nothing precedes the first token
    with pytest.raises(ValueError, match="below 500"):
        longest_common_suffix(query, [3], store, [500])
    with pytest.raises(ValueError, match="one entry per token"):
        longest_common_suffix(query, [3, 4], store, [1])


def test_lm_entropy_against_softmax():
    rng = np.random.default_rng(1)
    h, w = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(11, 5)).astype(np.float32)
    ent, mx, lse = lm_entropy(h, w)
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(1), rtol=1e-5)
    np.testing.assert_allclose(mx, np.log(p.max(1)), rtol=1e-5)
    np.testing.assert_allclose(lse, np.log(np.exp(logits).sum(1)), rtol=1e-5)


def test_buckets_and_per_bucket_lambda_against_brute_force():
    rng = np.random.default_rng(2)
    x = rng.normal(size=1000)
    edges = quantile_edges(x, 4)
    b = bucket_of(x, edges)
    assert len(edges) == 3 and np.bincount(b).tolist() == [250] * 4
    assert bucket_of([np.nan, -1e9], edges).tolist() == [3, 0]
    assert len(quantile_edges(np.repeat([1.0, 2.0], 50), 10)) <= 9  # ties merge buckets
    # tokens where the kNN distribution is good (bucket 0) and bad (bucket 1): their own λs differ
    lp_lm = np.log(rng.uniform(0.05, 0.5, 400))
    lp_knn = np.where(np.arange(400) < 200, np.log(rng.uniform(0.5, 0.9, 400)), np.log(rng.uniform(1e-4, 1e-2, 400)))
    bucket = (np.arange(400) >= 200).astype(np.int64)
    grid = lambda_grid(21)
    lams = bucket_lambdas(lp_lm, lp_knn, bucket, 3, grid, fallback=0.25)
    for k in (0, 1):
        sel = bucket == k
        brute = [-interpolate(lp_lm[sel], lp_knn[sel], float(l)).sum() for l in grid]
        assert lams[k] == grid[int(np.argmin(brute))]
    assert lams[0] > 0.5 > lams[1] and lams[2] == 0.25  # an empty bucket keeps the fallback
    per = interpolate_per_token(lp_lm, lp_knn, lams[bucket])
    for k in (0, 1):
        np.testing.assert_allclose(per[bucket == k], interpolate(lp_lm[bucket == k], lp_knn[bucket == k], lams[k]))
    np.testing.assert_allclose(interpolate_per_token(lp_lm, lp_knn, np.zeros(400)), lp_lm)  # retrieval skipped
    one = interpolate_per_token(lp_lm, np.full(400, -np.inf), np.ones(400))
    assert np.isneginf(one).all()


def test_gain_concentration():
    delta = np.array([5.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, -1.0, -2.0, -1.0] * 10)
    conc = gain_concentration(delta, (0.1, 0.5))
    assert conc[0.1] == pytest.approx(50 / 60) and conc[0.5] == pytest.approx(90 / 60)  # over 1: the rest lose
    assert np.isnan(gain_concentration(np.zeros(5))[0.01])


def test_context_ngram_features_against_brute_force():
    from collections import Counter, defaultdict

    from knnlm.scoring.quality import context_features, context_ngram_stats

    rng = np.random.default_rng(3)
    train = rng.integers(0, 4, 300)
    query = np.concatenate([train[50:70], rng.integers(0, 5, 40)])  # token 4 never occurs in training
    for vocab in (5, 70000):  # exact keys, and the hashed ones of a large vocabulary
        stats = context_ngram_stats(train, 3, vocab)
        feats = context_features(query, stats, vocab)
        for n in (1, 2, 3):
            ctx = Counter(tuple(train[i - n:i]) for i in range(n, len(train)))
            nxt = defaultdict(set)
            for i in range(n, len(train)):
                nxt[tuple(train[i - n:i])].add(train[i])
            want_f = [ctx.get(tuple(query[t - n:t]), 0) if t >= n else 0 for t in range(len(query))]
            want_u = [len(nxt.get(tuple(query[t - n:t]), ())) if t >= n else 0 for t in range(len(query))]
            np.testing.assert_array_equal(feats[f"ctx_freq_{n}"], want_f)
            np.testing.assert_array_equal(feats[f"ctx_fertility_{n}"], want_u)


def test_lambda_model_learns_where_retrieval_helps():
    """The retrieval adaptor: where a feature says the kNN distribution is good, the predicted λ is high, where it
    says it is bad, low; its held-out NLL beats the best single λ's, and it stops by patience."""
    from knnlm.scoring.quality import fit_lambda_model, interpolate_per_token, lambda_features
    from knnlm.scoring.interpolation import tune_lambda

    rng = np.random.default_rng(4)
    n = 6000
    good = rng.random(n) < 0.5
    feats = {"lm_entropy": np.where(good, 1.0, 3.0) + rng.normal(0, 0.3, n), "lm_max_logprob": rng.normal(-2, 1, n),
             "ctx_freq_1": rng.integers(0, 100, n), "ctx_fertility_1": rng.integers(0, 10, n)}
    x, names = lambda_features(feats, 1)
    assert x.shape == (n, 4) and names == ["lm_entropy", "lm_max_logprob", "ctx_freq_1", "ctx_fertility_1"]
    lp_lm = np.log(rng.uniform(0.05, 0.3, n))
    lp_knn = np.where(good, np.log(rng.uniform(0.6, 0.95, n)), np.log(rng.uniform(1e-5, 1e-3, n)))
    tr, ho = slice(0, 4000), slice(4000, n)
    predict, hist = fit_lambda_model(x[tr], lp_lm[tr], lp_knn[tr], x[ho], lp_lm[ho], lp_knn[ho], hidden=8, lr=0.01,
                                     batch_size=512, max_epochs=60, patience=3, min_gain=1e-3)
    lam = predict(x[ho])
    assert lam[good[ho]].mean() > 0.7 and lam[~good[ho]].mean() < 0.2
    best_global, _ = tune_lambda(lp_lm[tr], lp_knn[tr], lambda_grid(101))
    adaptive = -interpolate_per_token(lp_lm[ho], lp_knn[ho], lam).mean()
    assert adaptive < -interpolate(lp_lm[ho], lp_knn[ho], best_global).mean() - 0.1
    assert hist["held_nll"][hist["best_epoch"]] == pytest.approx(adaptive, rel=1e-4) and hist["converged"]
    with pytest.raises(ValueError, match="held-out"):
        fit_lambda_model(x[:0], lp_lm[:0], lp_knn[:0], x[ho], lp_lm[ho], lp_knn[ho])


def test_longest_overlap_equals_brute_force():
    """knnlm.experiments.leakage.longest_overlap (rolled 64-bit n-gram hashes) against a brute-force search of every
    run of every chunk in the reference, on small alphabets (many partial matches), with planted runs and whole chunks
    copied from the reference, and a chunk longer than any match."""
    from knnlm.experiments.leakage import longest_overlap

    rng = np.random.default_rng(0)

    def brute(chunks, ref):
        ref = list(ref)
        out = []
        for ch in chunks.tolist():
            best = 0
            for i in range(len(ch)):
                for j in range(i + 1, len(ch) + 1):
                    if any(ref[k:k + j - i] == ch[i:j] for k in range(len(ref) - (j - i) + 1)):
                        best = max(best, j - i)
                    else:
                        break
            out.append(best)
        return np.array(out)

    for trial in range(6):
        ref = rng.integers(0, 5, 250)
        chunks = rng.integers(0, 5, (10, 16))
        chunks[2, 3:12] = ref[40:49]  # a planted run of 9
        chunks[4] = ref[100:116]  # a whole chunk
        chunks[6] = 7  # tokens the reference never has: overlap 0
        got = longest_overlap(chunks, ref, seed=trial)
        np.testing.assert_array_equal(got, brute(chunks, ref))
        assert got[4] == 16 and got[6] == 0 and got[2] >= 9
