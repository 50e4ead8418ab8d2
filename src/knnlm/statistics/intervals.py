"""Uncertainty of perplexities: confidence intervals over documents.

A difference between two settings is a result only with its confidence interval: every setting is scored
on the same tokens, the split is cut into documents, and the interval treats whole documents as the unit
(tokens of one article are correlated, so intervals over tokens would understate the spread). Every
statistic is a function of per-setting perplexities, each a ratio of per-document sums (NLL over words), so
all settings share each resample (or each left-out document) and differences are paired.

Intervals (config 'stats.interval'): 'jackknife_t' (default) = delete-one-document jackknife standard error
on the log scale for perplexities and their ratios (the cluster-robust linearised variance of a ratio
estimator) with a t quantile on n_eff − 1 degrees of freedom, n_eff = Kish's effective number of documents; 'bca' =
bias-corrected and accelerated bootstrap; 'percentile' = percentile bootstrap. Their coverage under WikiText-like
documents is measured by knnlm.statistics.coverage (docs/statistics.md); the percentile bootstrap under-covers with few documents.

Evidence and verdicts: knnlm.statistics.verdicts; documents: knnlm.statistics.documents.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .documents import check_documents
from .verdicts import verdict


@dataclass(frozen=True)
class Interval:
    """One interval method of config 'stats.interval': whether it draws bootstrap resamples (config 'stats.resamples',
    'stats.seed'), and how a caption names it (formatted with config section 'stats')."""

    resamples: bool
    caption: str


# The interval methods: the one registry that estimate(), compare() and every caption read
INTERVALS = {
    "jackknife_t": Interval(False, "delete-one-document jackknife, t interval on the log scale with Kish's effective "
                                   "number of documents"),
    "bca": Interval(True, "BCa bootstrap over documents, {resamples} resamples, seed {seed}"),
    "percentile": Interval(True, "percentile bootstrap over documents, {resamples} resamples, seed {seed}"),
}


def per_document(values: np.ndarray, docs: np.ndarray, n_docs: int) -> np.ndarray:
    """Sums of `values` ([T] or [S, T]) per document id ([T] ints in [0, n_docs)): [n_docs] or [S, n_docs] float64."""
    v = np.atleast_2d(np.asarray(values, dtype=np.float64))
    out = np.stack([np.bincount(docs, weights=row, minlength=n_docs) for row in v])
    return out if np.ndim(values) == 2 else out[0]


def resample_counts(n_docs: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n_docs] int32: how often each document is drawn in each bootstrap resample (seeded)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=resamples).astype(np.int32)


def bootstrap_ppl(doc_nll: np.ndarray, doc_words: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Perplexity of each setting in each resample: [B, S] from per-document NLL sums doc_nll [S, D] (nats),
    word (or token) counts doc_words [D] and resample counts [B, D]. inf where a resample's NLL is inf."""
    c = counts.astype(np.float64)
    with np.errstate(invalid="ignore"):
        nll = c @ np.asarray(doc_nll, dtype=np.float64).T  # [B, S]
    return np.exp(nll / (c @ np.asarray(doc_words, dtype=np.float64))[:, None])


