"""knnlm.statistics.trend: the slope of an effect along a regime axis and its paired jackknife interval, against a
brute-force refit (every left-out document's effects recomputed from scratch and refitted with numpy.polyfit), and
the trend verdict's direction against the paper's value."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from knnlm.statistics.intervals import effective_documents
from knnlm.statistics.trend import least_squares_slope, nearest_point, oriented_log, trend, trend_verdict

STATS = {"interval": "jackknife_t", "level": 0.95, "min_documents": 20}


def synthetic(slope: float, n_docs: int = 60, seed: int = 0):
    """Per-document NLL of 'base' and 'knn' at 4 points of an axis whose log-effect ln(ppl_knn / ppl_base) moves by
    `slope` per e-fold of the axis (plus per-document noise): doc_nll [8, D] (point-major: base, knn), words [D], x [4]."""
    rng = np.random.default_rng(seed)
    axis = np.array([10.0, 40.0, 160.0, 640.0])
    x = np.log(axis)
    words = rng.integers(200, 2000, n_docs).astype(np.float64)
    base = words * (5.0 + rng.normal(0, 0.3, n_docs))
    rows = []
    for xj in x:
        effect = -0.10 + slope * (xj - x.mean())  # ln ratio of perplexities at this point
        rows += [base, base + words * (effect + rng.normal(0, 0.02, n_docs))]
    return np.array(rows), words, x, axis


def ratio(p):
    return p[..., 1::2] / p[..., 0::2]


def brute_force(doc_nll, words, x):
    """The slope of (ppl_knn / ppl_base − 1) on x and its jackknife-t interval, each left-out document's perplexities
    recomputed from the remaining sums and refitted by numpy.polyfit."""
    def fit(nll, w):
        ppl = np.exp(nll.sum(1) / w.sum())
        return np.polyfit(x, ppl[1::2] / ppl[0::2] - 1, 1)[0]

    n = doc_nll.shape[1]
    point = fit(doc_nll, words)
    loo = np.array([fit(np.delete(doc_nll, d, axis=1), np.delete(words, d)) for d in range(n)])
    se = math.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum())
    q = sps.t.ppf(0.975, effective_documents(words) - 1)
    return point, point - q * se, point + q * se


@pytest.mark.parametrize("slope", [0.02, 0.0, -0.03])
def test_slope_and_interval_equal_a_brute_force_refit(slope):
    doc_nll, words, x, _ = synthetic(slope)
    r = trend(ratio, doc_nll, words, x, STATS, effect_scale="log")
    point, lo, hi = brute_force(doc_nll, words, x)
    assert r["slope"]["value"] == pytest.approx(point, rel=1e-9, abs=1e-12)
    assert r["slope"]["lo"] == pytest.approx(lo, rel=1e-9, abs=1e-12)
    assert r["slope"]["hi"] == pytest.approx(hi, rel=1e-9, abs=1e-12)
    assert r["documents"] == 60 and len(r["points"]) == 4
    if slope:  # the known slope (on ln ratio; ratio − 1 ≈ its exp) is inside the interval, the wrong sign is not
        near, far = sorted([slope * math.exp(-0.1) * 0.8, slope * math.exp(-0.1) * 1.2])
        assert r["slope"]["lo"] < far and r["slope"]["hi"] > near
        assert (r["slope"]["lo"] > 0) == (slope > 0) and (r["slope"]["hi"] < 0) == (slope < 0)
    else:
        assert r["slope"]["lo"] < 0 < r["slope"]["hi"]


def test_least_squares_slope_is_polyfit_and_needs_two_points():
    x = np.array([0.0, 1.0, 3.0])
    y = np.array([[1.0, 2.0, 2.5], [0.0, -1.0, -4.0]])
    assert least_squares_slope(x)(y)[:, 0] == pytest.approx([np.polyfit(x, row, 1)[0] for row in y])
    with pytest.raises(ValueError, match="two distinct points"):
        least_squares_slope(np.array([2.0, 2.0]))


def test_axis_orientation_and_the_nearest_point():
    x, direction = oriented_log(np.array([345.0, 161.0, 145.0]), 21.75)  # perplexities: the paper's is lower
    assert direction == -1 and x == pytest.approx(-np.log([345.0, 161.0, 145.0]))
    x, direction = oriented_log(np.array([17.0, 339.0]), 5000)  # rows per entry: the paper's is higher
    assert direction == 1
    assert nearest_point(np.array([17.0, 339.0]), 5000) == (1, pytest.approx(5000 / 339))
    assert nearest_point(np.array([20.0, 1270.0]), 1170) == (1, pytest.approx(1270 / 1170))
    with pytest.raises(ValueError, match="positive"):
        oriented_log(np.array([0.0, 3.0]), 10)


def test_the_verdict_flips_with_the_side_the_paper_is_on():
    rising = {"value": 0.01, "lo": 0.004, "hi": 0.016}
    near = {"value": -0.05, "lo": -0.06, "hi": -0.04}
    assert trend_verdict(rising, near, paper=-0.01, documents=60)["trend"] == "toward"  # paper above: rising is toward
    assert trend_verdict(rising, near, paper=-0.12, documents=60)["trend"] == "away"  # paper below: rising is away
    falling = {"value": -0.01, "lo": -0.016, "hi": -0.004}
    assert trend_verdict(falling, near, paper=-0.12, documents=60)["trend"] == "toward"
    assert trend_verdict(falling, near, paper=-0.01, documents=60)["trend"] == "away"
    flat = {"value": 0.01, "lo": -0.002, "hi": 0.02}
    assert trend_verdict(flat, near, paper=-0.01, documents=60)["trend"] == "flat"
    assert trend_verdict(rising, near, paper=None, documents=60)["trend"] == "rising"
    # reaches: the nearest point's interval holds the paper's value
    assert trend_verdict(rising, near, paper=-0.045, documents=60)["reaches"] is True
    assert trend_verdict(rising, near, paper=-0.01, documents=60)["reaches"] is False


def test_too_few_documents_withhold_the_trend_and_say_what_it_was():
    rising = {"value": 0.01, "lo": 0.004, "hi": 0.016}
    near = {"value": -0.05, "lo": -0.06, "hi": -0.04}
    v = trend_verdict(rising, near, paper=-0.01, documents=8, min_documents=20, effective=7.5)
    assert v["trend"].startswith("inconclusive (") and v["withheld"] == "toward" and v["reaches"] is False


def test_the_verdict_on_synthetic_data_follows_the_sign_of_the_paper_value():
    doc_nll, words, x, axis = synthetic(0.02)
    r = trend(ratio, doc_nll, words, x, STATS, effect_scale="log")
    j, _ = nearest_point(axis, 5000.0)
    near = {k: v - 1 for k, v in r["points"][j].items()}
    above = trend_verdict(r["slope"], near, near["value"] + 0.05, r["documents"], 20, r["effective"])
    below = trend_verdict(r["slope"], near, near["value"] - 0.05, r["documents"], 20, r["effective"])
    assert (above["trend"], below["trend"]) == ("toward", "away")
