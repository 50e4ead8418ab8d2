"""Greedy merging (knnlm.scoring.pruning.greedy_merge) against He et al. (2021)'s loop written out in Python on small
random datastores; the weighted kNN distribution against numpy by hand and, with unit weights, the τ sweep."""
import numpy as np
import pytest

from knnlm.scoring.interpolation import sweep_temperature
from knnlm.scoring.pruning import greedy_merge, random_counts, weighted_sweep, weighted_sweeps


def _reference_merge(nb_ids, vals, remove, seed):
    """Algorithm 1 as the reference code runs it: entries in a random order; a present entry absorbs each neighbour of
    count 1 with its val, until `remove` entries are absorbed."""
    counts = [1] * len(vals)
    removed = 0
    for cur in np.random.default_rng(seed).permutation(len(vals)):
        if removed >= remove:
            break
        if counts[cur] <= 0:
            continue
        for v in nb_ids[cur]:
            if v >= 0 and v != cur and counts[v] == 1 and vals[v] == vals[cur]:
                counts[v] = 0
                counts[cur] += 1
                removed += 1
                if removed >= remove:
                    break
    return np.array(counts)


@pytest.mark.parametrize("remove", [0, 50, 200, 10 ** 6])
def test_greedy_merge_equals_the_reference(remove):
    rng = np.random.default_rng(1)
    n, k = 600, 8
    keys = rng.normal(size=(n, 4))
    vals = rng.integers(0, 5, n)
    d = ((keys[:, None] - keys[None]) ** 2).sum(-1)
    nb = np.argsort(d, 1)[:, :k]  # each entry's k nearest, itself first
    nb[::7, -1] = -1
    got = greedy_merge(nb, vals, remove, seed=3)
    want = _reference_merge(nb, vals, remove, 3)
    np.testing.assert_array_equal(got, want)
    assert got.sum() == n and (got >= 0).all()
    assert (got == 0).sum() == min(remove, (want == 0).sum())
    if remove == 10 ** 6:  # ran out of neighbours: every absorbed entry shared its absorber's val
        assert 0 < (got == 0).sum() < n
    with pytest.raises(ValueError, match="out of range"):
        greedy_merge(np.full((n, 2), n), vals, 1)
    with pytest.raises(ValueError, match="remove"):
        greedy_merge(nb, vals, -1)


def test_weighted_sweep_by_hand_and_unit_weights():
    rng = np.random.default_rng(2)
    t, k = 40, 16
    scores = -rng.random((t, k)).astype(np.float32) * 5
    hit = rng.random((t, k)) < 0.3
    weight = rng.integers(0, 4, (t, k)).astype(float)
    taus = [0.0, 0.5, 1.0, 4.0]
    got = weighted_sweep(scores, hit, weight, taus)
    for a, tau in enumerate(taus):
        s = scores.astype(np.float64)
        present = weight > 0
        top = np.where(present, s, -np.inf).max(1, keepdims=True)
        e = weight * ((s == top) if tau == 0 else np.exp((s - top) / tau)) * present
        with np.errstate(divide="ignore"):
            want = np.log((e * hit).sum(1)) - np.log(e.sum(1))
        np.testing.assert_allclose(got[a], want, rtol=1e-9)
    ones = np.ones((t, k))
    np.testing.assert_allclose(weighted_sweep(scores, hit, ones, taus),
                               sweep_temperature(scores, hit, np.ones((t, k), bool), taus), rtol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        weighted_sweep(scores, hit, weight, [-1.0])


def test_weighted_sweeps_equal_one_sweep_per_datastore():
    """Several datastores in one pass: each equals its own weighted_sweep, also where a datastore's best neighbour lies
    far (> 600 nats at the τ) below the best of another (summed relative to its own), where a neighbour in none of
    them scores best, and where a token has no neighbour in any datastore."""
    rng = np.random.default_rng(3)
    t, k, nv = 30, 12, 3
    scores = -rng.random((t, k)).astype(np.float32) * 5
    hit = rng.random((t, k)) < 0.4
    weights = rng.integers(0, 3, (nv, t, k)).astype(np.float32)
    scores[0, 0], weights[:, 0, 0] = 50.0, 0  # the best neighbour of token 0 is in no datastore
    scores[1, :] = np.linspace(0, -2000, k)  # token 1: datastore 0 keeps only the best, datastore 1 only the worst
    weights[0, 1], weights[1, 1] = 0, 0
    weights[0, 1, 0], weights[1, 1, -1], hit[1, -1] = 1, 2, True
    weights[:, 2] = 0  # token 2: no neighbour anywhere
    taus = [0.0, 0.5, 1.0, 3.0]
    got = weighted_sweeps(scores, hit, weights, taus)
    assert got.shape == (nv, len(taus), t)
    for v in range(nv):
        np.testing.assert_allclose(got[v], weighted_sweep(scores, hit, weights[v], taus), rtol=1e-9)
    # the far datastore by hand: all its mass on its one (hit) entry
    assert got[1, 1:, 1] == pytest.approx(0.0) and np.isneginf(got[:, :, 2]).all()
    assert np.isfinite(got[1, :, 1]).all()


def test_random_counts_keep_the_asked_size():
    c = random_counts(1000, 400, seed=5)
    assert c.dtype == np.int32 and (c == 0).sum() == 400 and c.sum() == 600
    assert (random_counts(1000, 400, seed=5) == c).all() and not (random_counts(1000, 400, seed=6) == c).all()
