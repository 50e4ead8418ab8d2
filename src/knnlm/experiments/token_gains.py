"""When does retrieval help? Per-token gains of the kNN-LM over its base LM, by retrieval quality (Drozdov et al.
2022, "You can't pick your neighbors, or can you? When and how to rely on retrieval in the kNN-LM", Sec. 4) and by
what the LM knows (He et al. 2021, "Efficient Nearest Neighbor Language Models", Sec. 3).

Jobs: features (per split: the features of every scored token, knnlm.scoring.quality) and table (test: Δ = log p_kNN-LM
− log p_LM per token for Table 3's pair on the full store, FAISS mask at τ* and, when the run scores the full store on
every token, real mask at τ*; the share of tokens helped and hurt, how concentrated the gain is, and the mean Δ by
bucket of each feature with CIs over documents; table, figure and comparisons 'token_gains').
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ..job import Job
from ..io import ArtifactError, atomic_path, iter_chunks, open_npy, read_checked_json, read_json
from ..scoring.quality import (bucket_of, context_features, context_ngram_stats, gain_concentration, lm_entropy,
                               longest_common_suffix, quantile_edges)
from ..scoring.interpolation import interpolate, knn_log_prob_from_cache
from ..statistics.intervals import effective_documents, jackknife_sums
from ..statistics.captions import statistic_row
from ..report.tables import write_csv, write_table
from .common import lm_training_label, split_documents, stats_options

log = logging.getLogger(__name__)
FEATURES = {  # name in the features file -> (label, how its buckets are made)
    "nn_distance": ("nearest neighbour's distance", "quantiles"),
    "lm_entropy": ("base LM's entropy (nats)", "quantiles"),
    "train_freq": ("target's training frequency", "quantiles"),
    "ngram_overlap": ("n-gram overlap with the top neighbour (tokens)", "overlap"),
}
OVERLAP_EDGES = np.array([1, 2, 3, 4, 8, 16])  # overlap buckets 0, 1, 2, 3, 4-7, 8-15, 16+
CHUNK = 16384


def features(job: Job) -> dict:
    """The features of every target of one split (knnlm.scoring.quality): the top FAISS neighbour's distance (Table 3's
    pair, full store), the base LM's entropy and max log-prob from softmax(W_sm h_sm) (checked against the dumped
    log p_LM: a mismatch over 0.05 nats raises ArtifactError), the target's training frequency, the n-gram overlap
    of its context with the top neighbour's in the training stream, and the training frequency and fertility of
    its last 1..quality.context_ngrams tokens as a context (He et al. 2021)."""
    from .common import open_datastore, open_split
    from .parametric import output_matrix

    _, vals, man = open_datastore(job, with_keys=False)
    q = open_split(job, with_queries=True, checkpoint_sha256=man["checkpoint_sha256"])
    t = q["manifest"]["T"]
    meta = read_json(job.path("nb_meta"))
    if meta["T"] != t:
        raise ArtifactError(f"{job.path('nb_meta')}: FAISS search of {meta['T']} queries, the split has {t}: it must "
                            f"cover every token (the full store's search)")
    ids = open_npy(job.path("nb_ids"), (t, meta["k"]), np.int32)
    dists = open_npy(job.path("nb_dists"), (t, meta["k"]), np.float32)
    w_sm = output_matrix(job).numpy().astype(np.float32)
    targets = np.asarray(q["targets"], dtype=np.int64)
    freq = np.bincount(np.asarray(vals), minlength=w_sm.shape[0])
    out = {"nn_distance": np.empty(t, np.float32), "lm_entropy": np.empty(t, np.float32),
           "lm_max_logprob": np.empty(t, np.float32), "train_freq": freq[targets].astype(np.int64),
           "ngram_overlap": np.empty(t, np.int32)}
    worst = 0.0
    for a, b in iter_chunks(t, CHUNK, ids, dists, q["queries"]):
        ent, mx, lse = lm_entropy(q["queries"][a:b], w_sm)
        h = np.asarray(q["queries"][a:b], dtype=np.float32)
        lp = (h * w_sm[targets[a:b]]).sum(1).astype(np.float64) - lse
        worst = max(worst, float(np.abs(lp - np.asarray(q["lm_logprobs"][a:b], dtype=np.float64)).max(initial=0)))
        out["lm_entropy"][a:b], out["lm_max_logprob"][a:b] = ent, mx
        out["nn_distance"][a:b] = dists[a:b, 0]
        top = np.asarray(ids[a:b, 0], dtype=np.int64)
        out["ngram_overlap"][a:b] = longest_common_suffix(targets, np.arange(a, b), vals, top,
                                                          job.cfg["quality"]["max_overlap"])
    # He et al. 2021's frequency features of the context (known before retrieval): how often the last 1..n tokens
    # occur as a context in the training stream, and how many distinct tokens follow them there
    stats = context_ngram_stats(np.asarray(vals), job.cfg["quality"]["context_ngrams"], w_sm.shape[0])
    out.update(context_features(targets, stats, w_sm.shape[0]))
    if worst > 0.05:
        raise ArtifactError(f"log softmax(W_sm h_ffn) differs from the dumped log p_LM by up to {worst:.3f} nats: "
                            f"W_sm or the ffn queries of {job.path('queries')} are not the LM's")
    with atomic_path(job.path("out")) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **out)
    return {"metrics": {"tokens": t, "lm_logprob_drift": worst, "mean_ngram_overlap": float(out["ngram_overlap"].mean()),
                        "mean_lm_entropy": float(out["lm_entropy"].mean())}}


def tuned_knn_lm(job: Job) -> tuple[dict, dict, dict, dict, dict]:
    """What the jobs that re-weigh Table 1's tuned kNN-LM per token read (lambda_by_quality, adaptive_retrieval):
    (its score JSON (input 'score'), {split: [T] float64 log p_LM} (input list 'lm_logprobs'), {split: [T] float64
    log p_kNN at τ*} (input list 'knn_tuned'), {split: features dict} (input list 'features'), {split: (doc [T],
    doc_words [D])} (split_documents))."""
    from .common import SPLITS, by_split, lm_log_probs

    lp_knn = {s: np.load(p).astype(np.float64) for s, p in by_split(job, "knn_tuned").items()}
    feats = {s: dict(np.load(p)) for s, p in by_split(job, "features").items()}
    return (read_checked_json(job.path("score"), "score"), lm_log_probs(job), lp_knn, feats,
            {s: split_documents(job, s) for s in SPLITS})


def buckets(name: str, x: np.ndarray, n: int) -> tuple[np.ndarray, list[str]]:
    """(bucket [T] of each token, bucket labels) of feature `name` (FEATURES): equal-count quantile buckets of the
    values (n of them, fewer when values tie), or the fixed overlap buckets 0, 1, 2, 3, 4-7, 8-15, 16+."""
    if FEATURES[name][1] == "overlap":
        edges = [int(e) for e in OVERLAP_EDGES]
        lo, hi = [0] + edges, edges + [None]
        labels = [f"{a}+" if b is None else f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in zip(lo, hi)]
        return bucket_of(x, OVERLAP_EDGES), labels
    edges = quantile_edges(x, n)
    bounds = np.concatenate([[np.min(x)], edges, [np.max(x)]])
    return bucket_of(x, edges), [f"{bounds[i]:.4g} … {bounds[i + 1]:.4g}" for i in range(len(edges) + 1)]


def bucket_means(delta: np.ndarray, bucket: np.ndarray, n_buckets: int, doc: np.ndarray, n_docs: int,
                 doc_weights: np.ndarray, stats: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mean Δ [B], lo [B], hi [B], tokens [B]) per bucket: Σ Δ / Σ tokens over the bucket's tokens, with its
    delete-one-document jackknife-t interval (knnlm.statistics.intervals.jackknife_sums) over the documents."""
    sums = np.zeros((n_docs, 2 * n_buckets))
    np.add.at(sums, (doc, bucket), delta)
    np.add.at(sums, (doc, n_buckets + bucket), 1.0)
    with np.errstate(all="ignore"):
        v, lo, hi = jackknife_sums(lambda s: s[..., :n_buckets] / s[..., n_buckets:], sums, doc_weights, stats)
    return v, lo, hi, sums[:, n_buckets:].sum(0)


