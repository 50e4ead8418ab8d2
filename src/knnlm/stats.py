"""Uncertainty of perplexities: documents of a split and the paired bootstrap over documents (issue 9, part 1).

A difference between two settings is a result only with its confidence interval: every setting is scored
on the same tokens, the split is cut into documents, and whole documents are resampled with replacement
(tokens of one article are correlated, so resampling tokens would understate the spread). All settings
share each resample, so differences are paired. The bootstrap is vectorised: per-document NLL sums and word
counts, then one [B, D] count matrix product per quantity.

Documents (config 'stats.documents'): 'wikitext' = each top-level heading line ` = Title = ` starts a
document (lines before the first heading join the first document; ` = = Section = = ` does not split);
'blank_lines' = a blank line ends a document; 'blocks' = fixed blocks of 'stats.block_tokens' tokens.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def line_documents(lines: list[str], scheme: str) -> np.ndarray:
    """Document id of each line: [n_lines] int64, ids 0, 1, ... in order. A line that starts a document (a
    WikiText title, or the first non-blank line after a blank one) does so only after some text; blank lines
    belong to the document before them. Raises ValueError for other schemes ('blocks' is token-level)."""
    if scheme not in ("wikitext", "blank_lines"):
        raise ValueError(f"config key 'stats.documents': expected 'wikitext', 'blank_lines' or 'blocks', found {scheme!r}")
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


def line_token_documents(text_path: str | Path, line: np.ndarray, scheme: str, block_tokens: int = 2048) -> np.ndarray:
    """Document id of every target token of a split: [T] int32, from the line of each target (line [T], as
    bpe_token_lines or knnlm.hf.tokenize_split give it) and the split's text (config 'stats.documents').
    Raises ValueError if a target's line is not in the file."""
    line = np.asarray(line)
    if scheme == "blocks":
        return (np.arange(len(line)) // block_tokens).astype(np.int32)
    with open(text_path, encoding="utf-8") as f:
        lines = f.readlines()
    if len(line) and (line.max() >= len(lines) or line.min() < 0):
        raise ValueError(f"{text_path} has {len(lines)} lines, its tokens refer to line {line.max()}")
    return line_documents(lines, scheme)[line].astype(np.int32)


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


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap samples [B] at `level` (two-sided)."""
    a = (1 - level) / 2
    lo, hi = np.quantile(samples, [a, 1 - a])
    return float(lo), float(hi)


def verdict(lo: float, hi: float) -> str:
    """'lower' / 'higher' when the interval of a difference excludes 0, else 'inconclusive'."""
    return "lower" if hi < 0 else "higher" if lo > 0 else "inconclusive"


def compare(doc_nll: np.ndarray, doc_words: np.ndarray, names: list[str], pairs: list[tuple[str, str]],
            resamples: int = 1000, seed: int = 1, level: float = 0.95, shares: list[tuple[str, str]] = (),
            base: str = "base") -> dict:
    """Perplexities with CIs and paired relative differences with CIs, from one set of bootstrap resamples.

    doc_nll: [S, D] per-document NLL of the S settings `names` (same documents); pairs: (a, b) to compare as
    ppl_a / ppl_b − 1; shares: (a, b) whose share of b's gain over `base` a recovers, (ppl_base − ppl_a) /
    (ppl_base − ppl_b) (Xu et al. 2023, Sec. 4: "W_ds recovers 55 % of the kNN-LM's gain"). Returns {'ppl': {name:
    {'value', 'lo', 'hi'}}, 'diff': {'a vs b': {'value', 'lo', 'hi', 'verdict'}}, 'share': {'a of b': {'value',
    'lo', 'hi'}}, 'documents': D, 'resamples': B, 'level': level}.
    """
    doc_nll = np.atleast_2d(np.asarray(doc_nll, dtype=np.float64))
    point = np.exp(doc_nll.sum(1) / np.sum(doc_words))
    boot = bootstrap_ppl(doc_nll, doc_words, resample_counts(doc_nll.shape[1], resamples, seed))
    idx = {n: i for i, n in enumerate(names)}
    out = {"ppl": {}, "diff": {}, "documents": int(doc_nll.shape[1]), "resamples": resamples, "level": level}
    for n, i in idx.items():
        lo, hi = interval(boot[:, i], level)
        out["ppl"][n] = {"value": float(point[i]), "lo": lo, "hi": hi}
    for a, b in pairs:
        rel = boot[:, idx[a]] / boot[:, idx[b]] - 1
        lo, hi = interval(rel, level)
        out["diff"][f"{a} vs {b}"] = {"value": float(point[idx[a]] / point[idx[b]] - 1), "lo": lo, "hi": hi,
                                      "verdict": verdict(lo, hi)}
    out["share"] = {}
    for a, b in shares:
        z = idx[base]
        with np.errstate(divide="ignore", invalid="ignore"):
            sh = (boot[:, z] - boot[:, idx[a]]) / (boot[:, z] - boot[:, idx[b]])
        sh = sh[np.isfinite(sh)]
        lo, hi = interval(sh, level) if len(sh) else (float("nan"), float("nan"))
        out["share"][f"{a} of {b}"] = {"value": float((point[z] - point[idx[a]]) / (point[z] - point[idx[b]])),
                                       "lo": lo, "hi": hi}
    return out


def comparison_rows(result: dict, **labels) -> list[dict]:
    """Rows (labels, comparison, relative difference, CI low, CI high, verdict) of a compare() result."""
    return [{**labels, "comparison": k, "relative difference": v["value"], "CI low": v["lo"], "CI high": v["hi"],
             "verdict": v["verdict"]} for k, v in result["diff"].items()]


def fmt_ci(v: dict, pct: bool = False) -> str:
    """'219.49 [217.10, 221.95]' or, for relative differences, '−7.9 % [−8.6, −7.2]'."""
    if pct:
        return f"{100 * v['value']:+.1f} % [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]"
    return f"{v['value']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]"
