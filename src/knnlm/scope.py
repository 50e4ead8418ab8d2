"""Which query tokens an experiment scores, and their word counts (Xu et al. 2023, Sec. 5 scope of Table 3).

The retrieval experiments (Table 3, Figures 2, 4, 5) score the first `retrieval.max_queries` tokens of
valid and of test (all when null); Table 1 and the parametric tables score whole splits.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def scope(t: int, max_queries: int | None) -> int:
    """Number of leading query tokens in scope: min(T, max_queries), or T when max_queries is null."""
    return t if not max_queries else min(t, int(max_queries))


def scope_caption(cfg: dict) -> str:
    """The scope of config key 'retrieval.max_queries' in words, for captions."""
    mq = cfg["retrieval"]["max_queries"]
    return "all tokens of valid and test" if not mq else f"the first {mq} tokens of valid and of test"


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