def contrast(delta: np.ndarray, top: np.ndarray, bottom: np.ndarray, doc: np.ndarray, n_docs: int,
             doc_weights: np.ndarray, stats: dict) -> tuple[float, float, float]:
    """Mean Δ over the tokens `top` minus mean Δ over the tokens `bottom` ([T] bool masks), with its jackknife-t
    interval over documents (nats per token)."""
    sums = np.zeros((n_docs, 4))
    for j, (sel, w) in enumerate(((top, delta), (top, 1.0), (bottom, delta), (bottom, 1.0))):
        np.add.at(sums[:, j], doc[sel], w[sel] if isinstance(w, np.ndarray) else w)
    with np.errstate(all="ignore"):
        v, lo, hi = jackknife_sums(lambda s: (s[..., 0] / s[..., 1] - s[..., 2] / s[..., 3])[..., None], sums,
                                   doc_weights, stats)
    return float(v[0]), float(lo[0]), float(hi[0])


def _deltas(job: Job, sc: dict, targets: np.ndarray, lp_lm: np.ndarray) -> dict[str, tuple[np.ndarray, str]]:
    """{mask: (Δ [T] float64, how it was tuned)} on test: the FAISS mask (+ FAISS score) at the full store's τ* and
    λ (Table 1's tuned kNN-LM, score JSON `sc`), and, with input 'real_settings', the real mask (+ real score) at its
    own τ* and λ (Table 3 on every token), recomputed from the exact top-k."""
    lam = sc["tuned"]["lambda"]
    lp = np.load(job.path("knn_tuned")).astype(np.float64)
    out = {"FAISS mask": (interpolate(lp_lm, lp, lam) - lp_lm, f"τ* = {sc['tuned']['temperature']:g}, λ = {lam:g}")}
    if job.input.get("real_settings"):
        s = read_checked_json(job.path("real_settings"), "settings")
        tuned = s["tuned"]["real_mask_real_score"]
        meta = read_json(job.path("exact_meta"))
        ids = open_npy(job.path("exact_ids"), (meta["T"], meta["k"]), np.int32)
        dists = open_npy(job.path("exact_dists"), (meta["T"], meta["k"]), np.float32)
        if meta["T"] != len(targets):
            raise ArtifactError(f"{job.path('exact_meta')}: exact search of {meta['T']} queries, the test split has "
                                f"{len(targets)}")
        vals = np.load(job.path("vals"), mmap_mode="r")
        lp_real = knn_log_prob_from_cache(ids, dists, vals, targets, s["metric"], tuned["tau"])
        out["real mask"] = (interpolate(lp_lm, lp_real, tuned["lambda"]) - lp_lm,
                            f"τ* = {tuned['tau']:g}, λ = {tuned['lambda']:g}")
    return out


