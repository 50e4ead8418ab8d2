"""Generation's measures (knnlm.scoring.generation, knnlm.experiments.generation) against brute-force references
written from their definitions: p_kNN over the vocabulary, entropy, nucleus sampling, distinct-n, the prefixes'
offsets and the slope of H(p_kNN) − H(p_LM) on the step."""
import math

import numpy as np
import pytest


def test_knn_distribution_and_entropy_against_loops():
    """p_kNN[b, v] = Σ over neighbours with val v of softmax(−d/τ) (missing neighbours −1 get no mass; a row with none
    is all zeros), and its entropy −Σ p log p, by Python loops."""
    from knnlm.scoring.generation import entropy
    from knnlm.scoring.interpolation import knn_distribution

    rng = np.random.default_rng(0)
    b, k, n, v, tau = 6, 9, 40, 11, 1.7
    ids = rng.integers(0, n, (b, k))
    ids[1, 3:] = -1
    ids[4] = -1  # no neighbour at all
    dists = rng.random((b, k)).astype(np.float32) * 5
    vals = rng.integers(0, v, n)
    for metric, sign in (("l2", -1.0), ("ip", 1.0)):
        got = knn_distribution(ids, dists, vals, metric, tau, v)
        ref = np.zeros((b, v))
        for r in range(b):
            live = [j for j in range(k) if ids[r, j] >= 0]
            if not live:
                continue
            z = sum(math.exp(sign * float(dists[r, j]) / tau) for j in live)
            for j in live:
                ref[r, vals[ids[r, j]]] += math.exp(sign * float(dists[r, j]) / tau) / z
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
        h = entropy(got)
        for r in range(b):
            assert h[r] == pytest.approx(-sum(p * math.log(p) for p in ref[r] if p > 0), abs=1e-12)
    assert entropy(np.eye(3))[0] == 0.0 and entropy(np.full((1, 4), 0.25))[0] == pytest.approx(math.log(4))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        knn_distribution(ids, dists, vals, "l2", -0.5, v)
    # τ = 0 is the limit τ → 0: the mass on the nearest neighbours (a tiny τ gives the same)
    np.testing.assert_allclose(knn_distribution(ids, dists, vals, "l2", 0.0, v),
                               knn_distribution(ids, dists, vals, "l2", 1e-6, v), atol=1e-12)


def test_top_p_sample_draws_from_the_nucleus():
    """p = (0.4, 0.3, 0.2, 0.1) in shuffled order: top_p 0.5 keeps the two most probable tokens (the mass before the
    second, 0.4, is under 0.5; before the third, 0.7, is not), drawn in proportion 4:3; top_p 1 draws all four in
    proportion to p; top_p 0.3 only the most probable."""
    from knnlm.scoring.generation import top_p_sample

    order = np.array([2, 0, 3, 1])  # token 2 has 0.4, token 0 0.3, token 3 0.2, token 1 0.1
    p = np.zeros(4)
    p[order] = [0.4, 0.3, 0.2, 0.1]
    rows = np.tile(p, (40000, 1))
    rng = np.random.default_rng(1)
    freq = np.bincount(top_p_sample(rows, 0.5, rng), minlength=4) / len(rows)
    assert freq[3] == freq[1] == 0
    assert freq[2] == pytest.approx(4 / 7, abs=0.01) and freq[0] == pytest.approx(3 / 7, abs=0.01)
    freq = np.bincount(top_p_sample(rows, 1.0, rng), minlength=4) / len(rows)
    np.testing.assert_allclose(freq, p, atol=0.01)
    assert set(top_p_sample(rows[:100], 0.3, rng)) == {2}
    with pytest.raises(ValueError, match="top_p"):
        top_p_sample(rows, 0.0, rng)


def test_distinct_n_against_sets():
    """distinct_n: per sequence, the number of distinct n-grams (a Python set of tuples) over the L − n + 1 n-grams."""
    from knnlm.scoring.generation import distinct_n

    rng = np.random.default_rng(2)
    seqs = rng.integers(0, 4, (7, 15))
    seqs[0] = 3  # one token repeated: 1 distinct n-gram
    for n in (1, 2, 3, 4):
        ref = [len({tuple(s[i:i + n]) for i in range(len(s) - n + 1)}) / (len(s) - n + 1) for s in seqs]
        np.testing.assert_allclose(distinct_n(seqs, n), ref)
    assert distinct_n(seqs, 4)[0] == pytest.approx(1 / 12)
    with pytest.raises(ValueError):
        distinct_n(seqs, 16)


def test_prefix_starts_one_per_long_enough_part():
    """Documents of 100, 30 and 61 tokens, 2 parts each, 25 tokens needed: parts of 50, 15 and 30 tokens; the 15-token
    parts give none. Every window lies inside its own part, so windows never overlap and never cross documents."""
    from knnlm.experiments.generation import prefix_starts

    doc = np.repeat([0, 1, 2], [100, 30, 61])
    for seed in range(20):
        starts = prefix_starts(doc, 25, 2, np.random.default_rng(seed))
        assert len(starts) == 4
        parts = [(0, 50), (50, 100), (130, 160), (160, 190)]
        for s, (a, b) in zip(starts, parts):
            assert a <= s and s + 25 <= b
    assert len(prefix_starts(doc, 51, 2, np.random.default_rng(0))) == 0


def test_slope_sums_give_the_least_squares_slopes():
    """slope_of(slope_sums(...)) is np.polyfit's slope of H(p_kNN) − H(p_LM) on step / PER_STEPS over every (sequence,
    step), and the exposure statistic the difference of two such slopes."""
    from knnlm.experiments.generation import PER_STEPS, _slope_difference, slope_sums
    from knnlm.statistics.regression import slope_of

    rng = np.random.default_rng(3)
    s, length, docs = 9, 20, 4
    seq_doc = rng.integers(0, docs, s)
    a_knn, a_lm, b_knn, b_lm = (rng.random((s, length)) + np.arange(length) * c for c in (0.05, 0.01, 0.02, 0.02))
    x = np.tile(np.arange(1, length + 1) / PER_STEPS, s)

    def fit(h_knn, h_lm):
        return np.polyfit(x, (h_knn - h_lm).ravel(), 1)[0]

    sa, sb = slope_sums(a_knn, a_lm, seq_doc, docs), slope_sums(b_knn, b_lm, seq_doc, docs)
    assert sa.shape == (docs, 6)
    assert slope_of(sa.sum(0))[0] == pytest.approx(fit(a_knn, a_lm), rel=1e-10)
    assert _slope_difference(np.concatenate([sa, sb], 1).sum(0))[0] == pytest.approx(
        fit(a_knn, a_lm) - fit(b_knn, b_lm), rel=1e-10)
