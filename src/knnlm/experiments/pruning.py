"""A smaller datastore (He et al. 2021, "Efficient Nearest Neighbor Language Models", Sec. 4.2, Table 3): greedy
merging of entries with their near neighbours of the same val (knnlm.scoring.pruning.greedy_merge; each kept entry
counts the entries it absorbed, and its logit gains log s_i) against a seeded uniform random subset of the same
size, at each pruned share of config 'pruning.ratios', and against the full datastore.

Each entry's own neighbours come from one FAISS search of every key in the full store's IVFPQ index (job
neighbours: config 'pruning.neighbours' per entry at 'pruning.nprobe' lists). The pruned datastores are scored from
the full store's cached FAISS search (Table 1's kNN-LM of Table 3's pair, FAISS mask and score): a query's neighbours
in a pruned datastore are its cached neighbours that the datastore keeps, in the same order, which is what a search
of the pruned entries in the same index would return first; each pruned datastore thus has at most knn.k of them per
query. Every variant has its own τ (grid extended at its upper edge) and λ tuned on valid. He et al.: greedy merging
beats random pruning at equal size, and pruning 40 % costs little (+0.2 perplexity on WikiText-103).

Jobs: neighbours (the entries' own neighbours), table (table and figure 'pruning', comparisons CSV
'pruning_comparisons' read by the findings).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from ..config import extend_while_on_edge, tau_edge, temperatures
from ..io import ArtifactError, iter_chunks, machine, open_npy, read_checked_json, read_json, write_json
from ..job import Job
from ..report.figures import interval_bars, save_figure
from ..report.tables import write_csv, write_table
from ..scoring.interpolation import interpolate, lambda_grid, scores_from_distances, summarize, tune_lambda, \
    tune_temperature
from ..scoring.pruning import greedy_merge, random_counts, weighted_sweeps
from ..statistics.captions import ci_caption, comparison_rows, fmt_ci
from ..statistics.intervals import compare, per_document
from .common import SPLITS, by_split, documents_label, lm_log_probs, lm_training_label, open_datastore, \
    scoped_documents, split_documents, stats_options

log = logging.getLogger(__name__)
FULL = "kNN-LM, full datastore"
PRUNE_MARGIN = 0.02  # "costs little": the full datastore gains less than this over the pruned one (He et al.: ~+1 %)
CHUNK = 16384


def greedy_label(r: float) -> str:
    return f"greedy merging, {100 * r:g} % pruned"


def random_label(r: float) -> str:
    return f"random subset, {100 * r:g} % pruned"


def neighbours(job: Job) -> dict:
    """Every datastore entry's FAISS neighbours in the full store's index: ids [N, K + 1] int32 (its own id among
    them, as the reference code retrieves K + 1), distances, and a meta (K, nprobe, seconds, the checkpoint)."""
    from ..search.index import search as faiss_search

    keys, _, man = open_datastore(job)
    idx_meta = read_json(job.path("index_meta"))
    if idx_meta["datastore_checkpoint_sha256"] != man["checkpoint_sha256"] or idx_meta["N"] != man["N"]:
        raise ArtifactError(f"{job.path('index')} was built from another datastore than {job.path('manifest')}")
    p = job.cfg["pruning"]
    t0 = time.time()
    stats = faiss_search(job.path("index"), keys, p["neighbours"] + 1, p["nprobe"], job.path("ids"),
                         job.path("dists"), job.cfg["index"]["search_chunk"], job.threads, id_limit=man["N"])
    stats.update(seconds=time.time() - t0, N=man["N"], checkpoint_sha256=man["checkpoint_sha256"],
                 machine=machine(job.threads, stats["device"]))
    write_json(job.path("meta"), stats)
    return {"metrics": {"N": man["N"], "seconds": stats["seconds"], "missing_neighbours": stats["missing_neighbours"]}}


def _sweeps(ids, dists, targets, vals, metric, weights: dict, taus: dict, rows: np.ndarray | None = None) -> dict:
    """{variant: [len(taus[variant]), t] log p_kNN(target)} from one read of a neighbour cache (ids, dists [T, k];
    targets [t] of the rows scored, vals [N] of the datastore), each variant's per-entry counts `weights[variant]`
    ([N] int, 0 = not in its datastore). rows: [t] sorted int64 rows of the cache to score (None: all T). Variants
    with the same temperatures share each pass over the neighbours (weighted_sweeps)."""
    t = ids.shape[0] if rows is None else len(rows)
    out = {v: np.empty((len(taus[v]), t)) for v in weights}
    groups = {}
    for v in weights:
        groups.setdefault(tuple(taus[v]), []).append(v)
    for s, e in iter_chunks(t, CHUNK, ids, dists):
        r = slice(s, e) if rows is None else rows[s:e]
        i = np.asarray(ids[r]).astype(np.int64)
        ok = i >= 0
        safe = np.where(ok, i, 0)
        hit = (vals[safe] == targets[s:e, None]) & ok
        sc = scores_from_distances(np.asarray(dists[r]), metric)
        for tg, vs in groups.items():
            res = weighted_sweeps(sc, hit, np.stack([np.where(ok, weights[v][safe], 0) for v in vs]), tg)
            for v, lp in zip(vs, res):
                out[v][:, s:e] = lp
    return out


def table(job: Job) -> dict:
    """Greedy merging and an equal-size random subset at each pruned share, and the full datastore, each with τ and λ
    tuned on valid; on test each vs the base LM and the full datastore, and greedy vs random at each share (paired
    over documents); table, figure and comparisons."""
    cfg, st = job.cfg, stats_options(job)
    p = cfg["pruning"]
    _, vals, man = open_datastore(job, with_keys=False)
    vals = np.asarray(vals)
    n = len(vals)
    meta = read_json(job.path("dstore_nb_meta"))
    if meta["checkpoint_sha256"] != man["checkpoint_sha256"] or meta["N"] != n:
        raise ArtifactError(f"{job.path('dstore_nb_meta')}: neighbours of another datastore (N={meta['N']}) than "
                            f"{job.path('manifest')} (N={n}): rerun datastore_neighbours")
    nb = open_npy(job.path("dstore_nb_ids"), (n, meta["k"]), np.int32)
    weights, achieved = {FULL: np.ones(n, dtype=np.int32)}, {}
    alias = {}  # a share the merging cannot reach: the same datastores as the share before it, scored once
    for r, before in zip(sorted(p["ratios"]), [None] + sorted(p["ratios"])):
        g = greedy_merge(nb, vals, int(round(r * n)), p["seed"])
        removed = int((g == 0).sum())
        achieved[r] = removed / n
        if before is not None and achieved[before] == achieved[r]:
            for label in (greedy_label, random_label):
                alias[label(r)] = alias.get(label(before), label(before))
                weights[label(r)] = weights[alias[label(r)]]
        else:
            weights[greedy_label(r)], weights[random_label(r)] = g, random_counts(n, removed, p["seed"])
        log.info("greedy merging %g %%: %d of %d entries absorbed", 100 * r, removed, n)
    scored_variants = {v: w for v, w in weights.items() if v not in alias}
    sc = read_checked_json(job.path("score"), "score")
    metric, key = sc["metric"], sc["key_type"]
    caches = {}
    for split in SPLITS:
        m = read_json(by_split(job, "nb_meta")[split])
        caches[split] = (open_npy(by_split(job, "nb_ids")[split], (m["T"], m["k"]), np.int32),
                         open_npy(by_split(job, "nb_dists")[split], (m["T"], m["k"]), np.float32),
                         np.load(by_split(job, "targets")[split]).astype(np.int64))
    lp_lm = lm_log_probs(job)
    # valid: the tuning sample when the run has one (config 'retrieval.tuning_documents': whole valid documents, as
    # every store scored on every token is tuned); test: every token
    scored = {"valid": np.load(job.path("tuning_sample")).astype(np.int64) if job.input.get("tuning_sample") else None,
            "test": None}
    for split, sel in scored.items():
        if sel is not None:
            caches[split] = (*caches[split][:2], caches[split][2][sel])
            lp_lm[split] = lp_lm[split][sel]
    base_taus = temperatures(cfg)
    grid = lambda_grid(cfg["knn"]["lambda_steps"])
    sweeps = _sweeps(*caches["valid"], vals, metric, scored_variants, {v: base_taus for v in scored_variants},
                     scored["valid"])
    tuned = {}
    for v in scored_variants:
        def add(more, v=v):
            sweeps[v] = np.concatenate([sweeps[v], _sweeps(*caches["valid"], vals, metric, {v: weights[v]}, {v: more},
                                                           scored["valid"])[v]])

        taus, i = extend_while_on_edge(cfg, list(base_taus), lambda g, v=v: tune_temperature(
            lp_lm["valid"], sweeps[v][:len(g)], g, cfg["temperature"]["lambda_steps"]), add)
        lam, _ = tune_lambda(lp_lm["valid"], sweeps[v][i], grid)
        tuned[v] = {"temperature": taus[i], "lambda": lam, "tau_edge": tau_edge(taus, i, cfg), "valid": sweeps[v][i]}
    at_test = _sweeps(*caches["test"], vals, metric, scored_variants,
                      {v: [tuned[v]["temperature"]] for v in scored_variants})
    tuned.update({v: tuned[u] for v, u in alias.items()})
    lps = {v: {"valid": interpolate(lp_lm["valid"], tuned[v]["valid"], tuned[v]["lambda"]),
               "test": interpolate(lp_lm["test"], at_test[alias.get(v, v)][0], tuned[v]["lambda"])} for v in weights}
    ratios = sorted(p["ratios"])
    names = ["base", *weights]
    pairs = ([(v, "base") for v in weights] + [(v, FULL) for v in list(weights)[1:]]
             + [(FULL, greedy_label(r)) for r in ratios] + [(greedy_label(r), random_label(r)) for r in ratios])
    # a share greedy merging cannot reach with these neighbours (every entry visited): its rows are not tested
    short = {r: (f"greedy merging with {meta['k'] - 1} neighbours per entry absorbs at most {100 * achieved[r]:.1f} % "
                 f"of the entries, under the {100 * r:g} % asked") for r in ratios if achieved[r] < r - 0.005}
    premise_of = {f"{a} vs {b}": short[r] for r in short for a, b in ((FULL, greedy_label(r)),
                                                                        (greedy_label(r), random_label(r)))}
    rows, cmp, ci = [], [], {}
    for split in SPLITS:
        if scored[split] is None:
            doc, doc_words = split_documents(job, split)
        else:  # the documents of the scored tokens, renumbered
            dd = np.load(by_split(job, "documents")[split])
            doc, doc_words, _ = scoped_documents(dd["doc"], dd["words"], scored[split])
        words = int(doc_words.sum())
        nll = per_document(-np.stack([lp_lm[split]] + [lps[v][split] for v in weights]), doc, len(doc_words))
        c = ci[split] = compare(nll, doc_words, names, pairs, st)
        cmp += [dict(row, premise=premise_of.get(row["comparison"], "")) for row in comparison_rows(c, split=split)]
        for v in names:
            w = weights.get(v)
            summ = summarize(lp_lm[split] if v == "base" else lps[v][split], words)
            rows.append({"split": split, "model": v, "entries": f"{int((w > 0).sum()):,}" if w is not None else "-",
                         "pruned": f"{100 * (1 - (w > 0).mean()):.1f} %" if w is not None else "-",
                         "largest count": f"{int(w.max()):,}" if w is not None else "-",
                         "τ*": tuned[v]["temperature"] if w is not None else None,
                         "λ*": tuned[v]["lambda"] if w is not None else None,
                         "τ* on grid edge": tuned[v]["tau_edge"] if w is not None else "",
                         "PPL (word)": summ["ppl_word"], "PPL (token)": summ["ppl_token"],
                         "95% CI (word)": fmt_ci(c["ppl"][v]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{v} vs base"], pct=True) if v != "base" else "-",
                         f"vs {FULL} (95% CI)": fmt_ci(c["diff"][f"{v} vs {FULL}"], pct=True)
                         if f"{v} vs {FULL}" in c["diff"] else "-",
                         "documents": len(doc_words)})
    on = (f"{key}/{metric.upper()}, FAISS mask and score of the full store restricted to the entries each datastore "
          f"keeps; entries' own neighbours: {meta['k'] - 1} each at nprobe {meta['nprobe']}; greedy merging absorbed "
          + ", ".join(f"{100 * achieved[r]:.1f} % (asked {100 * r:g} %)" for r in ratios))
    df = pd.DataFrame(rows)
    t = cfg["temperature"]
    cap = (f"A smaller datastore ({cfg['name']}; He et al. 2021, Sec. 4.2, Table 3): greedy merging (their Algorithm "
           f"1: the entries in a seeded random order, each absorbing its retrieved neighbours of the same val that "
           f"have not merged yet; a kept entry's logit gains log of its count) against a seeded random subset of the "
           f"same size, and the full datastore, on {key}/{metric.upper()} keys. Each entry's neighbours: "
           f"{meta['k'] - 1} from one FAISS search of every key in the full store's index at nprobe {meta['nprobe']} "
           f"({meta['seconds']:.0f} s). A query's neighbours in a pruned datastore are its cached FAISS neighbours "
           f"(k = {cfg['knn']['k']}) that the datastore keeps, in order: what a search of the kept entries in the "
           f"same index returns first, at most k. A share that greedy merging cannot reach (every entry visited) keeps "
           f"its label, with the share reached in 'pruned' (and the random subset of that size); its comparisons are "
           f"not tested. Each row has its own τ (grid {t['start']:g} … {t['stop']:g} step "
           f"{t['step']:g}, extended while τ* is its last value) and λ tuned on valid. He et al. (WikiText-103): "
           f"greedy merging beats random pruning at equal size, and 40 % pruned costs +0.2 perplexity. "
           f"{ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Greedy merging vs a random subset of the datastore", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=on), job.path("cmp_csv"))
    _figure(job, ci["test"], ratios, achieved)
    test = df[df["split"] == "test"].set_index("model")["PPL (word)"]
    return {"metrics": {**{f"achieved_{int(100 * r)}": achieved[r] for r in ratios},
                        **{f"test_ppl_word_greedy_{int(100 * r)}": float(test[greedy_label(r)]) for r in ratios},
                        **{f"test_ppl_word_random_{int(100 * r)}": float(test[random_label(r)]) for r in ratios},
                        "test_ppl_word_full": float(test[FULL])},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def _figure(job: Job, ci: dict, ratios: list[float], achieved: dict) -> None:
    """Test perplexity per word against the share of entries pruned: greedy merging and the random subset with 95 %
    CIs, the full datastore and the base LM as lines (He et al. 2021, Table 3)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.array([100 * achieved[r] for r in ratios])
    for label, names, style in (("greedy merging", [greedy_label(r) for r in ratios], "o-"),
                                ("random subset", [random_label(r) for r in ratios], "s--")):
        ppl, err = interval_bars([ci["ppl"][n] for n in names])
        ax.errorbar(x, ppl, yerr=err, fmt=style, capsize=3, label=label)
    ax.axhline(ci["ppl"][FULL]["value"], color="C3", ls="-.", label=FULL)
    ax.axhline(ci["ppl"]["base"]["value"], color="grey", ls=":", label="base LM")
    ax.set_xlabel("entries pruned (%)")
    ax.set_ylabel("test perplexity per word")
    ax.set_title(f"{job.cfg['name']}: greedy merging vs random pruning", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, [job.path("png"), job.path("pdf")])
    plt.close(fig)