def table(job: Job) -> dict:
    """Table 'token_gains' (test): per mask, the share of tokens the kNN-LM helps and hurts, the share of the total
    gain from the top 1 / 5 / 10 % of tokens, and the mean Δ per bucket of each feature with its CI; figure
    'token_gains' (a panel per feature); comparisons 'token_gains_comparisons': the mean Δ of the closest-neighbour
    bucket minus the farthest, of the largest-overlap bucket minus no overlap (Drozdov et al.'s two conditions)."""
    from ..report.figures import pyplot, save_figure

    cfg, st = job.cfg, stats_options(job)
    qcfg = cfg["quality"]
    targets = np.load(job.path("targets")).astype(np.int64)
    lp_lm = np.load(job.path("lm_logprobs")).astype(np.float64)
    feats = dict(np.load(job.path("features")))
    doc, doc_words = split_documents(job, "test")
    n_docs = len(doc_words)
    tokens_per_doc = np.bincount(doc, minlength=n_docs).astype(float)
    sc = read_checked_json(job.path("score"), "score")
    deltas = _deltas(job, sc, targets, lp_lm)
    rows, cmp, summary = [], [], []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(FEATURES), figsize=(4.2 * len(FEATURES), 3.6))
    scheme = st.get("scheme", "")
    for mask, (delta, tuned) in deltas.items():
        conc = gain_concentration(delta)
        summary.append({"split": "test", "mask": mask, "tuning": tuned, "tokens": len(delta),
                        "helped": float((delta > 0).mean()), "hurt": float((delta < 0).mean()),
                        "mean Δ (nats/token)": float(delta.mean()),
                        **{f"gain share of top {100 * f:g} %": v for f, v in conc.items()}})
        for ax, (name, (label, _)) in zip(axes, FEATURES.items()):
            b, labels = buckets(name, feats[name], qcfg["buckets"])
            v, lo, hi, n = bucket_means(delta, b, len(labels), doc, n_docs, tokens_per_doc, st)
            for i, lab in enumerate(labels):
                rows.append({"split": "test", "mask": mask, "feature": label, "bucket": lab, "tokens": int(n[i]),
                             "mean Δ (nats/token)": v[i], "CI low": lo[i], "CI high": hi[i]})
            x = np.arange(len(labels))
            ax.errorbar(x, v, yerr=[v - lo, hi - v], marker="o", capsize=3, label=mask)
            ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
            ax.set_title(label, fontsize=9)
            ax.axhline(0, color="grey", lw=0.8)
            present = [i for i in range(len(labels)) if n[i] > 0]
            if len(present) >= 2 and name in ("nn_distance", "ngram_overlap"):
                # Drozdov et al.: the gain comes from close neighbours and from large n-gram overlaps
                first, last = present[0], present[-1]
                top, bottom = (b == first, b == last) if name == "nn_distance" else (b == last, b == first)
                if sc["metric"] == "ip" and name == "nn_distance":  # IP: larger is closer
                    top, bottom = bottom, top
                value, clo, chi = contrast(delta, top, bottom, doc, n_docs, tokens_per_doc, st)
                what = ("closest minus farthest decile of the nearest neighbour's distance" if name == "nn_distance"
                        else f"n-gram overlap {labels[last]} minus {labels[first]} tokens")
                cmp.append(statistic_row(f"{mask}: mean Δ, {what}", value, clo, chi, n_docs, st["min_documents"],
                                         effective_documents(tokens_per_doc), scheme, split="test"))
    axes[0].set_ylabel("mean Δ = log p_kNN-LM − log p_LM (nats/token)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Where the kNN-LM gains, token by token (test; 95 % CIs over documents)", fontsize=10)
    save_figure(fig, job.paths("fig"))
    plt.close(fig)
    on = f"{sc['key_type']}/{sc['metric'].upper()}, full store"
    cap = (f"Per-token gains ({cfg['name']}; Drozdov et al. 2022, Sec. 4; He et al. 2021, Sec. 3): Δ = log p_kNN-LM − "
           f"log p_LM of every test target ({on}; λ and τ tuned on valid), its share of tokens helped (Δ > 0) and hurt, "
           f"the share of the total gain Σ Δ from the top 1 / 5 / 10 % of tokens (over 100 %: the rest lose on "
           f"balance), and the mean Δ per bucket of each feature (equal-count buckets of {qcfg['buckets']}, n-gram "
           f"overlap in tokens: the longest common suffix of the query's preceding tokens and the top FAISS "
           f"neighbour's in the training stream, at most {qcfg['max_overlap']}); CIs: delete-one-document jackknife-t "
           f"over the test split's documents. {cfg.get('profile', {}).get('caption', '')}")
    df = pd.concat([pd.DataFrame(summary), pd.DataFrame(rows)], ignore_index=True)
    write_table(df, job.path("csv"), job.path("md"), "Per-token gains of the kNN-LM", cap, note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=f"{on}, all tokens"), job.path("cmp_csv"))  # contrasts (nats per token)
    return {"metrics": {f"{m.replace(' ', '_')}_helped": s["helped"] for m, s in zip(deltas, summary)},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}
