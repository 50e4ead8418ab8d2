"""Slopes and correlations as functions of per-document sums, so that their intervals treat documents as the unit
(knnlm.statistics.intervals.jackknife_sums): per-token regressions (App. D: gain against frequency; the position
slopes of App. E.3) and per-word-type regressions (App. D, Figure 7)."""
from __future__ import annotations

import numpy as np


REGRESSION_SUMS = ("n", "x", "y", "xx", "xy", "yy")


def regression_sums(x: np.ndarray, y: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document sums [n_docs, 6] (n, Σx, Σy, Σx², Σxy, Σy²) of paired values x, y [T] of the tokens of
    documents doc [T] (ints < n_docs): what slope_of and correlation_of need, summed over any set of documents."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    cols = (np.ones_like(x), x, y, x * x, x * y, y * y)
    return np.stack([np.bincount(doc, weights=c, minlength=n_docs) for c in cols], axis=1)


def regression_leverage(x: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document Σ (x − x̄)² [n_docs] (x̄ over all tokens): how much each document weighs in a least-squares slope
    on x. Passed as the document weights of knnlm.statistics.intervals.jackknife_sums, its Kish effective number sets
    the t quantile's degrees of freedom; with document sizes instead the interval under-covers (86-87 % at 60-200
    WikiText-like documents; knnlm.statistics.coverage.slope_coverage)."""
    x = np.asarray(x, dtype=np.float64)
    return np.bincount(doc, weights=(x - x.mean()) ** 2, minlength=n_docs)


def _moments(s: np.ndarray):
    n, sx, sy, sxx, sxy, syy = (s[..., i] for i in range(6))
    return n, sxx - sx * sx / n, sxy - sx * sy / n, syy - sy * sy / n


def slope_of(sums: np.ndarray) -> np.ndarray:
    """Least-squares slope of y on x from totals [..., 6] of regression_sums: [..., 1]."""
    _, vxx, vxy, _ = _moments(np.asarray(sums, dtype=np.float64))
    return (vxy / vxx)[..., None]


def correlation_of(sums: np.ndarray) -> np.ndarray:
    """Pearson correlation of x and y from totals [..., 6] of regression_sums: [..., 1]."""
    _, vxx, vxy, vyy = _moments(np.asarray(sums, dtype=np.float64))
    return (vxy / np.sqrt(vxx * vyy))[..., None]


def type_counts(target: np.ndarray, doc: np.ndarray, n_docs: int, flags: list[np.ndarray],
                types: np.ndarray) -> np.ndarray:
    """Per-document counts [n_docs, len(types), 1 + len(flags)] of the tokens whose target is each of `types`: its
    occurrences and how many of them have each boolean flag [T] set (App. D: p_kNN > p_LM under one setting).
    target, doc: [T] ints; types [W] the word types kept (others are ignored)."""
    pos = np.full(int(max(target.max(initial=0), types.max(initial=0))) + 1, -1, dtype=np.int64)
    pos[types] = np.arange(len(types))
    col = pos[target]
    keep = col >= 0
    cell = doc[keep].astype(np.int64) * len(types) + col[keep]
    out = np.zeros((n_docs * len(types), 1 + len(flags)))
    out[:, 0] = np.bincount(cell, minlength=n_docs * len(types))
    for i, f in enumerate(flags):
        out[:, i + 1] = np.bincount(cell, weights=np.asarray(f, dtype=np.float64)[keep], minlength=n_docs * len(types))
    return out.reshape(n_docs, len(types), 1 + len(flags))


def type_slope(x: np.ndarray, a: int = 1, b: int = 2):
    """A statistic for knnlm.statistics.intervals.jackknife_sums: the least-squares slope over word types of share_a −
    share_b against x [W] (one value per type; App. D, Figures 6 and 7: y = the share of a type's occurrences where
    p_kNN > p_LM with the real mask minus that with the FAISS mask), from flattened totals [..., W * C] of type_counts
    (C = 1 + flags; a, b: the flag columns). Types with no occurrence in a left-out set drop out of its fit."""
    x = np.asarray(x, dtype=np.float64)

    def stat(totals: np.ndarray) -> np.ndarray:
        t = np.asarray(totals, dtype=np.float64)
        t = t.reshape(t.shape[:-1] + (len(x), -1))
        occ = t[..., 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            y = (t[..., a] - t[..., b]) / occ
        w = (occ > 0).astype(np.float64)
        y = np.where(w > 0, y, 0.0)
        n = w.sum(-1)
        mx, my = (w * x).sum(-1) / n, (w * y).sum(-1) / n
        dx = x - mx[..., None]
        return ((w * dx * (y - my[..., None])).sum(-1) / (w * dx * dx).sum(-1))[..., None]

    return stat
