"""Uncertainty of perplexities: documents of a split, confidence intervals over documents and verdicts.

A difference between two settings is a result only with its confidence interval: every setting is scored
on the same tokens, the split is cut into documents, and the interval treats whole documents as the unit
(tokens of one article are correlated, so intervals over tokens would understate the spread). Every
statistic is a function of per-setting perplexities, each a ratio of per-document sums (NLL over words), so
all settings share each resample (or each left-out document) and differences are paired.

Intervals (config 'stats.interval'): 'jackknife_t' (default) = delete-one-document jackknife standard error
on the log scale for perplexities and their ratios (the cluster-robust linearised variance of a ratio
estimator) with a t quantile on n_eff − 1 degrees of freedom, n_eff = Kish's effective number of documents; 'bca' = bias-corrected and accelerated bootstrap;
'percentile' = percentile bootstrap. Their coverage under WikiText-like documents is measured by
knnlm.coverage (docs/statistics.md); the percentile bootstrap under-covers with few documents.

Evidence (config 'stats.min_documents'): a comparison whose documents count fewer than this as the interval
counts them (Kish's effective number, effective_documents) is 'inconclusive (N articles, n_eff E)' whatever its
interval; a split with one document is an error.

Documents (config 'stats.documents'): 'wikitext' = each top-level heading line ` = Title = ` starts a
document (lines before the first heading join the first document; ` = = Section = = ` does not split);
'blank_lines' = a blank line ends a document; 'blocks' = fixed blocks of 'stats.block_tokens' tokens;
'auto' (default) = 'wikitext' whenever the split has article structure (at least two title lines), whatever the
number of articles: paragraphs of one article share its topic and its effect, so they are not independent units
(a paragraph-level interval over 9 articles covered 50 %, docs/coverage.md). Text without article structure:
'blank_lines' when that gives at least 'stats.target_documents' paragraphs, else blocks of ⌊T / target_documents⌋
tokens; every caption and row then names that unit.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


SCHEMES = ("auto", "wikitext", "blank_lines", "blocks")
INTERVALS = ("jackknife_t", "bca", "percentile")
# the defaults of config section 'stats' (workflow/schemas/config.schema.yaml holds the same)
STATS_DEFAULTS = {"documents": "auto", "target_documents": 40, "block_tokens": 2048, "min_documents": 20,
                  "interval": "jackknife_t", "resamples": 1000, "level": 0.95, "seed": 1}
SCHEME_NAMES = {"wikitext": "WikiText articles", "blank_lines": "blank-line paragraphs", "blocks": "token blocks"}
# the resampling unit of each scheme, as every row names it ("37 articles", "412 token blocks")
UNITS = {"wikitext": ("article", "articles"), "blank_lines": ("paragraph", "paragraphs"),
         "blocks": ("token block", "token blocks")}


def unit_count(n: int | float, scheme: str) -> str:
    """'37 articles', '1 paragraph', '412 token blocks': n units of documents scheme `scheme` (SCHEMES; an unknown
    scheme counts 'documents')."""
    one, many = UNITS.get(scheme, ("document", "documents"))
    return f"{n:,} {one if n == 1 else many}" if isinstance(n, (int, np.integer)) else f"{n:,.1f} {many}"


def line_documents(lines: list[str], scheme: str) -> np.ndarray:
    """Document id of each line: [n_lines] int64, ids 0, 1, ... in order. A line that starts a document (a
    WikiText title, or the first non-blank line after a blank one) does so only after some text; blank lines
    belong to the document before them. Raises ValueError for other schemes ('blocks' is token-level)."""
    if scheme not in ("wikitext", "blank_lines"):
        raise ValueError(f"config key 'stats.documents': expected one of {', '.join(SCHEMES)}, found {scheme!r}")
    starts = np.zeros(len(lines), dtype=bool)
    seen, prev_blank = False, False
    for i, line in enumerate(lines):
        text = line.strip()
        start = bool(WIKITEXT_TITLE.match(line.rstrip("\n"))) if scheme == "wikitext" else bool(text) and prev_blank
        starts[i] = start and seen
        seen, prev_blank = seen or bool(text), not text
    return np.cumsum(starts)


def bpe_token_lines(bpe_path: str | Path) -> dict[str, np.ndarray]:
    """The targets fairseq scores for a split of space-separated sentencepiece pieces (one line per line): every
    piece and one <eos> per line. Returns {'line' [T] int32 line of each target, 'words' [T] int16 words it
    starts: 1 for <eos> and for pieces beginning with '▁' (pieces never cross whitespace, so these add up to
    the WikiText word count)}."""
    line, words = [], []
    with open(bpe_path, encoding="utf-8") as f:
        for i, text in enumerate(f):
            pieces = text.split()
            line.append(np.full(len(pieces) + 1, i, dtype=np.int32))
            words.append(np.array([p.startswith("\u2581") for p in pieces] + [True], dtype=np.int16))
    if not line:
        return {"line": np.zeros(0, np.int32), "words": np.zeros(0, np.int16)}
    return {"line": np.concatenate(line), "words": np.concatenate(words)}


def save_token_lines(path: str | Path, tl: dict[str, np.ndarray]) -> None:
    """Write the 'line' and 'words' of an LM's targets (bpe_token_lines, knnlm.hf.tokenize_split) as one .npz,
    atomically."""
    from .io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, line=tl["line"], words=tl["words"])


def line_token_documents(text_path: str | Path, line: np.ndarray, scheme: str, block_tokens: int = 2048,
                         target_documents: int = 40) -> np.ndarray:
    """Document id of every target token of a split: [T] int32 (split_token_documents without the scheme)."""
    return split_token_documents(text_path, line, scheme, block_tokens, target_documents)[0]


def split_token_documents(text_path: str | Path, line: np.ndarray, scheme: str, block_tokens: int = 2048,
                          target_documents: int = 40) -> tuple[np.ndarray, str, int]:
    """Documents of a split's target tokens (config 'stats.documents'; 'auto' as the module docstring says).

    text_path: the split's text file; line: [T] int line of each target (bpe_token_lines or
    knnlm.hf.tokenize_split). Returns (doc [T] int32 ids 0, 1, ... in order, the scheme used ('wikitext',
    'blank_lines' or 'blocks'), the block size in tokens (0 unless blocks)). Raises ValueError if a target's line
    is not in the file or the scheme is unknown.
    """
    line = np.asarray(line)
    if scheme not in SCHEMES:
        raise ValueError(f"config key 'stats.documents': expected one of {', '.join(SCHEMES)}, found {scheme!r}")
    if scheme != "blocks":
        with open(text_path, encoding="utf-8") as f:
            lines = f.readlines()
        if len(line) and (line.max() >= len(lines) or line.min() < 0):
            raise ValueError(f"{text_path} has {len(lines)} lines, its tokens refer to line {line.max()}")
        if scheme == "auto" and sum(1 for ln in lines if WIKITEXT_TITLE.match(ln.rstrip("\n"))) >= 2:
            scheme = "wikitext"  # article structure: the article is the unit, however few
        for s in (("blank_lines",) if scheme == "auto" else (scheme,)):
            ids = line_documents(lines, s)[line].astype(np.int32)
            if scheme != "auto" or len(np.unique(ids)) >= target_documents:
                return _renumber(ids), s, 0
        block_tokens = max(1, len(line) // target_documents)
    return (np.arange(len(line)) // block_tokens).astype(np.int32), "blocks", int(block_tokens)


def _renumber(ids: np.ndarray) -> np.ndarray:
    """Ids 0, 1, ... in order of first appearance (documents whose lines hold no target are dropped)."""
    if not len(ids):
        return ids
    return (np.cumsum(np.r_[True, ids[1:] != ids[:-1]]) - 1).astype(np.int32)


def check_documents(n_docs: int, where: str, scheme: str) -> None:
    """Raise ValueError when a split has fewer than 2 documents (no interval over documents exists), naming
    config key 'stats.documents' and the file or split `where`."""
    if n_docs < 2:
        raise ValueError(f"config key 'stats.documents' = {scheme!r}: {where} has {n_docs} document(s); intervals "
                         f"over documents need at least 2 (and verdicts 'stats.min_documents'). Use 'auto' or 'blocks'.")


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
    """Config section 'stats' with its defaults (STATS_DEFAULTS) filled in; raises ValueError for an unknown
    'stats.interval'."""
    st = {**STATS_DEFAULTS, **(stats or {})}
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
    from scipy.stats import norm, t as student_t

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
            q = student_t.ppf((1 + level) / 2, effective_documents(doc_words) - 1)
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
            z0 = norm.ppf(np.clip(np.mean(b < point[k]) + 0.5 * np.mean(b == point[k]), 1 / len(b), 1 - 1 / len(b)))
            d = j.mean() - j
            acc = (d ** 3).sum() / (6 * ((d ** 2).sum()) ** 1.5) if np.any(d) else 0.0
            z = norm.ppf([a, 1 - a])
            adj = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
            lo[k], hi[k] = np.quantile(b, adj)
        return point, lo, hi


def ppl_intervals(doc_nll: np.ndarray, doc_words: np.ndarray, stats: dict | None = None,
                  counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lo [S], hi [S]): the CI of each setting's perplexity (config 'stats.interval') from doc_nll [S, D]."""
    _, lo, hi = estimate(lambda p: p, doc_nll, doc_words, stats, "log", counts)
    return lo, hi


