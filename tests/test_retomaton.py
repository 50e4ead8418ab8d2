"""RetoMaton's pointer following (knnlm.scoring.retomaton) against a brute-force reference written from the
algorithm with Python sets and lists, on small random datastores (fp16 and fp32 keys, both metrics, pointers capped
and not); with no pointers it is the kNN-LM's p_kNN of the same cache; the seen n-gram share against Python tuples."""
import numpy as np
import pytest

from knnlm.scoring.interpolation import knn_log_prob, scores_from_distances, sweep_temperature
from knnlm.scoring.retomaton import follow_pointers, saved_searches, seen_ngram_share


def _data(dtype, metric, seed=0, n=400, d=8, vocab=4, t=90, k=12):
    rng = np.random.default_rng(seed)
    keys = rng.normal(size=(n, d)).astype(dtype)
    vals = rng.integers(0, vocab, n).astype(np.int32)
    queries = rng.normal(size=(t, d)).astype(np.float32)
    targets = rng.integers(0, vocab, t).astype(np.int64)
    kf = keys.astype(np.float64)
    full = ((queries[:, None, :].astype(np.float64) - kf[None]) ** 2).sum(-1) if metric == "l2" else queries @ kf.T
    order = np.argsort(full if metric == "l2" else -full, axis=1, kind="stable")[:, :k]
    ids = order.astype(np.int64)
    ids[3, -2:] = -1  # a query with fewer than k neighbours
    dists = np.take_along_axis(full, order, 1).astype(np.float32)
    dists[3, -2:] = np.inf if metric == "l2" else -np.inf
    doc = np.repeat(np.arange(3), [30, 25, 35])
    return ids, dists, queries, keys, vals, targets, doc


def _reference(ids, dists, queries, keys, vals, targets, doc, metric, min_ptr, tau, max_ptr):
    """The algorithm step by step: pointers of the last step, a search when fewer than min_ptr, the softmax over the
    union (an entry once), then the entries whose val came, followed to i + 1, the max_ptr best kept."""
    kf = keys.astype(np.float64)
    lp, searched, states = [], [], []
    ptr = []
    for t in range(len(targets)):
        if t == 0 or doc[t] != doc[t - 1]:
            ptr = []
        search = len(ptr) < min_ptr
        ent = {}
        if search:
            for i, dd in zip(ids[t], dists[t]):
                if i >= 0:
                    ent[int(i)] = -float(dd) if metric == "l2" else float(dd)
        for i in ptr:
            if i not in ent:
                v = kf[i] - queries[t] if metric == "l2" else None
                ent[i] = -float(v @ v) if metric == "l2" else float(kf[i] @ queries[t])
        s = np.array(list(ent.values()))
        hit = np.array([vals[i] == targets[t] for i in ent])
        w = (s == s.max()).astype(float) if tau == 0 else np.exp((s - s.max()) / tau)  # τ → 0: the best ones share
        lp.append(np.log(w[hit].sum()) - np.log(w.sum()) if w[hit].sum() > 0 else -np.inf)
        searched.append(search)
        states.append(len(ent))
        nxt = sorted(((sc, i + 1) for i, sc in ent.items() if vals[i] == targets[t] and i < len(vals) - 1),
                     key=lambda x: -x[0])
        ptr = [i for _, i in nxt[:max_ptr]]
    return np.array(lp), np.array(searched), np.array(states)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("min_ptr,max_ptr", [(1, 12), (3, 5), (13, 12), (2, 2)])
