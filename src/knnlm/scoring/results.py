"""Evaluating an alternative to the base LM, and the one function that turns it into a table row.

An "alternative" is any per-token log p(target) next to the base LM's: a kNN-LM (Eq. 5's second term) or a
parametric model (Sec. 4). evaluate() tunes λ on valid and summarises every split; result_row() is the row
every table of the paper is built from (Tables 1, 2, 3, 5, 6, 7, C.3, the datastore-size, temperature and
store tables select and label its columns).
"""
from __future__ import annotations

import numpy as np

from .interpolation import interpolate, lambda_grid, oracle_log_prob, perplexity, summarize, tune_lambda

METRIC_NAME = {"l2": "L2", "ip": "IP"}
SPLITS = ("valid", "test")


def evaluate(lp_lm: dict[str, np.ndarray], lp_alt: dict[str, np.ndarray], words: dict[str, int],
             lambda_steps: int) -> dict:
    """λ tuned on valid (grid linspace(0, 1, lambda_steps)), then per split the alternative alone ('knn'),
    interpolated ('interp') and the oracle, each {ppl_word, ppl_token, nll_sum}.

    lp_lm, lp_alt: {split: [T_s] float natural-log p(target)} on the same tokens; words: {split: word count}.
    Returns {'lambda': float, 'valid_nll_per_lambda': [lambda_steps], split: {knn, interp, oracle, T, words}}.
    """
    grid = lambda_grid(lambda_steps)
    lam, nll = tune_lambda(np.asarray(lp_lm["valid"], dtype=np.float64), lp_alt["valid"], grid)
    out = {"lambda": lam, "valid_nll_per_lambda": nll.tolist()}
    for split, la in lp_alt.items():
        lm = np.asarray(lp_lm[split], dtype=np.float64)
        w = words[split]
        out[split] = {"knn": summarize(la, w), "interp": summarize(interpolate(lm, la, lam), w),
                      "oracle": summarize(oracle_log_prob(lm, la), w), "T": len(lm), "words": w}
    return out


def base_summary(lp_lm: dict[str, np.ndarray], words: dict[str, int]) -> dict[str, dict]:
    """{split: {'ppl_word', 'ppl_token'}} of the base LM from its per-token log-probs."""
    return {s: {"ppl_word": perplexity(lp, words[s]), "ppl_token": perplexity(lp, len(lp))} for s, lp in lp_lm.items()}


def result_row(split: str, labels: dict, ev: dict | None = None, base: dict | None = None) -> dict:
    """One table row: `labels` (model, h_ds, ⊗, ... in order) then the perplexity columns of `split`.

    ev: an evaluate() result, or None for the base LM's row, whose PPL comes from base[split]
    ({'ppl_word', 'ppl_token'}) and whose λ, interp and oracle cells are empty.
    """
    row = {"split": split, **labels}
    if ev is None:
        b = base[split]
        return {**row, "PPL (word)": b["ppl_word"], "λ": None, "interp PPL (word)": None, "oracle PPL (word)": None,
                "PPL (token)": b["ppl_token"], "interp PPL (token)": None, "oracle PPL (token)": None}
    r = ev[split]
    return {**row, "PPL (word)": r["knn"]["ppl_word"], "λ": ev["lambda"], "interp PPL (word)": r["interp"]["ppl_word"],
            "oracle PPL (word)": r["oracle"]["ppl_word"], "PPL (token)": r["knn"]["ppl_token"],
            "interp PPL (token)": r["interp"]["ppl_token"], "oracle PPL (token)": r["oracle"]["ppl_token"]}