def verdict(lo: float, hi: float, documents: int | None = None, min_documents: int = 0,
            effective: float | None = None, scheme: str = "") -> str:
    """'lower' / 'higher' when the interval of a difference excludes 0, else 'inconclusive'; whatever the interval,
    'inconclusive (N articles, n_eff E)' when the documents back it with fewer than `min_documents` (config
    'stats.min_documents') as the interval counts them: `effective` (Kish's effective number, effective_documents)
    when given, else `documents`. scheme: the documents scheme, naming the unit (unit_count)."""
    n = effective if effective is not None else documents
    if n is not None and n < min_documents:
        what = unit_count(int(documents), scheme) if documents is not None else unit_count(float(n), scheme)
        return f"inconclusive ({what}" + (f", n_eff {effective:.1f})" if effective is not None else ")")
    return "lower" if hi < 0 else "higher" if lo > 0 else "inconclusive"


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
    counts = resample_counts(n_docs, st["resamples"], st["seed"]) if st["interval"] != "jackknife_t" else None
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


def ci_caption(stats: dict | None, documents: str = "") -> str:
    """How a table's CIs were computed, for captions: the level, the interval method, the documents (`documents`:
    e.g. 'WikiText articles: 60 test, 60 valid') and the minimum for a verdict."""
    st = options(stats)
    how = {"jackknife_t": "delete-one-document jackknife, t interval on the log scale with Kish's effective number "
                          "of documents",
           "bca": f"BCa bootstrap over documents, {st['resamples']} resamples, seed {st['seed']}",
           "percentile": f"percentile bootstrap over documents, {st['resamples']} resamples, seed {st['seed']}"}
    docs = f"; documents: {documents}" if documents else ""
    return (f"{100 * st['level']:g}% CI, paired over documents ({how[st['interval']]}{docs}); a comparison whose "
            f"documents count fewer than {st['min_documents']} as the interval counts them (Kish's effective number, "
            f"n_eff) is inconclusive whatever its CI")


