"""Table 1 (Xu et al. 2023, Sec. 3): the base LM and kNN-LMs with att/ffn keys and L2/IP, FAISS mask + FAISS
score, on all of valid and test; λ tuned on valid.

Jobs: score (one kNN-LM: p_kNN from the full store's neighbour cache, Eq. 5), table1.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from ..job import Job
from ..io import ArtifactError, open_npy, read_checked_json, read_json, save_npy, write_json
from ..scoring.results import METRIC_NAME, SPLITS, base_summary, evaluate, result_row
from .common import (lm_training_label, by_split, documents_label, lm_log_probs, open_datastore, open_split,
                     split_documents, words_per_split)

log = logging.getLogger(__name__)


def score(job: Job) -> dict:
    """One kNN-LM (key, metric): log p_kNN per token at the config τ, λ tuned on valid, perplexities per split; the
    τ sweep (knnlm.scoring.interpolation.sweep_temperature: float32 denominators, ~1e-6 relative to the float64
    knn_log_prob) gives every τ of valid, the config τ included, from one pass over its neighbour cache, and test's
    at the config τ and τ* only.

    Writes the score JSON (an evaluate() result with 'lm' and 'target_absent_frac' per split) and the
    per-token log p_kNN of valid and test (float32). Raises ArtifactError if the neighbours were searched in
    another datastore.
    """
    from ..config import extend_while_on_edge, tau_edge, temperatures
    from ..scoring.interpolation import lambda_grid, summarize, sweep_temperature_from_cache, tune_temperature

    _, vals, dman = open_datastore(job, with_keys=False)
    key, metric, tau = job.wildcards["key"], job.wildcards["metric"], job.cfg["knn"]["temperature"]
    taus = temperatures(job.cfg)
    lp_lm, lp_knn, caches = {}, {}, {}
    nb = {name: by_split(job, name) for name in ("nb_ids", "nb_dists", "nb_meta")}
    for split in SPLITS:
        meta = read_json(nb["nb_meta"][split])
        if meta["N"] != dman["N"] or meta["checkpoint_sha256"] != dman["checkpoint_sha256"]:
            raise ArtifactError(f"{nb['nb_meta'][split]}: neighbours were searched in another datastore than "
                                f"{job.path('manifest')}")
        q = open_split(job, split, checkpoint_sha256=dman["checkpoint_sha256"])
        t, k = q["manifest"]["T"], meta["k"]
        caches[split] = (open_npy(nb["nb_ids"][split], (t, k), np.int32),
                         open_npy(nb["nb_dists"][split], (t, k), np.float32), q["targets"])
        lp_lm[split] = np.asarray(q["lm_logprobs"], dtype=np.float64)

    def sweep_of(split, grid):
        ids, dists, targets = caches[split]
        return sweep_temperature_from_cache(ids, dists, vals, targets, metric, grid)

    # valid: every τ of the grid and the config τ in one pass over the cache (the config τ read off the sweep when
    # the grid holds it)
    sweep = sweep_of("valid", taus if tau in taus else taus + [tau])
    lp_knn["valid"] = sweep[taus.index(tau) if tau in taus else -1]
    sweep = sweep[:len(taus)]

    # τ tuned on valid (Xu et al. 2023, Sec. 5: tuning τ matters), λ re-tuned at that τ; a τ* on the grid's last
    # value extends the grid (temperature.max_extensions)
    def add(more):
        nonlocal sweep
        log.info("%s/%s: τ* is the grid's last value; extending the grid to %g", key, metric, more[-1])
        sweep = np.concatenate([sweep, sweep_of("valid", more)])

    taus, i = extend_while_on_edge(job.cfg, taus, lambda grid: tune_temperature(
        lp_lm["valid"], sweep, grid, job.cfg["temperature"]["lambda_steps"]), add)
    # test: the config τ and τ* only (test measures; nothing is chosen on it)
    at_test = sweep_of("test", [tau, taus[i]])
    lp_knn["test"], lp_tuned = at_test[0], {"valid": sweep[i], "test": at_test[1]}
    for split, out in zip(SPLITS, job.paths("knn")):
        save_npy(out, lp_knn[split].astype(np.float32))
    words = words_per_split(job)
    ev = evaluate(lp_lm, lp_knn, words, job.cfg["knn"]["lambda_steps"])
    tuned = evaluate(lp_lm, lp_tuned, words, job.cfg["knn"]["lambda_steps"])
    tuned.update(temperature=taus[i], tau_grid_stop=taus[-1], tau_edge=tau_edge(taus, i, job.cfg))
    for split, out in zip(SPLITS, job.paths("knn_tuned")):
        save_npy(out, lp_tuned[split].astype(np.float32))
    metrics = {"lambda": ev["lambda"], "tuned_temperature": taus[i], "tuned_lambda": tuned["lambda"],
               **{f"{s}_tuned_interp_ppl_word": tuned[s]["interp"]["ppl_word"] for s in SPLITS}}
    for split in SPLITS:
        ev[split]["lm"] = summarize(lp_lm[split], words[split])
        ev[split]["target_absent_frac"] = float(np.mean(np.isneginf(lp_knn[split])))
        for part in ("lm", "knn", "interp", "oracle"):
            for unit in ("ppl_word", "ppl_token"):
                metrics[f"{split}_{part}_{unit}"] = ev[split][part][unit]
        metrics[f"{split}_target_absent_frac"] = ev[split]["target_absent_frac"]
    grid = lambda_grid(job.cfg["knn"]["lambda_steps"])
    out = {"key_type": key, "metric": metric, "temperature": tau, "k": job.cfg["knn"]["k"], "lambda_grid": grid.tolist(),
           "datastore": dman.get("corpus", "train split"), **ev, "tuned": tuned}
    write_json(job.path("out"), out)
    log.info("%s/%s: λ=%.2f test interp ppl/word %.3f (base %.3f)", key, metric, ev["lambda"],
             ev["test"]["interp"]["ppl_word"], ev["test"]["lm"]["ppl_word"])
    return {"metrics": metrics, "artifacts": [job.path("out")],
            "step_metrics": {"valid_nll_vs_lambda_x100": [(int(round(l * 100)), v) for l, v in
                                                          zip(grid, ev["valid_nll_per_lambda"]) if np.isfinite(v)]}}


def table1(job: Job) -> dict:
    """Table 1 from the score JSONs and the base LM's log-probs (CSV + Markdown), with 95 % CIs from a paired
    interval over documents (knnlm.statistics.intervals, config 'stats.interval'), and the table of the paper's
    comparisons (kNN-LM vs base, att vs ffn, L2 vs IP): relative difference of per-word perplexity with its CI and verdict."""
    import pandas as pd

    from ..scoring.interpolation import interpolate
    from ..statistics.captions import ci_caption, comparison_rows, flag_edges, fmt_ci
    from ..statistics.intervals import compare, per_document
    from ..report.tables import write_comparisons, write_table

    from .common import stats_options

    cfg, st = job.cfg, stats_options(job)
    lp_lm = lm_log_probs(job)
    base = base_summary(lp_lm, words_per_split(job))
    scores = [read_checked_json(p, "score") for p in job.paths("scores")]
    plain = [f"{s['key_type']}/{METRIC_NAME[s['metric']]}" for s in scores]
    tuned = [f"{n} τ*" for n in plain]  # τ tuned on valid
    names = ["base"] + plain + tuned
    pairs = [(n, "base") for n in plain + tuned] + list(zip(tuned, plain))
    for group in (plain, tuned):  # att vs ffn per metric, IP vs L2 per key type
        pairs += [(a, b) for a in group for b in group if a < b and (a[:3] == b[:3] or a[3:] == b[3:])]
        # Sec. 3: ffn + IP, the parametric model's own input and metric, is the worst: against every other setting
        own = next((n for n in group if n.startswith("ffn/IP")), None)
        pairs += [(own, b) for b in group if own and b != own and (own, b) not in pairs and (b, own) not in pairs]
    # finding 1 as a size (Sec. 3: the att keys are "crucial"): the share of att keys' gain that ffn keys keep
    shares = [(f"ffn{a[3:]}", a) for group in (plain, tuned) for a in group
              if a.startswith("att/") and f"ffn{a[3:]}" in group]
    ci, comparisons = {}, []
    for split in SPLITS:
        doc, doc_words = split_documents(job, split)
        n_docs = len(doc_words)
        lps = [lp_lm[split]]
        lps += [interpolate(lp_lm[split], np.load(p).astype(np.float64), s["lambda"])
                for s, p in zip(scores, job.paths(f"knn_{split}"))]
        lps += [interpolate(lp_lm[split], np.load(p).astype(np.float64), s["tuned"]["lambda"])
                for s, p in zip(scores, job.paths(f"tuned_{split}"))]
        doc_nll = per_document(-np.stack(lps), doc, n_docs)
        ci[split] = compare(doc_nll, doc_words, names, pairs, st, shares=shares)
        comparisons += comparison_rows(ci[split], split=split)  # the shares of a gain too
    flag_edges(comparisons, {nt: f"{nt}: τ* = {s['tuned']['temperature']:g} on the grid's {s['tuned']['tau_edge']} edge"
                             for s, nt in zip(scores, tuned) if s["tuned"].get("tau_edge")})
    rows = []
    for split in ("test", "valid"):
        c = ci[split]
        rows.append(result_row(split, {"model": "Base LM", "h_ds": "-", "⊗": "-", "LM corpus → datastore": "-",
                                       "τ": None}, base=base)
                    | {"95% CI (word)": fmt_ci(c["ppl"]["base"]), "vs base (95% CI)": "-"})
        for s, n, nt in zip(scores, plain, tuned):
            lab = {"h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]],
                   "LM corpus → datastore": f"train split → {s.get('datastore', 'train split')}"}
            rows.append(result_row(split, {"model": "kNN-LM", **lab, "τ": s["temperature"]}, s)
                        | {"95% CI (word)": fmt_ci(c["ppl"][n]), "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base"], pct=True)})
            rows.append(result_row(split, {"model": "kNN-LM (τ tuned)", **lab, "τ": s["tuned"]["temperature"]}, s["tuned"])
                        | {"95% CI (word)": fmt_ci(c["ppl"][nt]), "vs base (95% CI)": fmt_ci(c["diff"][f"{nt} vs base"], pct=True),
                           "τ* on grid edge": s["tuned"].get("tau_edge", "")})
    df = pd.DataFrame(rows)
    df["τ* on grid edge"] = df["τ* on grid edge"].fillna("")  # set on the τ-tuned rows only
    t = cfg["temperature"]
    boot = (f"'τ tuned': τ chosen on valid over {t['start']:g} … {t['stop']:g} step {t['step']:g}, the grid extended "
            f"by its own span while τ* is its last value (at most {t['max_extensions']} times; a τ* still on an edge is "
            f"marked in 'τ* on grid edge') (with λ re-tuned; "
            f"comparisons name it τ*). {ci_caption(st, documents_label(job))}; the CI of a kNN-LM row is of its interp "
            f"PPL (word), 'vs base' its relative difference to the base LM on the same documents.")
    cap = (f"Table 1 ({cfg['name']}; Xu et al. 2023, Sec. 3): perplexity of the base LM and of kNN-LMs with att/ffn keys "
           f"and L2/IP. 'PPL' of a kNN-LM row is kNN-only (inf when a target is absent from the k={cfg['knn']['k']} FAISS "
           f"neighbours); λ tuned on valid over {cfg['knn']['lambda_steps']} values in [0, 1], τ = "
           f"{cfg['knn']['temperature']}; FAISS mask + FAISS score (IVFPQ). Per word = total NLL / (whitespace words "
           f"+ one <eos> per line). 'LM corpus → datastore': the LM's training text and the text of the datastore (config "
           f"'datastore.data', Khandelwal et al. 2020, Sec. 4.3: another corpus, or the train split plus others). "
           f"{boot} {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Table 1: kNN-LM variants", cap, note=lm_training_label(job))
    write_comparisons(comparisons, job.path("cmp_csv"), job.path("cmp_md"), "Table 1 comparisons with 95% CIs",
                      f"Comparisons of Table 1 ({cfg['name']}; interpolated PPL, the base LM's plain PPL)", boot, note=lm_training_label(job))
    m = {}
    for _, r in df.iterrows():
        tag = "base" if r["model"] == "Base LM" else f"{r['h_ds']}_{r['⊗']}" + ("_tau_tuned" if "tuned" in r["model"] else "")
        m[f"{r['split']}_{tag}_ppl_word"] = r["PPL (word)"]
        if r["model"] != "Base LM":
            m[f"{r['split']}_{tag}_interp_ppl_word"] = r["interp PPL (word)"]
    for c in comparisons:
        name = re.sub(r"[^A-Za-z0-9]+", "_", c["comparison"].replace("τ*", "tau_tuned"))
        m[f"{c['split']}_{name}_reldiff"] = c["relative difference"]
    print(Path(job.path("md")).read_text())
    return {"metrics": m, "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv", "cmp_md")]}
