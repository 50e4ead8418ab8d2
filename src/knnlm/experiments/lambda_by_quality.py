"""λ by retrieval quality (Drozdov et al. 2022, "You can't pick your neighbors, or can you?", Sec. 5): instead of
one λ for every token, a λ per bucket of a retrieval-quality feature of the token (the nearest neighbour's
distance; the n-gram overlap of its context with the top neighbour's), each tuned on valid and applied on test,
against the one global λ tuned on the same valid tokens. Both use the kNN-LM of Table 1 at its τ* (FAISS mask,
Table 3's pair on the full store). Drozdov et al. report test perplexity nearly 4 % better on WikiText-103.

Job: table (table 'lambda_by_quality' and its comparisons CSV, read by the findings).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..job import Job
from ..scoring.quality import bucket_lambdas, bucket_of, interpolate_per_token, quantile_edges
from ..scoring.interpolation import interpolate, lambda_grid, summarize
from ..statistics.intervals import compare, per_document
from ..statistics.captions import comparison_rows, ci_caption, fmt_ci
from ..report.tables import write_csv, write_table
from .common import SPLITS, documents_label, lm_training_label, stats_options
from .token_gains import FEATURES, OVERLAP_EDGES, tuned_knn_lm

QUALITY = ("nn_distance", "ngram_overlap")  # the retrieval-quality features of Drozdov et al.


def edges_of(name: str, valid_values: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket edges of feature `name`: equal-count quantiles of its valid values (so test never sets them), or
    the fixed overlap buckets."""
    return OVERLAP_EDGES if FEATURES[name][1] == "overlap" else quantile_edges(valid_values, buckets)


def table(job: Job) -> dict:
    """Per feature of QUALITY: the λ of each bucket (tuned on valid), test perplexity with λ by bucket vs one global
    λ, paired over test documents (knnlm.statistics.intervals.compare)."""
    cfg, st = job.cfg, stats_options(job)
    steps = cfg["knn"]["lambda_steps"]
    grid = lambda_grid(steps)
    sc, lp_lm, lp_knn, feats, docs = tuned_knn_lm(job)
    lam = sc["tuned"]["lambda"]
    words = {s: int(docs[s][1].sum()) for s in SPLITS}
    lps = {"global λ": {s: interpolate(lp_lm[s], lp_knn[s], lam) for s in SPLITS}}
    rows, lam_rows, cmp = [], [], {}
    for name in QUALITY:
        edges = edges_of(name, feats["valid"][name], cfg["quality"]["lambda_buckets"])
        b = {s: bucket_of(feats[s][name], edges) for s in SPLITS}
        n_b = len(edges) + 1
        lams = bucket_lambdas(lp_lm["valid"], lp_knn["valid"], b["valid"], n_b, grid, lam)
        label = f"λ by {FEATURES[name][0]}"
        lps[label] = {s: interpolate_per_token(lp_lm[s], lp_knn[s], lams[b[s]]) for s in SPLITS}
        lo = np.concatenate([[-np.inf], edges])
        hi = np.concatenate([edges, [np.inf]])
        for i in range(n_b):
            lam_rows.append({"split": "valid", "model": label, "bucket": f"[{lo[i]:.4g}, {hi[i]:.4g})", "λ": lams[i],
                             "valid tokens": int((b["valid"] == i).sum()), "test tokens": int((b["test"] == i).sum())})
    names = ["base"] + list(lps)
    pairs = [(n, "global λ") for n in lps if n != "global λ"]
    for split in SPLITS:
        doc, doc_words = docs[split]
        nll = per_document(-np.stack([lp_lm[split]] + [lps[n][split] for n in lps]), doc, len(doc_words))
        c = compare(nll, doc_words, names, pairs, st)
        for n in names:
            summ = summarize(lp_lm[split] if n == "base" else lps[n][split], words[split])
            rows.append({"split": split, "model": n, "PPL (word)": summ["ppl_word"], "PPL (token)": summ["ppl_token"],
                         "95% CI (word)": fmt_ci(c["ppl"][n]),
                         "vs global λ (95% CI)": fmt_ci(c["diff"][f"{n} vs global λ"], pct=True) if (n, "global λ") in pairs
                             else "-",
                         "documents": len(doc_words)})
        cmp[split] = comparison_rows(c, split=split)
    key = f"{sc['key_type']}/{sc['metric'].upper()}, full store, FAISS mask at τ* = {sc['tuned']['temperature']:g}"
    cap = (f"λ by retrieval quality ({cfg['name']}; Drozdov et al. 2022, Sec. 5): the kNN-LM ({key}) interpolated "
           f"with one global λ = {lam:g} (tuned on valid) or with a λ per bucket of a retrieval-quality feature (the "
           f"nearest FAISS neighbour's distance: {cfg['quality']['lambda_buckets']} equal-count buckets of its valid "
           f"values; the n-gram overlap of the context with the top neighbour's: 0, 1, 2, 3, 4-7, 8-15, 16+ tokens), "
           f"each bucket's λ tuned on valid over {steps} values and applied on test. On valid the bucket λs are "
           f"fitted (optimistic); test is the comparison. Drozdov et al.: nearly 4 % better test perplexity on "
           f"WikiText-103. {ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    df = pd.concat([pd.DataFrame(rows), pd.DataFrame(lam_rows)], ignore_index=True)
    write_table(df, job.path("csv"), job.path("md"), "λ by retrieval quality vs one global λ", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp["test"] + cmp["valid"]).assign(on=f"{key}, all tokens"), job.path("cmp_csv"))
    test = {r["comparison"]: r for r in cmp["test"]}
    return {"metrics": {f"test_{k.split(' vs ')[0].replace(' ', '_')}_rel": v["relative difference"]
                        for k, v in test.items()}, "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}
