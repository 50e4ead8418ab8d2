"""Which query tokens an experiment scores, and their word counts (the scope of Xu et al. 2023, Sec. 5).

The retrieval experiments (Table 3, Figures 2, 4, 5, the store tables) score a seeded sample of whole
documents of valid and of test spread over the split, `retrieval.max_queries` tokens each on average (all
documents when null), the same tokens for every setting they compare; Table 1 and the parametric tables
score whole splits. Documents: knnlm.stats.
"""
from __future__ import annotations

import numpy as np


def scope_tokens(doc: np.ndarray, max_tokens: int | None, seed: int) -> np.ndarray:
    """The scope of a split: sorted int64 token indices of whole documents.

    doc: [T] document id per target token (knnlm.stats.split_token_documents). A seeded uniform sample without
    replacement of m = ⌈D · max_tokens / T⌉ of the D documents (null: all documents), so every document is in
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
