"""Trends of an effect along a regime axis: which way a comparison moves as the run approaches the paper's regime.

A regime axis (the base LM's perplexity, the datastore's rows per vocabulary entry, the keys the FAISS search scans
per query) is measured at several points of one run, every point scored on the same documents and tokens. An
effect (a relative difference of two settings' perplexities, or a share of a gain) is a function of the settings'
perplexities at each point; its trend is the least-squares slope of the effect against the log of the axis, the log
oriented so that it grows toward the paper's value of the axis. Every point's perplexities are ratios of
per-document sums over the same documents, so the delete-one-document jackknife of knnlm.statistics.intervals
(estimate) leaves a document out of every point at once: the slope's interval is paired over documents, as the
effects' own intervals are.

The trend's verdict (trend_verdict): 'toward' the paper's value of the effect when the slope's interval excludes 0
and the slope's sign is that of (paper − the effect at the point nearest the paper's regime), 'away' when it excludes
0 with the other sign, 'flat' when it includes 0; 'reaches' where the interval of the effect at that nearest point
includes the paper's value. Only the direction is claimed, never an extrapolation.
"""
from __future__ import annotations

import math

import numpy as np

from .intervals import effective_documents, estimate, options
from .verdicts import verdict


def oriented_log(axis: np.ndarray, paper: float) -> tuple[np.ndarray, int]:
    """(x [J], direction): the log of an axis' values [J] (positive) oriented toward the paper's value of the axis,
    x = direction · ln(axis), direction = +1 when the paper's value lies above the points' geometric mean (the run
    approaches it as the axis grows: datastore density, keys scanned) and −1 when below (the base LM's perplexity).
    Raises ValueError for a value that is not positive and finite."""
    a = np.asarray(axis, dtype=np.float64)
    if not np.all(np.isfinite(a) & (a > 0)) or not (math.isfinite(paper) and paper > 0):
        raise ValueError(f"a regime axis' values must be positive and finite: found {a.tolist()} (paper {paper})")
    direction = 1 if math.log(paper) >= float(np.log(a).mean()) else -1
    return direction * np.log(a), direction


def nearest_point(axis: np.ndarray, paper: float) -> tuple[int, float]:
    """(j, factor): the point of an axis [J] nearest the paper's value on the log scale, and how far it still is, as
    a factor ≥ 1 (paper / value or value / paper)."""
    a = np.asarray(axis, dtype=np.float64)
    j = int(np.argmin(np.abs(np.log(a / paper))))
    return j, float(max(a[j] / paper, paper / a[j]))


def least_squares_slope(x: np.ndarray):
    """A statistic for estimate(): maps effects [..., J] at the points x [J] to the least-squares slope of the effect
    on x, [..., 1] (every point weighs alike)."""
    x = np.asarray(x, dtype=np.float64)
    dx = x - x.mean()
    sxx = float((dx * dx).sum())
    if not sxx > 0:
        raise ValueError(f"a slope needs at least two distinct points of the axis: found {x.tolist()}")

    def slope(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        return ((y - y.mean(-1, keepdims=True)) * dx).sum(-1, keepdims=True) / sxx

    return slope


def trend(effect, doc_nll: np.ndarray, doc_words: np.ndarray, x: np.ndarray, stats: dict | None = None,
          effect_scale: str = "linear") -> dict:
    """An effect at every point of an axis and its slope against x, with paired intervals over documents.

    effect: maps perplexities [..., S] of the S settings (every point's) to the effect at each point [..., J]
    (vectorised over leading axes: estimate()'s statistic); doc_nll [S, D]: per-document NLL sums (nats) of the S
    settings on the same D documents; doc_words [D]; x [J]: the oriented log axis (oriented_log); stats: config
    'stats' (its interval method; the slope's is the delete-one-document jackknife-t of 'jackknife_t' whatever the
    method, as knnlm.statistics.intervals.jackknife_sums is); effect_scale: 'log' for an effect that is a ratio of
    perplexities (its per-point interval on the log scale, as compare()'s), 'linear' otherwise.
    Returns {'points': [{'value', 'lo', 'hi'}] * J, 'slope': {'value', 'lo', 'hi'}, 'documents': D, 'effective':
    Kish's effective D}. Raises ValueError for fewer than 2 documents or fewer than 2 distinct points.
    """
    st = options(stats)
    slope = least_squares_slope(x)
    v, lo, hi = estimate(effect, doc_nll, doc_words, st, effect_scale)
    sv, slo, shi = estimate(lambda p: slope(effect(p)), doc_nll, doc_words, {**st, "interval": "jackknife_t"},
                            "linear")
    n = int(np.atleast_2d(doc_nll).shape[1])
    return {"points": [{"value": float(a), "lo": float(b), "hi": float(c)} for a, b, c in zip(v, lo, hi)],
            "slope": {"value": float(sv[0]), "lo": float(slo[0]), "hi": float(shi[0])},
            "documents": n, "effective": effective_documents(doc_words)}


def trend_verdict(slope: dict, near: dict, paper: float | None, documents: int | None = None,
                  min_documents: int = 0, effective: float | None = None, scheme: str = "") -> dict:
    """The verdict of a trend: {'trend', 'reaches', 'withheld'}.

    slope: {'value', 'lo', 'hi'} of the effect's slope on the oriented log axis (trend()); near: {'value', 'lo', 'hi'}
    of the effect at the point nearest the paper's regime; paper: the paper's value of the effect (None: the paper
    gives none, and the trend says only 'rising' / 'falling' / 'flat' along the axis). 'trend': 'toward' when the
    slope's interval excludes 0 and sign(slope) = sign(paper − near value), 'away' when it excludes 0 with the other
    sign, 'flat' when it includes 0; where the documents are fewer than `min_documents` as the interval counts them
    (knnlm.statistics.verdicts.verdict) the trend is 'inconclusive (...)' and 'withheld' names what the interval alone
    said. 'reaches': the near point's interval includes the paper's value (False without one)."""
    lo, hi, s = slope["lo"], slope["hi"], slope["value"]
    if not all(math.isfinite(t) for t in (lo, hi, s)):
        return {"trend": "inconclusive (no finite interval)", "reaches": False, "withheld": ""}
    if lo <= 0 <= hi:
        raw = "flat"
    elif paper is None:
        raw = "rising" if s > 0 else "falling"
    else:
        gap = paper - near["value"]
        raw = "flat" if gap == 0 else "toward" if (s > 0) == (gap > 0) else "away"
    reaches = paper is not None and near["lo"] <= paper <= near["hi"]
    v = verdict(lo, hi, documents, min_documents, effective, scheme)
    if v.startswith("inconclusive ("):  # too few documents: the trend is withheld, and what it would have said shown
        return {"trend": v, "reaches": False, "withheld": raw + (" (reaches)" if reaches else "")}
    return {"trend": raw, "reaches": bool(reaches), "withheld": ""}
