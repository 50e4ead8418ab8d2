"""Retrieval ablations (Xu et al. 2023, Sec. 5; Table 3): FAISS mask/score vs real mask/score.

Also the datastore-size subsets (Figures 2 and 4) and the offline temperature sweep (Figure 5).

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

from .scoring import (interpolate, lambda_grid, nll_grid, oracle_log_prob, summarize, sweep_temperature,
                      tune_lambda)

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


def subsample_rows(n: int, ratio: float, seed: int) -> np.ndarray:
    """A seeded random subset of round(ratio × N) datastore rows (Figures 2 and 4), sorted int64 [n_sub].

    The subset is an index list into the one datastore, never a copy of its keys. Subsets of different
    ratios with the same seed are drawn independently. Raises ValueError unless 0 < ratio ≤ 1 and the
    subset is non-empty.
    """
    if not 0 < ratio <= 1:
        raise ValueError(f"datastore ratio must be in (0, 1], found {ratio}")
    size = int(round(ratio * n))
    if size < 1:
        raise ValueError(f"ratio {ratio} of a datastore of {n} keys is empty")
    if size == n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False)).astype(np.int64)


def temperature_sweep(lp_lm: dict[str, np.ndarray], raw: dict[str, dict[str, tuple]], words: dict[str, int],
                      taus: list[float], lambda_steps: int) -> dict[str, dict]:
    """The τ × λ sweep of Figure 5 from cached neighbours, for each mask/score setting.

    lp_lm: {split: [T_s]}; raw: {setting: {split: (scores [T_s, k], hit, valid)}} (higher score = closer);
    taus: τ grid (τ = 0: the limit); λ grid = linspace(0, 1, lambda_steps). Per τ, λ is tuned on valid
    over the grid (nll_grid); the valid and test interpolated perplexities at that λ are recomputed
    exactly (interpolate). The best τ minimises the valid NLL. Returns per setting: {'tau', 'lambda',
    'valid_interp_ppl_word', 'test_interp_ppl_word', 'test_interp_ppl_token', 'best': {...}}.
    """
    lams = lambda_grid(lambda_steps)
    out = {}
    for setting, by_split in raw.items():
        sweep = {s: sweep_temperature(*by_split[s], taus) for s in ("valid", "test")}
        grid = nll_grid(lp_lm["valid"], sweep["valid"], lams)  # [n_tau, n_lambda]
        best_l = grid.argmin(1)
        res = {"tau": list(taus), "lambda": [float(lams[j]) for j in best_l]}
        for split in ("valid", "test"):
            summ = [summarize(interpolate(lp_lm[split], sweep[split][i], float(lams[j])), words[split])
                    for i, j in enumerate(best_l)]
            res[f"{split}_interp_ppl_word"] = [x["ppl_word"] for x in summ]
            res[f"{split}_interp_ppl_token"] = [x["ppl_token"] for x in summ]
        i = int(np.argmin(res["valid_interp_ppl_word"]))
        res["best"] = {"tau": taus[i], "lambda": res["lambda"][i], "valid_interp_ppl_word": res["valid_interp_ppl_word"][i],
                       "test_interp_ppl_word": res["test_interp_ppl_word"][i],
                       "test_interp_ppl_token": res["test_interp_ppl_token"][i]}
        out[setting] = res
    return out
