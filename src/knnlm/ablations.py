"""Retrieval ablations (Xu et al. 2023, Sec. 5; Table 3): FAISS mask/score vs real mask/score.

Settings, for one (key type, metric):
  faiss_mask_faiss_score -- IVFPQ neighbours, IVFPQ (approximate) distances      (the usual kNN-LM)
  faiss_mask_real_score  -- IVFPQ neighbours, distances recomputed in fp32 from the keys
  real_mask_real_score   -- exact top-k neighbours (knnlm.exact), exact distances
All are scored on the same query scope: the first `max_queries` tokens of each split (all when null),
with λ tuned on the valid scope and τ from config 'knn.temperature'.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .scoring import interpolate, lambda_grid, oracle_log_prob, summarize, tune_lambda

SETTINGS = ("faiss_mask_faiss_score", "faiss_mask_real_score", "real_mask_real_score")
SETTING_LABEL = {"faiss_mask_faiss_score": ("FAISS", "FAISS"), "faiss_mask_real_score": ("FAISS", "real"),
                 "real_mask_real_score": ("real", "real")}


def scope(t: int, max_queries: int | None) -> int:
    """Number of leading query tokens in scope: min(T, max_queries), or T when max_queries is null."""
    return t if not max_queries else min(t, int(max_queries))


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


def evaluate_settings(lp_lm: dict[str, np.ndarray], lp_knn: dict[str, dict[str, np.ndarray]], words: dict[str, int],
                      lambda_steps: int) -> dict[str, dict]:
    """Per setting: λ tuned on valid, then {split: {knn, interp, oracle: {ppl_word, ppl_token}}}.

    lp_lm: {split: [T_s] log p_LM}, lp_knn: {setting: {split: [T_s] log p_kNN}}, words: {split: word count}.
    """
    grid = lambda_grid(lambda_steps)
    out = {}
    for setting, by_split in lp_knn.items():
        lam, _ = tune_lambda(lp_lm["valid"], by_split["valid"], grid)
        res = {"lambda": lam}
        for split, lk in by_split.items():
            lm = lp_lm[split]
            res[split] = {"knn": summarize(lk, words[split]), "interp": summarize(interpolate(lm, lk, lam), words[split]),
                          "oracle": summarize(oracle_log_prob(lm, lk), words[split]), "T": len(lm),
                          "words": words[split]}
        out[setting] = res
    return out