def leave_one_out_ppl(doc_nll: np.ndarray, doc_words: np.ndarray) -> np.ndarray:
    """Perplexity of each setting with each document left out: [D, S] from doc_nll [S, D] and doc_words [D]."""
    doc_nll = np.asarray(doc_nll, dtype=np.float64)
    w = np.asarray(doc_words, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp((doc_nll.sum(1)[None, :] - doc_nll.T) / (w.sum() - w)[:, None])


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap samples [B] at `level` (two-sided), over the finite samples."""
    a = (1 - level) / 2
    samples = np.asarray(samples)
    samples = samples[np.isfinite(samples)]
    if not len(samples):
        return float("nan"), float("nan")
    lo, hi = np.quantile(samples, [a, 1 - a])
    return float(lo), float(hi)


def effective_documents(doc_words: np.ndarray) -> float:
    """Kish's effective number of documents (Σ w)² / Σ w² of documents with word counts doc_words [D]: D when
    they are equally long, fewer when a few long documents carry most of the words. The jackknife-t interval
    takes its t quantile on effective_documents − 1 degrees of freedom (at least 1): with D − 1 it under-covers
    on WikiText-like articles (91.9 % at 20 documents), with this 95.4 % (docs/statistics.md)."""
    w = np.asarray(doc_words, dtype=np.float64)
    return float(max(2.0, w.sum() ** 2 / (w ** 2).sum()))


def options(stats: dict | None) -> dict:
    """Config section 'stats' with its defaults (those of workflow/schemas/config.schema.yaml, the only place they are
    written) filled in; raises ValueError for an unknown 'stats.interval'."""
    from ..config import section_defaults

    st = {**section_defaults("stats"), **(stats or {})}
    if st["interval"] not in INTERVALS:
        raise ValueError(f"config key 'stats.interval': expected one of {', '.join(INTERVALS)}, found {st['interval']!r}")
    return st


def estimate(fn, doc_nll: np.ndarray, doc_words: np.ndarray, stats: dict | None = None, scale: str = "log",
             counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimates and confidence intervals over documents of statistics of the settings' perplexities.

    fn: maps perplexities [..., S] to statistics [..., K] (vectorised over leading axes); doc_nll [S, D]
    per-document NLL sums (nats), doc_words [D] words (or tokens); stats: config 'stats' ('interval', 'level',
    'resamples', 'seed'); scale: 'log' for positive statistics (perplexities, ratios of them), 'linear' otherwise
    (the jackknife-t interval is symmetric on this scale); counts: [B, D] bootstrap resample counts to share
    between calls (drawn from 'stats.seed' otherwise). Returns (value [K], lo [K], hi [K]) float64; nan where
    the statistic is not finite on every resample or left-out set that the method needs. Raises ValueError for
    fewer than 2 documents.
    """
    from scipy.special import ndtr, ndtri, stdtrit  # scipy.stats's t.ppf, norm.ppf/cdf, bit for bit, without its import

    st = options(stats)
    doc_nll = np.atleast_2d(np.asarray(doc_nll, dtype=np.float64))
    doc_words = np.asarray(doc_words, dtype=np.float64)
    n = doc_nll.shape[1]
    check_documents(n, "a compared split", st["documents"])
    fwd, inv = (np.log, np.exp) if scale == "log" else (lambda x: x, lambda x: x)
    with np.errstate(all="ignore"):
        point = np.asarray(fn(np.exp(doc_nll.sum(1) / doc_words.sum())), dtype=np.float64)
        level, method = st["level"], st["interval"]
        if method in ("jackknife_t", "bca"):
            loo = np.asarray(fn(leave_one_out_ppl(doc_nll, doc_words)), dtype=np.float64)  # [D, K]
        if method == "jackknife_t":
            g = fwd(loo)
            se = np.sqrt((n - 1) / n * ((g - g.mean(0)) ** 2).sum(0))
            q = stdtrit(effective_documents(doc_words) - 1, (1 + level) / 2)
            return point, inv(fwd(point) - q * se), inv(fwd(point) + q * se)
        if counts is None:
            counts = resample_counts(n, st["resamples"], st["seed"])
        boot = np.asarray(fn(bootstrap_ppl(doc_nll, doc_words, counts)), dtype=np.float64)  # [B, K]
        a = (1 - level) / 2
        if method == "percentile":
            lo_hi = np.array([interval(boot[:, k], level) for k in range(boot.shape[1])])
            return point, lo_hi[:, 0], lo_hi[:, 1]
        lo, hi = np.full(len(point), np.nan), np.full(len(point), np.nan)
        for k in range(len(point)):  # bca: Efron (1987); z0 from the bootstrap, acceleration from the jackknife
            b, j = boot[:, k], loo[:, k]
            if not (np.all(np.isfinite(b)) and np.all(np.isfinite(j))):
                continue
            z0 = ndtri(np.clip(np.mean(b < point[k]) + 0.5 * np.mean(b == point[k]), 1 / len(b), 1 - 1 / len(b)))
            d = j.mean() - j
            acc = (d ** 3).sum() / (6 * ((d ** 2).sum()) ** 1.5) if np.any(d) else 0.0
            z = ndtri(np.array([a, 1 - a]))
            adj = ndtr(z0 + (z0 + z) / (1 - acc * (z0 + z)))
            lo[k], hi[k] = np.quantile(b, adj)
        return point, lo, hi


def ppl_intervals(doc_nll: np.ndarray, doc_words: np.ndarray, stats: dict | None = None,
                  counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lo [S], hi [S]): the CI of each setting's perplexity (config 'stats.interval') from doc_nll [S, D]."""
    _, lo, hi = estimate(lambda p: p, doc_nll, doc_words, stats, "log", counts)
    return lo, hi


def compare(doc_nll: np.ndarray, doc_words: np.ndarray, names: list[str], pairs: list[tuple[str, str]],
            stats: dict | None = None, shares: list[tuple[str, str]] = (), base: str = "base",
            scheme: str = "") -> dict:
    """Perplexities with CIs and paired relative differences with CIs and verdicts, on the same documents.

    doc_nll: [S, D] per-document NLL of the S settings `names` (same documents); doc_words [D]; pairs: (a, b)
    to compare as ppl_a / ppl_b − 1; shares: (a, b) whose share of b's gain over `base` a recovers, (ppl_base −
    ppl_a) / (ppl_base − ppl_b) (Xu et al. 2023, Sec. 4: "W_ds recovers 55 % of the kNN-LM's gain"); stats:
    config 'stats' (interval method, level, minimum documents for a verdict, counted as Kish's effective number
    of documents as the interval counts them); scheme: the documents scheme naming the unit in a verdict (default:
    stats['scheme'] when given).
    Returns {'ppl': {name: {'value', 'lo', 'hi'}}, 'diff': {'a vs b': {'value', 'lo', 'hi', 'verdict',
    'documents', 'effective'}}, 'share': {'a of b': {'value', 'lo', 'hi', 'documents', 'effective'}}, 'documents':
    D, 'effective': Kish's effective D, 'interval', 'resamples', 'level'}. Raises ValueError for fewer than 2
    documents.
    """
    st = options(stats)
    scheme = scheme or st.get("scheme", "")  # set by knnlm.experiments.common.stats_options
    doc_nll = np.atleast_2d(np.asarray(doc_nll, dtype=np.float64))
    n_docs = int(doc_nll.shape[1])
    n_eff = effective_documents(doc_words) if n_docs >= 2 else float(n_docs)
    idx = {n: i for i, n in enumerate(names)}
    counts = resample_counts(n_docs, st["resamples"], st["seed"]) if INTERVALS[st["interval"]].resamples else None
    out = {"ppl": {}, "diff": {}, "share": {}, "documents": n_docs, "effective": n_eff, "interval": st["interval"],
           "resamples": st["resamples"], "level": st["level"]}
    v, lo, hi = estimate(lambda p: p, doc_nll, doc_words, st, "log", counts)
    for n, i in idx.items():
        out["ppl"][n] = {"value": float(v[i]), "lo": float(lo[i]), "hi": float(hi[i])}
    if pairs:
        a_i = [idx[a] for a, _ in pairs]
        b_i = [idx[b] for _, b in pairs]
        v, lo, hi = estimate(lambda p: p[..., a_i] / p[..., b_i], doc_nll, doc_words, st, "log", counts)
        for k, (a, b) in enumerate(pairs):
            out["diff"][f"{a} vs {b}"] = {"value": float(v[k] - 1), "lo": float(lo[k] - 1), "hi": float(hi[k] - 1),
                                          "verdict": verdict(lo[k] - 1, hi[k] - 1, n_docs, st["min_documents"],
                                                             n_eff, scheme),
                                          "documents": n_docs, "effective": n_eff}
    if shares:
        z = idx[base]
        a_i = [idx[a] for a, _ in shares]
        b_i = [idx[b] for _, b in shares]
        v, lo, hi = estimate(lambda p: (p[..., [z]] - p[..., a_i]) / (p[..., [z]] - p[..., b_i]), doc_nll, doc_words,
                             st, "linear", counts)
        for k, (a, b) in enumerate(shares):
            out["share"][f"{a} of {b}"] = {"value": float(v[k]), "lo": float(lo[k]), "hi": float(hi[k]),
                                           "documents": n_docs, "effective": n_eff}
    return out


def jackknife_sums(stat, doc_sums: np.ndarray, doc_weights: np.ndarray, stats: dict | None = None,
                   scale: str = "linear") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimate and delete-one-document jackknife-t interval of a statistic of per-document sums.

    The interval of 'stats.interval' = 'jackknife_t' for statistics that are not ratios of perplexities: slopes and
    correlations over tokens (knnlm.statistics.regression.regression_sums) or over word types (App. D,
    knnlm.statistics.regression.type_slope). stat: maps totals [..., M] (sums over documents) to statistics [..., K],
    vectorised over leading axes; doc_sums [D, M] float64 per-document sums; doc_weights [D]: each document's size
    (tokens or words), for Kish's effective number of documents (the t quantile's degrees of freedom, as for the
    perplexity intervals); scale: 'log' for positive statistics. Returns (value [K], lo [K], hi [K]) float64, nan where
    a left-out set gives no finite value. Its coverage on WikiText-like documents is measured by
    knnlm.statistics.coverage.slope_coverage (docs/statistics.md). Raises ValueError for fewer than 2 documents.
    """
    from scipy.special import stdtrit  # scipy.stats's t.ppf, bit for bit

    st = options(stats)
    doc_sums = np.asarray(doc_sums, dtype=np.float64).reshape(len(doc_sums), -1)
    n = doc_sums.shape[0]
    check_documents(n, "a compared split", st["documents"])
    fwd, inv = (np.log, np.exp) if scale == "log" else (lambda x: x, lambda x: x)
    total = doc_sums.sum(0)
    with np.errstate(all="ignore"):
        point = np.atleast_1d(np.asarray(stat(total), dtype=np.float64))
        g = fwd(np.asarray(stat(total[None, :] - doc_sums), dtype=np.float64).reshape(n, -1))  # [D, K]
        se = np.sqrt((n - 1) / n * ((g - g.mean(0)) ** 2).sum(0))
        q = stdtrit(effective_documents(doc_weights) - 1, (1 + st["level"]) / 2)
        return point, inv(fwd(point) - q * se), inv(fwd(point) + q * se)


