"""Which query tokens an experiment scores, and their word counts (the scope of Xu et al. 2023, Sec. 5).

The retrieval experiments (Table 3, Figures 2, 4, 5, the store tables) score a seeded sample of whole
documents of valid and of test spread over the split, `retrieval.max_queries` tokens each on average (all
documents when null), the same tokens for every setting they compare; Table 1 and the parametric tables
score whole splits. Documents: knnlm.statistics.intervals.
"""
from __future__ import annotations

import numpy as np


def scope_tokens(doc: np.ndarray, max_tokens: int | None, seed: int) -> np.ndarray:
    """The scope of a split: sorted int64 token indices of whole documents.

    doc: [T] document id per target token (knnlm.statistics.documents.split_token_documents). A seeded uniform sample
    without replacement of m = ⌈D · max_tokens / T⌉ of the D documents (null: all documents), so every document is in
    the scope with probability m / D whatever its length and the scope holds max_tokens tokens on average
    (a fill up to the budget would favour short documents, a stop at the budget long ones).
    """
    doc = np.asarray(doc)
    if not max_tokens or max_tokens >= len(doc):
        return np.arange(len(doc), dtype=np.int64)
    n_docs = int(doc.max()) + 1
    m = min(n_docs, max(1, int(np.ceil(n_docs * max_tokens / len(doc)))))
    keep = np.random.default_rng(seed).choice(n_docs, size=m, replace=False)
    return np.flatnonzero(np.isin(doc, keep)).astype(np.int64)


def scope_caption(cfg: dict) -> str:
    """The scope of config key 'retrieval.max_queries' in words, for captions."""
    mq = cfg["retrieval"]["max_queries"]
    return ("all tokens of valid and test" if not mq else
            f"a seeded uniform sample of whole documents of valid and of test, {mq:,} tokens each on average (every "
            f"document equally likely)")


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
    valid every token or the tuning sample of config 'retrieval.tuning_documents'. documents: optional {'valid':
    (sampled, all)} document counts of the run."""
    n = cfg["retrieval"].get("tuning_documents")
    if not n:
        return "all tokens of valid and test"
    got = f" ({documents['valid'][0]} of its {documents['valid'][1]})" if documents and "valid" in documents else ""
    return (f"all tokens of test; on valid, where λ and τ are tuned, a seeded sample of {n} whole documents{got} "
            f"(seed retrieval.scope_seed)")
