"""The interpolated Kneser–Ney n-gram LM (knnlm.scoring.ngram) against a brute-force reference written from the
definitions with Python dicts and tuples, on small random streams; its distributions sum to 1."""
from collections import defaultdict

import numpy as np
import pytest

from knnlm.scoring.ngram import KneserNeyLM


def reference_log_probs(train: list[int], n: int, vocab: int, context: list[int], targets: list[int]) -> np.ndarray:
    """Interpolated Kneser–Ney by the book (the module doc's formulas), one probability at a time."""
    t = len(train)
    top = min(n, t)
    grams = {k: [tuple(train[i:i + k]) for i in range(t - k + 1)] for k in range(1, top + 2)}
    count = defaultdict(int)
    for g in grams[top]:
        count[g] += 1
    cont = {k: defaultdict(set) for k in range(1, top)}  # k-gram -> the distinct tokens before it
    for k in range(1, top):
        for g in grams[k + 1]:
            cont[k][g[1:]].add(g[0])

    def stats(k):
        c = count if k == top else {g: len(s) for g, s in cont[k].items()}
        n1 = sum(1 for v in c.values() if v == 1)
        n2 = sum(1 for v in c.values() if v == 2)
        d = n1 / (n1 + 2 * n2) if n1 + n2 else 0.5
        denom, types = defaultdict(int), defaultdict(int)
        for g, v in c.items():
            denom[g[:-1]] += v
            types[g[:-1]] += 1
        return c, d, denom, types

    tables = {k: stats(k) for k in range(1, top + 1)}

    def p(w, hist, k):
        if k == 0:
            return 1.0 / vocab
        lower = p(w, hist, k - 1)  # order k − 1 reads the last k − 2 tokens of the history
        if len(hist) < k - 1:
            return lower
        h = tuple(hist[len(hist) - (k - 1):]) if k > 1 else ()
        c, d, denom, types = tables[k]
        if denom.get(h, 0) == 0:
            return lower
        return max(c.get(h + (w,), 0) - d, 0) / denom[h] + d * types[h] / denom[h] * lower

    full = list(context) + list(targets)
    out = []
    for i, w in enumerate(targets):
        pos = len(context) + i
        hist = full[max(0, pos - (top - 1)):pos]
        out.append(np.log(p(w, hist, top)))
    return np.array(out)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_kneser_ney_equals_the_brute_force_reference(n, seed):
    rng = np.random.default_rng(seed)
    vocab = 7
    # a stream with repeats (a few phrases recur), so that higher orders have counts of 1, 2 and more
    phrases = [rng.integers(0, vocab, size=rng.integers(2, 6)) for _ in range(12)]
    train = np.concatenate([phrases[i] for i in rng.integers(0, 12, size=80)] + [rng.integers(0, vocab, 40)])
    test = np.concatenate([phrases[i] for i in rng.integers(0, 12, size=15)] + [rng.integers(0, vocab, 20)])
    lm = KneserNeyLM(train, n, vocab)
    got = lm.log_probs([2], test)
    want = reference_log_probs(train.tolist(), n, vocab, [2], test.tolist())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert all(0 < d < 1 for d in lm.discounts)


def test_every_order_in_one_pass_equals_its_own_model():
    """log_probs_by_order of one order-6 model gives each order k's model (raw counts at k over the continuation
    counts below), as a model built with n = k gives it, and as the reference does."""
    rng = np.random.default_rng(4)
    vocab = 6
    phrases = [rng.integers(0, vocab, size=4) for _ in range(8)]
    train = np.concatenate([phrases[i] for i in rng.integers(0, 8, size=60)])
    test = np.concatenate([phrases[i] for i in rng.integers(0, 8, size=10)] + [rng.integers(0, vocab, 10)])
    by_order = KneserNeyLM(train, 6, vocab).log_probs_by_order([1], test)
    assert sorted(by_order) == [1, 2, 3, 4, 5, 6]
    for k, lp in by_order.items():
        np.testing.assert_allclose(lp, KneserNeyLM(train, k, vocab).log_probs([1], test), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lp, reference_log_probs(train.tolist(), k, vocab, [1], test.tolist()), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_each_distribution_sums_to_one(n):
    rng = np.random.default_rng(5)
    vocab = 9
    train = rng.integers(0, vocab, size=400)
    lm = KneserNeyLM(train, n, vocab)
    for hist in (train[10:13].tolist(), [0, 0, 0], train[-3:].tolist(), [8]):  # seen, unseen, at the end, short
        p = np.exp([lm.log_probs(hist, [w])[0] for w in range(vocab)])
        assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p > 0).all()


def test_a_seen_continuation_gets_most_of_the_mass_and_bad_input_is_refused():
    train = np.array([1, 2, 3, 4] * 50 + [0, 5, 6])
    lm = KneserNeyLM(train, 3, 8)
    assert np.exp(lm.log_probs([1, 2], [3])[0]) > 0.9
    assert np.exp(lm.log_probs([1, 2], [7])[0]) < 0.01  # never seen at all: only the uniform share
    with pytest.raises(ValueError, match="order"):
        KneserNeyLM(train, 0, 8)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        KneserNeyLM(np.array([1, 9]), 2, 8)
    with pytest.raises(ValueError, match="empty"):
        KneserNeyLM(np.array([], dtype=np.int64), 2, 8)
