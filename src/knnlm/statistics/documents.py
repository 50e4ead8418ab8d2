"""Documents: the resampling unit of every interval (an article, not its paragraphs), found in a split's text.

Documents (config 'stats.documents'): 'wikitext' = each top-level heading line ` = Title = ` starts a
document (lines before the first heading join the first document; ` = = Section = = ` does not split);
'blank_lines' = a blank line ends a document; 'blocks' = fixed blocks of 'stats.block_tokens' tokens;
'auto' (default) = 'wikitext' whenever the split has article structure (at least two title lines), whatever the
number of articles: paragraphs of one article share its topic and its effect, so they are not independent units
(a paragraph-level interval over 9 articles covered 50 %, docs/coverage.md). Text without article structure:
'blank_lines' when that gives at least 'stats.target_documents' paragraphs, else blocks of ⌊T / target_documents⌋
tokens, at least 'stats.min_block_tokens'; every caption and row then names that unit (per split, where splits
differ). split_token_documents reads the split's text (its lines); the rest takes arrays.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np


WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


SCHEMES = ("auto", "wikitext", "blank_lines", "blocks")


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


def line_token_documents(text_path: str | Path, line: np.ndarray, scheme: str, block_tokens: int = 2048,
                         target_documents: int = 40) -> np.ndarray:
    """Document id of every target token of a split: [T] int32 (split_token_documents without the scheme)."""
    return split_token_documents(text_path, line, scheme, block_tokens, target_documents)[0]


def split_token_documents(text_path: str | Path, line: np.ndarray, scheme: str, block_tokens: int = 2048,
                          target_documents: int = 40, min_block_tokens: int | None = None) -> tuple[np.ndarray, str, int]:
    """Documents of a split's target tokens (config 'stats.documents'; 'auto' as the module docstring says).

    text_path: the split's text file; line: [T] int line of each target (knnlm.data.bpe_token_lines or
    knnlm.lm.hf.tokenize_split). Returns (doc [T] int32 ids 0, 1, ... in order, the scheme used ('wikitext',
    'blank_lines' or 'blocks'), the block size in tokens (0 unless blocks)). Raises ValueError if a target's line
    is not in the file or the scheme is unknown.
    """
    lines = None
    if scheme != "blocks":
        with open(text_path, encoding="utf-8") as f:
            lines = f.readlines()
    return lines_token_documents(lines, line, scheme, block_tokens, target_documents, str(text_path), min_block_tokens)


def lines_token_documents(lines: list[str] | None, line: np.ndarray, scheme: str, block_tokens: int = 2048,
                          target_documents: int = 40, source: str = "<text>",
                          min_block_tokens: int | None = None) -> tuple[np.ndarray, str, int]:
    """split_token_documents of a text given as its lines (each with its newline; None for scheme 'blocks');
    `source` names the text in errors. The blocks 'auto' falls back to are at least `min_block_tokens` long (config
    'stats.min_block_tokens'; None: its default): a short text gets fewer, longer blocks (and so, under
    'stats.min_documents', no verdict), never pieces of a few tokens of one passage counted as independent units."""
    if min_block_tokens is None:
        from ..config import section_defaults

        min_block_tokens = section_defaults("stats")["min_block_tokens"]
    line = np.asarray(line)
    if scheme not in SCHEMES:
        raise ValueError(f"config key 'stats.documents': expected one of {', '.join(SCHEMES)}, found {scheme!r}")
    if scheme != "blocks":
        if len(line) and (line.max() >= len(lines) or line.min() < 0):
            raise ValueError(f"{source} has {len(lines)} lines, its tokens refer to line {line.max()}")
        if scheme == "auto" and sum(1 for ln in lines if WIKITEXT_TITLE.match(ln.rstrip("\n"))) >= 2:
            scheme = "wikitext"  # article structure: the article is the unit, however few
        for s in (("blank_lines",) if scheme == "auto" else (scheme,)):
            ids = line_documents(lines, s)[line].astype(np.int32)
            if scheme != "auto" or len(np.unique(ids)) >= target_documents:
                return _renumber(ids), s, 0
        block_tokens = max(1, min_block_tokens, len(line) // target_documents)
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


def documents_label(scheme: str, counts: dict[str, int], block_tokens: int = 0) -> str:
    """'WikiText articles: 60 test, 61 valid' (or 'token blocks of 1,234 tokens: ...'; 'token blocks: ...' when the
    splits' block sizes differ, block_tokens 0) for captions and rows."""
    name = SCHEME_NAMES.get(scheme, scheme) + (f" of {block_tokens:,} tokens" if scheme == "blocks" and block_tokens else "")
    if scheme in ("blank_lines", "blocks"):
        name += " (the text has no article structure)"
    return f"{name}: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def scheme_label(scheme: dict, counts: dict[str, int]) -> str:
    """knnlm.statistics.documents.documents_label of a documents_scheme() for `counts` ({split: documents}); the block
    size only when every split shares it. Splits whose schemes differ (config 'stats.documents: auto' found articles
    in one, none in another) are each labelled by their own: 'WikiText articles: 60 valid; token blocks of 184 tokens
    (the text has no article structure): 2 test'."""
    schemes = scheme.get("schemes") or {s: scheme["scheme"] for s in counts}
    by = {}
    for split, n in counts.items():
        by.setdefault(schemes.get(split, scheme["scheme"]), {})[split] = n
    parts = []
    for sch, part in by.items():
        blocks = {scheme["block_tokens"].get(s, 0) for s in part}
        parts.append(documents_label(sch, part, blocks.pop() if len(blocks) == 1 else 0))
    return "; ".join(parts)
