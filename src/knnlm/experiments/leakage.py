"""Leakage control (Borgeaud et al. 2022, RETRO, Sec. 2.6 and 4.4, Figure 6): does the kNN-LM only copy text it has
seen? The test stream is cut into chunks of CHUNK tokens; a chunk's overlap r(C) is the length of the longest run of
its tokens that also occurs in the datastore's token stream (its vals: the text retrieval searches), over the chunk's
length. Base LM and kNN-LM (Table 1's, Table 3's pair at its τ*) are compared on the tokens of the chunks whose
overlap is at most α, for each α of ALPHAS, paired over documents; and the per-token gain Δ = log p_kNN-LM − log p_LM
is regressed on r(C), with a delete-one-document jackknife interval. RETRO: retrieval still helps at low leakage, and
helps more the more a chunk overlaps the training data.

Job: table (table and figure 'leakage', comparisons CSV 'leakage_comparisons' read by the findings).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..io import read_checked_json
from ..job import Job
from ..report.figures import save_figure
from ..report.tables import write_csv, write_table
from ..scoring.interpolation import interpolate, summarize
from ..statistics.captions import DESIGN_N_EFF, ci_caption, comparison_rows, fmt_ci
from ..statistics.intervals import compare, effective_documents, jackknife_sums, per_document
from ..statistics.regression import regression_leverage, regression_sums, slope_of
from ..statistics.verdicts import verdict
from .common import by_split, documents_label, lm_training_label, open_datastore, split_documents, stats_options

log = logging.getLogger(__name__)
CHUNK = 64  # tokens per chunk (RETRO's)
ALPHAS = (0.125, 0.25, 0.5, 1.0)  # RETRO's overlap thresholds
SLOPE = "slope of Δ on chunk overlap"


def longest_overlap(chunks: np.ndarray, reference: np.ndarray, seed: int = 0) -> np.ndarray:
    """Per chunk (rows of `chunks` [C, m] int token ids), the length of its longest run of consecutive tokens that also
    occurs somewhere in `reference` [L] int (the datastore's stream): [C] int64 in 0..m. Found with hashed n-grams for
    n = 1, 2, ... (a run of n tokens occurring implies every shorter run of it does), stopping once no chunk has one;
    the n-gram hashes are rolled from the (n−1)-grams' (64-bit polynomial hashes with a seeded random odd base: a
    false match needs a 64-bit collision)."""
    chunks = np.asarray(chunks)
    c, m = chunks.shape
    base = np.uint64(int(np.random.default_rng(seed).integers(1 << 32, 1 << 62)) | 1)
    ref_tok = np.asarray(reference, dtype=np.uint64) + np.uint64(1)
    flat = chunks.reshape(-1).astype(np.uint64) + np.uint64(1)
    ref_h, h = np.zeros(len(ref_tok), dtype=np.uint64), np.zeros(len(flat), dtype=np.uint64)
    best = np.zeros(c, dtype=np.int64)
    alive = np.arange(len(flat))  # chunk positions whose (n−1)-gram occurs in the reference (all, for n = 1)
    for n in range(1, m + 1):
        alive = alive[(alive % m) + n <= m]  # n-grams inside one chunk
        with np.errstate(over="ignore"):  # hash of the n-gram at i: hash of the (n−1)-gram at i · base + token i+n−1
            ref_h = ref_h[:len(ref_tok) - n + 1] * base + ref_tok[n - 1:]
            h[alive] = h[alive] * base + flat[alive + n - 1]
        if not len(ref_h) or not len(alive):
            break
        mine = np.unique(h[alive])  # the few chunk n-grams still alive, looked up from the reference's side
        pos = np.minimum(np.searchsorted(mine, ref_h), len(mine) - 1)
        seen = np.zeros(len(mine), dtype=bool)
        seen[pos[mine[pos] == ref_h]] = True
        alive = alive[seen[np.searchsorted(mine, h[alive])]]
        if not len(alive):
            break
        best[np.unique(alive // m)] = n
    return best


def table(job: Job) -> dict:
    """Chunk overlaps of the test split with the datastore's stream, base vs kNN-LM on the chunks with overlap ≤ α
    (each α of ALPHAS), and the slope of the per-token gain on the overlap; table, figure and comparisons."""
    cfg, st = job.cfg, stats_options(job)
    _, vals, _ = open_datastore(job, with_keys=False)
    targets = np.load(job.path("targets"))
    lp_lm = np.load(job.path("lm_logprobs")).astype(np.float64)
    sc = read_checked_json(job.path("score"), "score")
    lam = sc["tuned"]["lambda"]
    lp = interpolate(lp_lm, np.load(job.path("knn_tuned")).astype(np.float64), lam)
    n_chunks = len(targets) // CHUNK
    chunks = targets[:n_chunks * CHUNK].reshape(n_chunks, CHUNK)
    lcs = longest_overlap(chunks, np.asarray(vals), seed=cfg["stats"]["seed"])
    r_tok = np.full(len(targets), np.nan)
    r_tok[:n_chunks * CHUNK] = np.repeat(lcs / CHUNK, CHUNK)
    doc, _ = split_documents(job, "test")
    words = np.load(by_split(job, "documents")["test"])["words"].astype(np.float64)
    rows, cmp = [], []
    for alpha in ALPHAS:
        keep = r_tok <= alpha + 1e-12
        ids, d = np.unique(doc[keep], return_inverse=True)
        if len(ids) < 2:
            rows.append({"split": "test", "chunks with overlap ≤": f"{alpha:.1%}",
                         "chunks": int((lcs / CHUNK <= alpha + 1e-12).sum()), "tokens": int(keep.sum()),
                         "documents": len(ids)})
            continue
        dw = np.bincount(d, weights=words[keep]).astype(np.int64)
        nll = per_document(-np.stack([lp_lm[keep], lp[keep]]), d, len(ids))
        name, base = f"kNN-LM (overlap ≤ {alpha:.1%})", f"base (overlap ≤ {alpha:.1%})"
        c = compare(nll, dw, [base, name], [(name, base)], st)
        cmp += comparison_rows(c, split="test")
        lm_s, knn_s = summarize(lp_lm[keep], int(dw.sum())), summarize(lp[keep], int(dw.sum()))
        rows.append({"split": "test", "chunks with overlap ≤": f"{alpha:.1%}",
                     "chunks": int((lcs / CHUNK <= alpha + 1e-12).sum()), "tokens": int(keep.sum()), "base PPL (word)": lm_s["ppl_word"], "kNN-LM PPL (word)": knn_s["ppl_word"],
                     "kNN-LM vs base (95% CI)": fmt_ci(c["diff"][f"{name} vs {base}"], pct=True),
                     "documents": len(ids)})
    # the gain per token against its chunk's overlap: least-squares slope, jackknife over documents
    ok = ~np.isnan(r_tok)
    n_docs = int(doc.max()) + 1
    delta = lp - lp_lm
    sums = regression_sums(r_tok[ok], delta[ok], doc[ok], n_docs)
    weights = regression_leverage(r_tok[ok], doc[ok], n_docs)
    v, lo, hi = jackknife_sums(slope_of, sums, weights, st)
    n_eff = effective_documents(weights)
    cmp.append({"split": "test", "comparison": SLOPE, "relative difference": float(v[0]), "CI low": float(lo[0]),
                "CI high": float(hi[0]), "verdict": verdict(lo[0], hi[0], n_docs, st["min_documents"], n_eff,
                                                            st.get("scheme", "")),
                "documents": n_docs, "effective documents": n_eff, "n_eff of": DESIGN_N_EFF})
    on = f"{sc['key_type']}/{sc['metric'].upper()}, full store, FAISS mask at τ* = {sc['tuned']['temperature']:g}"
    hist = np.bincount(lcs, minlength=CHUNK + 1)
    cap = (f"Leakage control ({cfg['name']}; Borgeaud et al. 2022, RETRO, Sec. 2.6 and 4.4, Figure 6): test cut into "
           f"{n_chunks} chunks of {CHUNK} tokens; a chunk's overlap is its longest run of tokens that also occurs in the "
           f"datastore's token stream, over {CHUNK}. Base LM vs kNN-LM ({on}, λ = {lam:g}) on the tokens of the chunks "
           f"with overlap at most α, and the least-squares slope of the per-token gain Δ = log p_kNN-LM − log p_LM on "
           f"the overlap (nats per token per unit of overlap: {float(v[0]):+.3f} [{float(lo[0]):+.3f}, "
           f"{float(hi[0]):+.3f}], delete-one-document jackknife). Median chunk overlap "
           f"{int(np.median(lcs))} tokens; RETRO: retrieval helps at every leakage level, most where chunks overlap "
           f"the training data. {ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    df = pd.DataFrame(rows)
    write_table(df, job.path("csv"), job.path("md"), "kNN-LM vs base by the test chunks' overlap with the datastore",
                cap, note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=on + ", test chunks"), job.path("cmp_csv"))
    _figure(job, hist, lcs, delta, ok)
    return {"metrics": {"slope": float(v[0]), "median_overlap_tokens": float(np.median(lcs)), "chunks": n_chunks},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def _figure(job: Job, hist: np.ndarray, lcs: np.ndarray, delta: np.ndarray, ok: np.ndarray) -> None:
    """Left: the chunks' overlap distribution; right: the mean per-token gain by overlap (RETRO's Figure 6 axis)."""
    import matplotlib.pyplot as plt

    per_chunk = delta[ok].reshape(len(lcs), CHUNK).mean(1)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.bar(np.arange(len(hist)) / CHUNK, hist, width=1 / CHUNK)
    a.set_xlabel("chunk overlap (longest shared run / chunk length)")
    a.set_ylabel("test chunks")
    levels = np.unique(lcs)
    b.plot(levels / CHUNK, [per_chunk[lcs == v].mean() for v in levels], marker="o", lw=1)
    b.axhline(0, color="grey", lw=0.8)
    b.set_xlabel("chunk overlap")
    b.set_ylabel("mean Δ log p per token (nats)")
    fig.suptitle(f"{job.cfg['name']}: the kNN-LM's gain by overlap with the datastore", fontsize=9)
    save_figure(fig, [job.path("png"), job.path("pdf")])
    plt.close(fig)