def test_follow_pointers_equals_the_reference(dtype, metric, min_ptr, max_ptr):
    data = _data(dtype, metric)
    taus = [0.0, 0.5, 1.0, 3.0]
    lp, searched, states = follow_pointers(*data, metric, min_ptr, taus, max_pointers=max_ptr)
    assert lp.shape == (4, 90) and searched.dtype == bool and states.dtype == np.int32
    for a, tau in enumerate(taus):
        ref_lp, ref_s, ref_n = _reference(*data, metric, min_ptr, tau, max_ptr)
        np.testing.assert_array_equal(searched, ref_s)
        np.testing.assert_array_equal(states, ref_n)
        np.testing.assert_allclose(lp[a], ref_lp, rtol=1e-5, atol=1e-6)
    doc = data[-1]
    first = np.r_[True, doc[1:] != doc[:-1]]
    assert searched[first].all()  # no pointers at a document's start
    if min_ptr > max_ptr:
        assert searched.all() and saved_searches(searched) == 0.0
    else:
        assert 0 < saved_searches(searched) < 1  # pointers do replace searches here


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_no_pointers_is_the_knn_lm_of_the_same_cache(metric):
    ids, dists, queries, keys, vals, targets, doc = _data(np.float16, metric, seed=3)
    taus = [0.0, 1.0, 2.0]
    lp, searched, states = follow_pointers(ids, dists, queries, keys, vals, targets, doc, metric, 1, taus,
                                           max_pointers=0)
    assert searched.all() and (states == (ids >= 0).sum(1)).all()
    safe = np.where(ids >= 0, ids, 0)
    hit, valid = vals[safe] == targets[:, None], ids >= 0
    np.testing.assert_allclose(lp, sweep_temperature(scores_from_distances(dists, metric), hit & valid, valid, taus),
                               rtol=1e-5)
    for a, tau in enumerate(taus[1:], 1):
        want = knn_log_prob(scores_from_distances(dists, metric), vals[safe], targets, tau, valid=valid)
        np.testing.assert_allclose(lp[a], want, rtol=1e-6, atol=1e-9)


def test_follow_pointers_refuses_bad_arguments():
    ids, dists, queries, keys, vals, targets, doc = _data(np.float32, "l2")
    with pytest.raises(ValueError, match="metric"):
        follow_pointers(ids, dists, queries, keys, vals, targets, doc, "cos", 1, [1.0])
    with pytest.raises(ValueError, match="min_pointers"):
        follow_pointers(ids, dists, queries, keys, vals, targets, doc, "l2", 0, [1.0])
    with pytest.raises(ValueError, match="temperature"):
        follow_pointers(ids, dists, queries, keys, vals, targets, doc, "l2", 1, [-1.0])
    with pytest.raises(ValueError, match="non-decreasing"):
        follow_pointers(ids, dists, queries, keys, vals, targets, doc[::-1].copy(), "l2", 1, [1.0])
    with pytest.raises(ValueError, match="same 89 tokens|same 90 tokens"):
        follow_pointers(ids, dists, queries, keys, vals, targets[:-1], doc, "l2", 1, [1.0])


def test_seen_ngram_share_by_hand():
    rng = np.random.default_rng(5)
    train = rng.integers(0, 3, 500)
    text = rng.integers(0, 4, 200)  # token 3 never occurs in train
    grams = {tuple(train[i:i + 5]) for i in range(len(train) - 4)}
    want = np.mean([tuple(text[i:i + 5]) in grams for i in range(len(text) - 4)])
    assert 0 < want < 1
    assert seen_ngram_share(train, text, 5) == pytest.approx(want, abs=0)
    assert seen_ngram_share(train, text[:4], 5) != seen_ngram_share(train, text[:4], 5)  # nan: too short
    assert seen_ngram_share(train, train[10:60], 5) == 1.0


def test_the_last_entry_points_nowhere():
    """Entry N − 1 has no successor: when its val comes it is not followed (the reference's `knns < dstore_size − 1`)."""
    keys = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 2]], dtype=np.float32)
    vals = np.array([0, 1, 1, 1, 1], dtype=np.int32)
    ids = np.array([[4, 3], [0, 1]])  # token 0 retrieves the last entry and entry 3, both with val 1
    dists = np.array([[0.0, 2.0], [0.0, 1.0]], dtype=np.float32)
    queries = np.array([[2, 2], [1, 1]], dtype=np.float32)
    lp, searched, states = follow_pointers(ids, dists, queries, keys, vals, np.array([1, 1]), np.zeros(2, int), "l2",
                                           1, [1.0])
    assert searched.tolist() == [True, False] and states.tolist() == [2, 1]  # only entry 3 → 4 is followed
    assert lp[0, 1] == 0.0  # entry 4's val is the target: all the mass
