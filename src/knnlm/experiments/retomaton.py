"""Fewer searches (Alon et al. 2022, RetoMaton, Sec. 5.1, Figure 3): the kNN-LM's datastore read as an automaton
whose entries point to their successors (knnlm.scoring.retomaton.follow_pointers), a search made only when fewer than
a threshold of pointers survive, for each threshold of config 'retomaton.min_pointers', and with a search at
every token (the pointed-to entries joining the searched ones); against the kNN-LM of the same cache with a search at
every token, and against that kNN-LM skipping searches at random (the base LM alone where it skips) as often as
RetoMaton does. Every variant has its own τ and λ tuned on valid (τ's grid extended at its upper edge as Table 1's).

All scores are real scores (the FAISS neighbours' distances recomputed from the keys, rule real_score, and the
pointed-to entries' from the keys), on the store, keys and metric of Table 3's claims (the full store, every test
token where 'retrieval.table3_all_tokens'; valid: its tuning sample). Pointers start empty at each document (and at
each break of the scored tokens). The threshold that carries the verdicts is the one with the most saved searches on
valid whose valid perplexity is no higher than the kNN-LM's; the random-skipping baseline skips the share of
searches RetoMaton saved on valid. Alon et al. tie the savings to the share of validation 5-grams seen in the
datastore's text (21 % on WikiText-103), reported here for this run.

Job: table (table and figure 'retomaton', comparisons CSV 'retomaton_comparisons' read by the findings).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..config import extend_while_on_edge, tau_edge, temperatures
from ..io import iter_chunks, open_npy, read_json
from ..job import Job
from ..report.figures import interval_bars, save_figure
from ..report.tables import write_csv, write_table
from ..scoring.interpolation import (interpolate, interpolated_nll, lambda_grid, neighbour_hits, scores_from_distances,
                                     summarize, sweep_temperature, tune_lambda, tune_temperature)
from ..scoring.retomaton import follow_pointers, saved_searches, seen_ngram_share
from ..statistics.captions import ci_caption, comparison_rows, fmt_ci
from ..statistics.intervals import compare, per_document
from .common import SPLITS, by_split, documents_label, lm_training_label, open_datastore, open_split, scoped_documents, \
    stats_options
from .retrieval import _rows_of, scope_indices

log = logging.getLogger(__name__)
KNN = "kNN-LM (real score)"
EVERY = "RetoMaton, a search at every token"
BEST = "RetoMaton (threshold chosen on valid)"
RANDOM = "random skipping at RetoMaton's FoSS"
PAPER_SEEN_5GRAMS = 0.21  # WikiText-103: the share of validation 5-grams seen in the training set (Alon et al. 2022)
CHUNK = 32768  # scored tokens read per pass over the caches (whole segments: pointers never cross a chunk)


def threshold_label(m: int) -> str:
    return f"RetoMaton, min {m} pointers"


def random_label(m: int) -> str:
    return f"random skipping at the FoSS of min {m}"


def _segments(doc: np.ndarray, sc: np.ndarray) -> np.ndarray:
    """[t] non-decreasing segment ids of the scored tokens: a new segment where the document changes or the scored
    token indices `sc` skip (pointers follow consecutive tokens only)."""
    brk = np.r_[True, (doc[1:] != doc[:-1]) | (sc[1:] != sc[:-1] + 1)] if len(sc) else np.zeros(0, bool)
    return np.cumsum(brk) - 1


def _chunks(seg: np.ndarray, size: int):
    """(start, stop) of consecutive runs of whole segments of about `size` tokens (one segment may exceed it)."""
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]]) if len(seg) else np.zeros(0, int)
    a = 0
    for s in list(starts[1:]) + [len(seg)]:
        if s - a >= size or s == len(seg):
            yield a, int(s)
            a = int(s)


class _Split:
    """The scored tokens of one split and their caches (memmaps, read a chunk of whole segments at a time)."""

    def __init__(self, job: Job, split: str, man: dict):
        q = open_split(job, split, with_queries=True, checkpoint_sha256=man["checkpoint_sha256"])
        self.sc = scope_indices(job, split, len(q["targets"]))
        self.queries, self.targets = q["queries"], np.asarray(q["targets"], dtype=np.int64)[self.sc]
        self.lp_lm = np.asarray(q["lm_logprobs"], dtype=np.float64)[self.sc]
        dd = np.load(by_split(job, "documents")[split])
        self.doc, self.doc_words, _ = scoped_documents(dd["doc"], dd["words"], self.sc)
        self.seg = _segments(dd["doc"][self.sc], self.sc)
        meta = read_json(by_split(job, "nb_meta")[split])
        self.rows = _rows_of(meta, self.sc, by_split(job, "nb_meta")[split])
        self.ids = open_npy(by_split(job, "nb_ids")[split], (meta["T"], meta["k"]), np.int32)
        rmeta = read_json(by_split(job, "real_meta")[split])
        if rmeta["T"] != len(self.sc) or rmeta["k"] != meta["k"]:
            raise ValueError(f"{by_split(job, 'real_meta')[split]}: real scores of {rmeta['T']} x {rmeta['k']}, the "
                             f"scored tokens and their neighbours are {len(self.sc)} x {meta['k']}: rerun real_score")
        self.real = open_npy(by_split(job, "real_dists")[split], (len(self.sc), meta["k"]), np.float32)

    def chunks(self):
        """(a, b, ids [b−a, k], real dists, queries [b−a, D] float32) of each chunk of whole segments."""
        for a, b in _chunks(self.seg, CHUNK):
            yield (a, b, np.asarray(self.ids[self.rows[a:b]]), np.asarray(self.real[a:b]),
                   np.asarray(self.queries[self.sc[a:b]], dtype=np.float32))


def _passes(data: _Split, keys, vals, metric: str, variants: dict, knn_taus, reto_taus: dict) -> tuple[dict, dict, dict]:
    """One read of a split's caches: the kNN-LM's log p_kNN at `knn_taus` (None: not computed) and each RetoMaton
    variant {name: min_pointers} at its τ list; returns ({name: [n_tau, t]}, {name: searched [t]}, {name: states [t]})."""
    t = len(data.sc)
    lp = {n: np.empty((len(reto_taus[n]), t)) for n in variants}
    if knn_taus is not None:
        lp[KNN] = np.empty((len(knn_taus), t))
    searched = {n: np.empty(t, bool) for n in variants}
    states = {n: np.empty(t, np.int32) for n in variants}
    for a, b, ids, dists, q in data.chunks():
        if knn_taus is not None:
            hit, valid = neighbour_hits(ids, vals, data.targets[a:b])
            lp[KNN][:, a:b] = sweep_temperature(scores_from_distances(dists, metric), hit, valid, knn_taus)
        for n, m in variants.items():
            lp[n][:, a:b], searched[n][a:b], states[n][a:b] = follow_pointers(
                ids, dists, q, keys, vals, data.targets[a:b], data.seg[a:b], metric, m, reto_taus[n])
    return lp, searched, states


def _skip_mask(t: int, share: float, seed: int) -> np.ndarray:
    """[t] bool: a seeded random share of the tokens whose search is skipped."""
    return np.random.default_rng(seed).random(t) < share


def table(job: Job) -> dict:
    """RetoMaton at each threshold and with a search at every token, the kNN-LM, and random skipping at each
    threshold's saved share, each tuned on valid; on test each vs the kNN-LM and the base LM, each threshold vs
    random skipping at its FoSS (paired over documents); table, figure and comparisons."""
    cfg, st = job.cfg, stats_options(job)
    r = cfg["retomaton"]
    metric, key = job.wildcards["metric"], job.wildcards["key"]
    keys, vals, man = open_datastore(job)
    vals = np.asarray(vals)
    k = read_json(by_split(job, "nb_meta")["valid"])["k"]
    thresholds = sorted(set(int(m) for m in r["min_pointers"]))
    variants = {threshold_label(m): m for m in thresholds}
    variants[EVERY] = k + 1  # more than the pointers ever kept: a search at every token
    data = {s: _Split(job, s, man) for s in SPLITS}
    base_taus = temperatures(cfg)
    grid = lambda_grid(cfg["knn"]["lambda_steps"])
    steps = cfg["temperature"]["lambda_steps"]
    v = data["valid"]
    lp_v, searched_v, states_v = _passes(v, keys, vals, metric, variants, base_taus, {n: base_taus for n in variants})
    tuned = {}
    for n in [KNN, *variants]:
        def add(more, n=n):
            extra = _passes(v, keys, vals, metric, {} if n == KNN else {n: variants[n]}, more if n == KNN else None,
                            {n: more})[0][n]
            lp_v[n] = np.concatenate([lp_v[n], extra])

        taus, i = extend_while_on_edge(cfg, list(base_taus), lambda g, n=n: tune_temperature(
            v.lp_lm, lp_v[n][:len(g)], g, steps), add)
        lam, nll = tune_lambda(v.lp_lm, lp_v[n][i], grid)
        tuned[n] = {"temperature": taus[i], "lambda": lam, "tau_edge": tau_edge(taus, i, cfg), "nll": float(nll.min()),
                    "valid": lp_v[n][i]}
    foss_v = {n: saved_searches(searched_v[n]) for n in variants}
    # random skipping: the kNN-LM at its τ*, the base LM alone on a seeded share of tokens, λ re-tuned on valid
    for m in thresholds:
        skip = _skip_mask(len(v.sc), foss_v[threshold_label(m)], r["seed"] + m)
        nll = interpolated_nll(v.lp_lm[~skip], tuned[KNN]["valid"][~skip], grid) - v.lp_lm[skip].sum()
        tuned[random_label(m)] = {"temperature": tuned[KNN]["temperature"], "lambda": float(grid[int(np.argmin(nll))]),
                                  "tau_edge": tuned[KNN]["tau_edge"], "nll": float(np.min(nll))}
    ok = [m for m in thresholds if foss_v[threshold_label(m)] > 0 and tuned[threshold_label(m)]["nll"] <= tuned[KNN]["nll"]]
    best = max(ok, key=lambda m: foss_v[threshold_label(m)]) if ok else min(
        thresholds, key=lambda m: foss_v[threshold_label(m)])
    # test: every variant at its τ* only
    te = data["test"]
    lp_t, searched_t, states_t = _passes(te, keys, vals, metric, variants, [tuned[KNN]["temperature"]],
                                         {n: [tuned[n]["temperature"]] for n in variants})
    lps, skipped = {"valid": {}, "test": {}}, {}
    for split, d, lp in (("valid", v, None), ("test", te, lp_t)):
        knn = tuned[KNN]["valid"] if lp is None else lp[KNN][0]
        lps[split][KNN] = interpolate(d.lp_lm, knn, tuned[KNN]["lambda"])
        for n in variants:
            lps[split][n] = interpolate(d.lp_lm, tuned[n]["valid"] if lp is None else lp[n][0], tuned[n]["lambda"])
        for m in thresholds:
            skip = _skip_mask(len(d.sc), foss_v[threshold_label(m)], r["seed"] + m + (0 if split == "valid" else 7919))
            skipped[split, random_label(m)] = float(skip.mean())
            lps[split][random_label(m)] = np.where(skip, d.lp_lm, interpolate(d.lp_lm, knn, tuned[random_label(m)]["lambda"]))
        lps[split][BEST] = lps[split][threshold_label(best)]
        lps[split][RANDOM] = lps[split][random_label(best)]
    foss_t = {n: saved_searches(searched_t[n]) for n in variants}
    names = ["base", KNN, EVERY] + [threshold_label(m) for m in thresholds] + [random_label(m) for m in thresholds] \
        + [BEST, RANDOM]
    pairs = ([(n, "base") for n in names[1:-2]] + [(n, KNN) for n in names[2:-2]]
             + [(threshold_label(m), random_label(m)) for m in thresholds] + [(KNN, BEST), (BEST, RANDOM),
                                                                             (EVERY, KNN), (BEST, KNN)])
    seen = seen_ngram_share(vals, np.asarray(open_split(job, "valid")["targets"]), 5)  # the whole valid split
    rows, cmp, ci = [], [], {}
    for split, d in (("valid", v), ("test", te)):
        nll = per_document(-np.stack([d.lp_lm] + [lps[split][n] for n in names[1:]]), d.doc, len(d.doc_words))
        c = ci[split] = compare(nll, d.doc_words, names, pairs, st)
        cmp += comparison_rows(c, split=split)
        words = int(d.doc_words.sum())
        for n in names[:-2]:
            m = variants.get(n)
            reto = n in variants
            foss = (foss_v if split == "valid" else foss_t)[n] if reto else (
                skipped[split, n] if (split, n) in skipped else 0.0)
            summ = summarize(d.lp_lm if n == "base" else lps[split][n], words)
            tn = tuned.get(n, {})
            rows.append({"split": split, "model": n,
                         "min pointers": ("every token" if n == EVERY else str(m)) if reto else "-",
                         "searches saved (FoSS)": foss, "states per token": float(
                             np.mean((states_v if split == "valid" else states_t)[n])) if reto else None,
                         "τ*": tn.get("temperature"), "λ*": tn.get("lambda"), "τ* on grid edge": tn.get("tau_edge", ""),
                         "PPL (word)": summ["ppl_word"], "PPL (token)": summ["ppl_token"],
                         "95% CI (word)": fmt_ci(c["ppl"][n]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base"], pct=True) if n != "base" else "-",
                         f"vs {KNN} (95% CI)": fmt_ci(c["diff"][f"{n} vs {KNN}"], pct=True)
                         if f"{n} vs {KNN}" in c["diff"] else "-",
                         "vs random skipping (95% CI)": fmt_ci(c["diff"][f"{n} vs {random_label(m)}"], pct=True)
                         if reto and n != EVERY else "-",
                         "chosen on valid": "yes" if n == threshold_label(best) else "",
                         "documents": len(d.doc_words)})
    store = job.wildcards.get("store", "full")
    on = (f"{key}/{metric.upper()}, {store} store, FAISS mask, real score; threshold min {best} pointers chosen on "
          f"valid: FoSS {100 * foss_v[threshold_label(best)]:.1f} % valid, {100 * foss_t[threshold_label(best)]:.1f} % "
          f"test; valid 5-grams seen in the datastore's text {100 * seen:.1f} % (WikiText-103: "
          f"{100 * PAPER_SEEN_5GRAMS:.0f} %)")
    df = pd.DataFrame(rows)
    t = cfg["temperature"]
    cap = (f"Fewer searches with RetoMaton ({cfg['name']}; Alon et al. 2022, Sec. 5.1, Figure 3): every datastore entry "
           f"points to the next one; the entries of the last step whose value came are followed, and a kNN search "
           f"(k = {k}) is made only when fewer than 'min pointers' survive (at most {k} pointers kept, the "
           f"closest; no clustering of entries); 'a search at every token': the pointed-to entries join every search. "
           f"All on {key}/{metric.upper()} keys, the {store} store, FAISS neighbours with real scores (distances "
           f"recomputed from the keys, as for the pointed-to entries); pointers start empty at each document. "
           f"'{KNN}': the same cache with a search at every token; 'random skipping': that kNN-LM with the base LM "
           f"alone on a seeded random share of tokens, the share RetoMaton saved on valid. Each row has its own τ "
           f"(grid {t['start']:g} … {t['stop']:g} step {t['step']:g}, extended while τ* is its last value) and λ "
           f"({cfg['knn']['lambda_steps']} values) tuned on valid. FoSS: the fraction of saved searches. The "
           f"threshold with the most saved searches on valid at a valid perplexity no higher than the kNN-LM's carries "
           f"the verdicts (min {best} pointers). Alon et al. (WikiText-103, where {100 * PAPER_SEEN_5GRAMS:.0f} % of "
           f"the validation 5-grams occur in the training set; here {100 * seen:.1f} %): RetoMaton saves up to 83 % "
           f"of the searches without hurting perplexity and lies below random skipping at every FoSS. "
           f"{ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "RetoMaton: perplexity vs the fraction of saved searches", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=on), job.path("cmp_csv"))
    _figure(job, df[df["split"] == "test"], ci["test"], thresholds, best)
    return {"metrics": {"best_min_pointers": best, "seen_5gram_share": seen,
                        **{f"foss_test_min{m}": foss_t[threshold_label(m)] for m in thresholds},
                        **{f"test_ppl_word_min{m}": float(df[(df["split"] == "test") & (
                            df["model"] == threshold_label(m))]["PPL (word)"].iloc[0]) for m in thresholds}},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def _figure(job: Job, test: pd.DataFrame, ci: dict, thresholds: list[int], best: int) -> None:
    """Test perplexity per word against the fraction of saved searches (Figure 3 of Alon et al. 2022): RetoMaton per
    threshold and random skipping at the same FoSS with their 95 % CIs; the kNN-LM and the base LM as lines."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, names, style in (("RetoMaton", [threshold_label(m) for m in thresholds] + [EVERY], "o-"),
                                ("random skipping", [random_label(m) for m in thresholds], "s--")):
        x = 100 * test.set_index("model").loc[names, "searches saved (FoSS)"].to_numpy(dtype=float)
        ppl, err = interval_bars([ci["ppl"][n] for n in names])
        order = np.argsort(x)
        ax.errorbar(x[order], ppl[order], yerr=[e[order] for e in err], fmt=style, capsize=3, label=label)
    ax.axhline(ci["ppl"][KNN]["value"], color="C3", ls="-.", label=KNN)
    ax.axhline(ci["ppl"]["base"]["value"], color="grey", ls=":", label="base LM")
    ax.set_xlabel("fraction of saved searches on test (%)")
    ax.set_ylabel("test perplexity per word")
    ax.set_title(f"{job.cfg['name']}: RetoMaton (chosen on valid: min {best} pointers)", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, [job.path("png"), job.path("pdf")])
    plt.close(fig)
