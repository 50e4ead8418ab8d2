"""Which query tokens an experiment scores, and their word counts (the scope of Xu et al. 2023, Sec. 5).

The retrieval experiments (Table 3, Figures 2, 4, 5, the store tables) score a seeded sample of whole
documents of valid and of test spread over the split, at most `retrieval.max_queries` tokens each (all
documents when null), the same tokens for every setting they compare; Table 1 and the parametric tables
score whole splits. Documents: knnlm.stats.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def scope_tokens(doc: np.ndarray, max_tokens: int | None, seed: int) -> np.ndarray:
    """The scope of a split: sorted int64 token indices of whole documents.

    doc: [T] document id per target token (knnlm.stats.token_documents). Documents are visited in a seeded
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


def word_starts(dict_txt: str | Path) -> np.ndarray:
    """[V] bool over fairseq dictionary ids: True for <eos> and for BPE pieces that begin a word ('▁…').

    The number of targets flagged True in a token span is its word count under the WikiText convention
    (whitespace words + one <eos> per line), since sentencepiece pieces never cross whitespace.
    """
    syms = ["<s>", "<pad>", "</s>", "<unk>"]
    with open(dict_txt, encoding="utf-8") as f:
        syms += [line.rsplit(" ", 1)[0] for line in f if line.strip()]
    flags = np.array([s.startswith("\u2581") for s in syms])
    flags[2] = True  # </s> = <eos>: one word per line
    return flags


def count_words(targets: np.ndarray, starts: np.ndarray) -> int:
    """Words covered by a span of target ids (see word_starts)."""
    return int(starts[np.asarray(targets)].sum())


def words_per_document(doc: np.ndarray, targets: np.ndarray, starts: np.ndarray, n_docs: int) -> np.ndarray:
    """[n_docs] int64 words of each document: its targets that start a word (word_starts), so that the words of
    any set of documents add up to count_words of their tokens, whatever the document scheme."""
    return np.bincount(np.asarray(doc), weights=starts[np.asarray(targets)], minlength=n_docs).astype(np.int64)