def documents_label(scheme: str, counts: dict[str, int], block_tokens: int = 0) -> str:
    """'WikiText articles: 60 test, 61 valid' (or 'token blocks of 1,234 tokens: ...'; 'token blocks: ...' when the
    splits' block sizes differ, block_tokens 0) for captions and rows."""
    name = SCHEME_NAMES.get(scheme, scheme) + (f" of {block_tokens:,} tokens" if scheme == "blocks" and block_tokens else "")
    if scheme in ("blank_lines", "blocks"):
        name += " (the text has no article structure)"
    return f"{name}: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def comparison_rows(result: dict, **labels) -> list[dict]:
    """Rows (labels, comparison, relative difference, CI low, CI high, verdict, documents, effective documents) of a
    compare() result."""
    return [{**labels, "comparison": k, "relative difference": v["value"], "CI low": v["lo"], "CI high": v["hi"],
             "verdict": v["verdict"], "documents": v.get("documents", result.get("documents")),
             "effective documents": v.get("effective", result.get("effective"))}
            for k, v in result["diff"].items()]


def fmt_ci(v: dict, pct: bool = False) -> str:
    """'219.49 [217.10, 221.95]' or, for relative differences, '−7.9 % [−8.6, −7.2]'."""
    if pct:
        return f"{100 * v['value']:+.1f} % [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]"
    return f"{v['value']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]"


def jackknife_sums(stat, doc_sums: np.ndarray, doc_weights: np.ndarray, stats: dict | None = None,
                   scale: str = "linear") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimate and delete-one-document jackknife-t interval of a statistic of per-document sums.

    The interval of 'stats.interval' = 'jackknife_t' for statistics that are not ratios of perplexities: slopes and
    correlations over tokens (knnlm.analysis.regression_sums) or over word types (App. D, knnlm.analysis.type_slope).
    stat: maps totals [..., M] (sums over documents) to statistics [..., K], vectorised over leading axes; doc_sums
    [D, M] float64 per-document sums; doc_weights [D]: each document's size (tokens or words), for Kish's effective
    number of documents (the t quantile's degrees of freedom, as for the perplexity intervals); scale: 'log' for
    positive statistics. Returns (value [K], lo [K], hi [K]) float64, nan where a left-out set gives no finite value.
    Its coverage on WikiText-like documents is measured by knnlm.coverage.slope_coverage (docs/statistics.md).
    Raises ValueError for fewer than 2 documents.
    """
    from scipy.stats import t as student_t

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
        q = student_t.ppf((1 + st["level"]) / 2, effective_documents(doc_weights) - 1)
        return point, inv(fwd(point) - q * se), inv(fwd(point) + q * se)


def statistic_row(name: str, value: float, lo: float, hi: float, documents: int, min_documents: int,
                  effective: float | None = None, scheme: str = "", **labels) -> dict:
    """A comparison row (the columns of comparison_rows) for a statistic that is not a relative difference (a slope,
    a correlation): 'relative difference' holds the statistic, its verdict says whether the CI excludes 0 (with at
    least `min_documents` effective documents, see verdict)."""
    return {**labels, "comparison": name, "relative difference": float(value), "CI low": float(lo),
            "CI high": float(hi), "verdict": verdict(lo, hi, documents, min_documents, effective, scheme),
            "documents": int(documents), "effective documents": effective}
