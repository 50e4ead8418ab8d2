"""Which query tokens an experiment scores, and their word counts (the scope of Xu et al. 2023, Sec. 5).

The retrieval experiments (Table 3, Figures 2, 4, 5, the store tables) score a seeded sample of whole
documents of valid and of test spread over the split, at most `retrieval.max_queries` tokens each (all
documents when null), the same tokens for every setting they compare; Table 1 and the parametric tables
score whole splits. Documents: knnlm.stats.
"""
from __future__ import annotations

import numpy as np


def scope_tokens(doc: np.ndarray, max_tokens: int | None, seed: int) -> np.ndarray:
    """The scope of a split: sorted int64 token indices of whole documents.

    doc: [T] document id per target token (knnlm.stats.line_token_documents). Documents are visited in a seeded
    random order and kept while the total stays ≤ max_tokens (null: all documents), so the sample spreads over
    the split. Raises ValueError naming 'retrieval.max_queries' if no document fits.
    """
    doc = np.asarray(doc)
    if not max_tokens:
        return np.arange(len(doc), dtype=np.int64)
    sizes = np.bincount(doc)
    keep, total = [], 0
    for d in np.random.default_rng(seed).permutation(len(sizes)):
        if total + sizes[d] <= max_tokens:
            keep.append(d)
            total += sizes[d]
    if not keep:
        raise ValueError(f"config key 'retrieval.max_queries': {max_tokens} tokens hold no whole document "
                         f"(the smallest has {sizes.min()} tokens)")
    return np.flatnonzero(np.isin(doc, keep)).astype(np.int64)


def scope_caption(cfg: dict) -> str:
    """The scope of config key 'retrieval.max_queries' in words, for captions."""
    mq = cfg["retrieval"]["max_queries"]
    return ("all tokens of valid and test" if not mq else
            f"a seeded sample of whole documents of valid and of test, at most {mq} tokens each")
