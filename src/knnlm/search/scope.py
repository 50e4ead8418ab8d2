"""Which query tokens an experiment scores, and their word counts (the scope of Xu et al. 2023, Sec. 5).

The retrieval experiments (Table 3, Figures 2, 4, 5, the store tables) score a proportional block sample of valid
and of test: every document of a split gives one contiguous, word-aligned block of about
`retrieval.max_queries` · T_a / T of its T_a tokens at a seeded offset (all tokens when null), the same tokens for
every setting they compare. Every token is in the scope with about the same probability, every document is in it,
and the documents stay the resampling unit of the intervals, so a scoped comparison rests on the split's documents.
The context windows of the scoped tokens still come from the whole-split dumps. Table 1 and the parametric tables
score whole splits. Documents: knnlm.statistics.intervals.
"""
from __future__ import annotations

import numpy as np


def _word_starts(words: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Token positions lo..hi-1 of one document where a word starts (words > 0), the document's first token always."""
    starts = lo + np.flatnonzero(np.asarray(words[lo:hi]) > 0)
    return starts if len(starts) and starts[0] == lo else np.concatenate([[lo], starts]).astype(np.int64)


def scope_tokens(doc: np.ndarray, max_tokens: int | None, seed: int, words: np.ndarray | None = None) -> np.ndarray:
    """The scope of a split: sorted int64 token indices, one word-aligned block per document.

    doc: [T] document id per target token, each document contiguous (knnlm.statistics.documents.split_token_documents);
    words: [T] words starting at each target (the documents artifact's 'words'; None: every token starts one).
    Document a of T_a tokens gives a block of whole words, the first the word holding a seeded uniform token of the
    document and the next ones after it, wrapping around to the document's start (a circular block, so that a token
    near either end is as likely to be in it as one in the middle), until the block holds the whole number of words
    nearest to round(max_tokens · T_a / T) tokens (at least one word, at most the document). Every token is then in the scope with probability about
    max_tokens / T whatever its document (a self-weighting sample: the scope's perplexity estimates the split's),
    the scope holds about max_tokens tokens, and every document is in it. Null max_tokens, or one ≥ T: every
    token. Raises ValueError when a document is not contiguous or `words` does not match `doc`.
    """
    doc = np.asarray(doc)
    t = len(doc)
    if not max_tokens or max_tokens >= t:
        return np.arange(t, dtype=np.int64)
    words = np.ones(t, dtype=np.int64) if words is None else np.asarray(words)
    if len(words) != t:
        raise ValueError(f"words per token has {len(words)} entries, the documents {t}")
    bounds = np.flatnonzero(np.diff(doc)) + 1
    edges = np.concatenate([[0], bounds, [t]]).astype(np.int64)
    if len(np.unique(doc)) != len(edges) - 1:
        raise ValueError("a document's tokens are not contiguous: the scope's blocks need contiguous documents")
    rng = np.random.default_rng(seed)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        starts = _word_starts(words, lo, hi)
        ends = np.append(starts[1:], hi)
        want = int(round(max_tokens * (hi - lo) / t))
        # the word holding a uniform token of the document (drawn for every document, so the draws do not depend
        # on the budget's rounding): a long word is as likely to open the block as its tokens are to be in it
        j = int(np.searchsorted(starts, lo + rng.integers(hi - lo), side="right")) - 1
        order = np.roll(np.arange(len(starts)), -j)  # the words from the drawn one on, around the document
        cum = np.cumsum(ends[order] - starts[order])
        n = min(len(order), max(1, int(np.searchsorted(cum, want, side="left")) + 1)) if want > 0 else 1
        if n > 1 and abs(cum[n - 2] - want) <= abs(cum[n - 1] - want):  # the nearer of the two block lengths
            n -= 1
        out += [np.arange(starts[w], ends[w]) for w in order[:n]]
    return np.sort(np.concatenate(out)).astype(np.int64)


def block_sample(doc: np.ndarray, words: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """[t'] sorted int64 positions into a scored token list: the proportional block sample of `fraction` of its
    tokens (knnlm.search.scope.scope_tokens over its documents; every token when fraction ≥ 1).

    doc: [t] document index of each scored token, each document contiguous (scoped_documents); words: [t] words
    starting at each token. Raises ValueError for a fraction ≤ 0."""
    if not fraction > 0:
        raise ValueError(f"a sample's fraction must be > 0, found {fraction}")
    t = len(doc)
    return scope_tokens(doc, None if fraction >= 1 else max(1, int(round(fraction * t))), seed, words)


def every_token_label(fraction: float = 1.0) -> str:
    """What a store scored on every token scores, in words: 'all tokens', or for a block sample of them (config
    'retrieval.table3_fraction' < 1, block_sample) 'a 40% block sample of all tokens'."""
    return "all tokens" if fraction >= 1 else f"a {fraction:.0%} block sample of all tokens"


def scope_caption(cfg: dict) -> str:
    """The scope of config key 'retrieval.max_queries' in words, for captions."""
    mq = cfg["retrieval"]["max_queries"]
    return ("all tokens of valid and test" if not mq else
            f"a seeded proportional block sample of valid and of test, {mq:,} tokens each (every document gives one "
            f"block of whole words, its share of the budget; every token about equally likely)")


def document_sample(doc: np.ndarray, n_documents: int | None, seed: int) -> np.ndarray:
    """The tuning sample of a split: sorted int64 token indices of a seeded uniform sample of `n_documents` of its
    whole documents, without replacement (null, or at least the split's documents: every token).

    doc: [T] document id per target token (0..D-1, knnlm.statistics.documents.split_token_documents). λ and τ of the
    stores scored on every token are tuned on it (config 'retrieval.tuning_documents'): the sample is of documents, the
    resampling unit of every interval, never of tokens inside one. Raises ValueError for n_documents < 1."""
    doc = np.asarray(doc)
    if n_documents is not None and n_documents < 1:
        raise ValueError(f"n_documents must be >= 1 or None, found {n_documents}")
    n_docs = int(doc.max()) + 1 if len(doc) else 0
    if n_documents is None or n_documents >= n_docs:
        return np.arange(len(doc), dtype=np.int64)
    keep = np.random.default_rng(seed).choice(n_docs, size=n_documents, replace=False)
    return np.flatnonzero(np.isin(doc, keep)).astype(np.int64)


def tuning_caption(cfg: dict, documents: dict | None = None) -> str:
    """What the stores scored on every token ('-alltokens') score, in words, for captions: every test token, and on
    valid every token or the tuning sample of config 'retrieval.tuning_documents'; a block sample of those when
    config 'retrieval.table3_fraction' < 1. documents: optional {'valid':
    (sampled, all)} document counts of the run."""
    n = cfg["retrieval"].get("tuning_documents")
    f = cfg["retrieval"].get("table3_fraction", 1.0)
    block = ("" if f >= 1 else f"a seeded proportional block sample of {f:.0%} (one block of whole words per document, "
             f"retrieval.table3_fraction, sized by the rule of docs/statistics.md) of ")
    if not n:
        return f"{block}all tokens of valid and test"
    got = f" ({documents['valid'][0]} of its {documents['valid'][1]})" if documents and "valid" in documents else ""
    return (f"{block}all tokens of test; on valid, where λ and τ are tuned, {'of ' if block else ''}a seeded sample "
            f"of {n} whole documents{got} (seed retrieval.scope_seed)")
