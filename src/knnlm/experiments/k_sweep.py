"""How many neighbours (Khandelwal et al. 2020, Sec. 5, Figure 4: perplexity improves monotonically with k up to
1,024, and "even a small number of neighbours (k = 8) is enough" for most of the gain): the kNN-LM of Table 1 with
only the first k of its cached FAISS neighbours, k = 1, 2, 4, ... up to config 'knn.k', each k with its own τ and
λ tuned on valid (the τ grid of config 'temperature', extended at its upper edge as Table 1's), from the one cached
search of Table 3's pair on the full store: no new search.

Job: table (table and figure 'k_sweep', comparisons CSV 'k_sweep_comparisons' read by the findings).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..config import extend_while_on_edge, tau_edge, temperatures
from ..io import iter_chunks, open_npy, read_checked_json, read_json
from ..job import Job
from ..report.figures import interval_bars, save_figure
from ..report.tables import write_csv, write_table
from ..scoring.interpolation import (interpolate, lambda_grid, neighbour_hits, scores_from_distances, summarize,
                                     sweep_temperature, tune_lambda, tune_temperature)
from ..statistics.captions import ci_caption, comparison_rows, fmt_ci
from ..statistics.intervals import compare, per_document
from .common import SPLITS, by_split, documents_label, lm_log_probs, lm_training_label, open_datastore, \
    split_documents, stats_options

log = logging.getLogger(__name__)
SMALL_K = 8  # Khandelwal et al.'s "small number of neighbours"


def k_values(k: int) -> list[int]:
    """1, 2, 4, ... below k, then k itself (config 'knn.k')."""
    return [2 ** i for i in range(k.bit_length()) if 2 ** i < k] + [k]


def k_label(k: int) -> str:
    return f"k={k}"


def prefix_sweeps(ids, dists, vals: np.ndarray, targets: np.ndarray, metric: str, ks: list[int],
                  taus: list[float] | dict[int, list[float]], chunk: int = 16384) -> dict[int, np.ndarray]:
    """{k: [len(taus of k), T] float64 log p_kNN(target) from the first k neighbours of each query} for every k of
    `ks`, at the τ values `taus` (one list for every k, or {k: list}), reading the neighbour cache (ids [T, K] int,
    dists [T, K] float32, sorted closest first) one chunk of queries at a time: the hits are found once per chunk for
    the largest k and sliced for the others (knnlm.scoring.interpolation.sweep_temperature on each prefix)."""
    per_k = taus if isinstance(taus, dict) else {k: taus for k in ks}
    out = {k: np.empty((len(per_k[k]), ids.shape[0])) for k in ks}
    for s, e in iter_chunks(ids.shape[0], chunk, ids, dists):
        hit, valid = neighbour_hits(ids[s:e], vals, np.asarray(targets[s:e]))
        scores = scores_from_distances(np.asarray(dists[s:e]), metric)
        for k in ks:
            out[k][:, s:e] = sweep_temperature(np.ascontiguousarray(scores[:, :k]), np.ascontiguousarray(hit[:, :k]),
                                               np.ascontiguousarray(valid[:, :k]), per_k[k])
    return out


def table(job: Job) -> dict:
    """Per k (k_values of config 'knn.k'): τ* and λ* tuned on valid, perplexity per word and token, each k vs the base
    LM and vs half its k (paired over documents, knnlm.statistics.intervals.compare), and the share of the largest k's
    gain over the base LM that each k keeps; table, figure and comparisons."""
    cfg, st = job.cfg, stats_options(job)
    _, vals, dman = open_datastore(job, with_keys=False)
    sc = read_checked_json(job.path("score"), "score")
    metric, key = sc["metric"], sc["key_type"]
    lp_lm = lm_log_probs(job)
    caches = {}
    for split in SPLITS:
        meta = read_json(by_split(job, "nb_meta")[split])
        t, kk = meta["T"], meta["k"]
        caches[split] = (open_npy(by_split(job, "nb_ids")[split], (t, kk), np.int32),
                         open_npy(by_split(job, "nb_dists")[split], (t, kk), np.float32),
                         np.load(by_split(job, "targets")[split]))
    ks = k_values(min(cfg["knn"]["k"], caches["valid"][0].shape[1]))
    base_taus = temperatures(cfg)
    # valid: every τ of the grid for every k; test: each k at its τ* only (test measures; nothing is chosen on it)
    ids, dists, targets = caches["valid"]
    sweeps = prefix_sweeps(ids, dists, vals, targets, metric, ks, base_taus)
    grid = lambda_grid(cfg["knn"]["lambda_steps"])
    lps, tuned = {}, {}
    for k in ks:
        def add(more, k=k):
            sweeps[k] = np.concatenate([sweeps[k], prefix_sweeps(ids, dists, vals, targets, metric, [k], more)[k]])

        taus, i = extend_while_on_edge(cfg, list(base_taus), lambda g, k=k: tune_temperature(
            lp_lm["valid"], sweeps[k][:len(g)], g, cfg["temperature"]["lambda_steps"]), add)
        lam, _ = tune_lambda(lp_lm["valid"], sweeps[k][i], grid)
        tuned[k] = {"temperature": taus[i], "lambda": float(lam), "tau_edge": tau_edge(taus, i, cfg),
                    "valid": sweeps[k][i]}
        log.info("k=%d: τ* %g, λ* %.2f", k, taus[i], lam)
    at_test = prefix_sweeps(*caches["test"][:2], vals, caches["test"][2], metric, ks,
                            {k: [tuned[k]["temperature"]] for k in ks})
    for k in ks:
        lp_knn = {"valid": tuned[k].pop("valid"), "test": at_test[k][0]}
        lps[k_label(k)] = {s: interpolate(lp_lm[s], lp_knn[s], tuned[k]["lambda"]) for s in SPLITS}
    top = k_label(ks[-1])
    names = ["base"] + list(lps)
    pairs = [(n, "base") for n in lps] + [(k_label(b), k_label(a)) for a, b in zip(ks, ks[1:])]  # each doubling
    shares = [(k_label(k), top) for k in ks[:-1]]
    rows, cmp, ci = [], [], {}
    for split in SPLITS:
        doc, doc_words = split_documents(job, split)
        words = int(doc_words.sum())
        nll = per_document(-np.stack([lp_lm[split]] + [lps[n][split] for n in lps]), doc, len(doc_words))
        c = ci[split] = compare(nll, doc_words, names, pairs, st, shares=shares)
        cmp += comparison_rows(c, split=split)
        for n in names:
            k = int(n[2:]) if n != "base" else None
            summ = summarize(lp_lm[split] if k is None else lps[n][split], words)
            rows.append({"split": split, "model": "base LM" if k is None else "kNN-LM", "k": str(k) if k else "-",
                         "τ*": tuned[k]["temperature"] if k else None, "λ*": tuned[k]["lambda"] if k else None,
                         "τ* on grid edge": tuned[k]["tau_edge"] if k else "",
                         "PPL (word)": summ["ppl_word"], "PPL (token)": summ["ppl_token"],
                         "95% CI (word)": fmt_ci(c["ppl"][n]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base"], pct=True) if k else "-",
                         f"share of {top}'s gain (95% CI)": fmt_ci(c["share"][f"{n} of {top}"])
                         if k and n != top else "-", "documents": len(doc_words)})
    on = f"{key}/{metric.upper()}, full store, FAISS mask, all tokens"
    df = pd.DataFrame(rows)
    t = cfg["temperature"]
    cap = (f"How many neighbours ({cfg['name']}; Khandelwal et al. 2020, Sec. 5, Figure 4): the kNN-LM ({on}) with the "
           f"first k of its k = {ks[-1]} cached FAISS neighbours, each k with its own τ tuned on valid over "
           f"{t['start']:g} … {t['stop']:g} step {t['step']:g} (extended by its own span while τ* is its last value) "
           f"and λ re-tuned over {cfg['knn']['lambda_steps']} values. Khandelwal et al.: perplexity improves "
           f"monotonically with k, and k = {SMALL_K} is already enough for a new state of the art (WikiText-103). "
           f"'share of {top}'s gain': (PPL_base − PPL_k) / (PPL_base − PPL_{top}). "
           f"{ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Perplexity by the number of neighbours k", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=on), job.path("cmp_csv"))
    _figure(job, ci["test"], ks, on)
    test = df[(df["split"] == "test") & (df["model"] == "kNN-LM")]
    return {"metrics": {f"test_ppl_word_k{int(r['k'])}": r["PPL (word)"] for _, r in test.iterrows()},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def _figure(job: Job, ci: dict, ks: list[int], on: str) -> None:
    """Test perplexity per word against k (log scale) with its 95 % CI (`ci`: compare()'s result on test), the base
    LM's as a line (Figure 4 of Khandelwal et al. 2020)."""
    import matplotlib.pyplot as plt

    ppl, err = interval_bars([ci["ppl"][k_label(k)] for k in ks])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(ks, ppl, yerr=err, marker="o", capsize=3, label="kNN-LM")
    ax.axhline(ci["ppl"]["base"]["value"], color="grey", ls="--", label="base LM")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("neighbours k (each with its τ*, λ* tuned on valid)")
    ax.set_ylabel("test perplexity per word")
    ax.set_title(f"{job.cfg['name']}: perplexity by k ({on})", fontsize=9)
    ax.legend()
    save_figure(fig, [job.path("png"), job.path("pdf")])
    plt.close(fig)
