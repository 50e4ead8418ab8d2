"""Which words gain from approximate neighbours (Xu et al. 2023, App. D, Figures 6 and 7), and beyond the paper the
same question by the target's training frequency.

For every test token of the Table 3 store's scope, p_kNN > p_LM under "real mask, real score" and under "FAISS mask,
real score" (the config τ, as Table 3). Per word type with at least 'hypotheses.min_occurrences' occurrences: the
share of its occurrences helped under each setting; y = share(real) − share(FAISS) (the paper's "how much accurate
neighbours are better than approximate ones; negative values mean worse"), against the type's length in characters
(Figure 6) and its forward and backward bigram entropy in the training data (Figure 7, Eq. 10-11). The paper finds
negative slopes: longer and higher-entropy words are better off with approximate neighbours. Each slope's 95 % CI
is a delete-one-document jackknife over the test documents (knnlm.statistics.intervals.jackknife_sums; coverage measured
by knnlm.statistics.coverage.slope_coverage).

Beyond the paper (Wang et al. 2023: the kNN-LM raises the loss of most tokens; Nishida et al. 2025: its gains come
from frequent ones): per bucket of the target's training frequency, the share of tokens the interpolated kNN-LM
helps and hurts and its mean change of NLL, for the usual kNN-LM (FAISS mask, FAISS score) and exact retrieval.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..job import Job
from ..report.figures import pyplot, save_figure
from ..io import write_json
from ..scoring.results import METRIC_NAME, evaluate
from ..scoring.interpolation import interpolate
from ..statistics.captions import ci_caption, statistic_row
from ..statistics.intervals import effective_documents, jackknife_sums
from ..report.tables import write_csv, write_table
from .common import lm_training_label, scheme_label, documents_scheme, stats_options, token_strings
from ..scoring.settings import FAISS_FAISS, FAISS_REAL, REAL_REAL
from ..search.scope import every_token_label
from .retrieval import load_settings, scoped_targets

SPLIT = "test"
ATTRIBUTES = {"length": "word length (characters)", "entropy_fwd": "forward bigram entropy (nats)",
              "entropy_bwd": "backward bigram entropy (nats)"}
SLOPE = "slope of share(real) − share(FAISS) vs {}"  # the comparisons the findings read (App. D; claims.yaml)


def _attributes(job: Job, vocab: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """({attribute: [vocab] float64}, train counts [vocab] int64, special [vocab] bool) of every word type: its
    length in characters, forward and backward bigram entropy in the datastore's training stream (input 'vals')."""
    from ..scoring.analysis import bigram_entropy

    strings, special = token_strings(job, vocab)
    vocab = len(strings)
    vals = np.load(job.path("vals"), mmap_mode="r")
    fwd, bwd, train = bigram_entropy(vals, vocab)  # train: each type's count as a bigram's first token
    if len(vals):
        train[int(vals[-1])] += 1  # ... plus the stream's last token: every occurrence
    return {"length": np.array([len(s) for s in strings], dtype=np.float64), "entropy_fwd": fwd,
            "entropy_bwd": bwd}, train, special


def which_words(job: Job) -> dict:
    """App. D on the job's store (inputs of rule settings for one store, key and metric): table 'which_words'
    (slopes with CIs), table 'which_words_frequency', their comparisons CSV, Figures 6 and 7 and a JSON of the
    per-type points."""
    cfg, hyp = job.cfg, job.cfg["hypotheses"]
    st = stats_options(job)
    tau = cfg["knn"]["temperature"]
    lp_lm, words, lp_knn, _, docs, _, _ = load_settings(job, [tau])
    target = scoped_targets(job, SPLIT)
    doc, doc_words, _ = docs[SPLIT]
    n_docs = len(doc_words)
    doc_tokens = np.bincount(doc, minlength=n_docs)
    vals = np.load(job.path("vals"), mmap_mode="r")
    vocab = int(max([target.max(initial=0) + 1] + [vals[a:a + (1 << 24)].max() + 1 for a in range(0, len(vals), 1 << 24)]))
    attrs, train, special = _attributes(job, vocab)
    vocab = len(special)
    lm = lp_lm[SPLIT]
    real, faiss = lp_knn[REAL_REAL][SPLIT] > lm, lp_knn[FAISS_REAL][SPLIT] > lm
    occ = np.bincount(target, minlength=vocab)
    types = np.flatnonzero((occ >= hyp["min_occurrences"]) & ~special)
    from ..statistics.regression import type_counts, type_slope

    counts = type_counts(target, doc, n_docs, [real, faiss], types).reshape(n_docs, -1)
    rows, points = [], {"type": types.tolist(), "occurrences": occ[types].tolist()}
    tot = counts.sum(0).reshape(len(types), 3)
    points["share_real"] = (tot[:, 1] / tot[:, 0]).tolist()
    points["share_faiss"] = (tot[:, 2] / tot[:, 0]).tolist()
    for name, x in attrs.items():
        xs = x[types]
        ok = np.isfinite(xs)
        sub = counts.reshape(n_docs, len(types), 3)[:, ok].reshape(n_docs, -1)
        v, lo, hi = jackknife_sums(type_slope(xs[ok]), sub, doc_tokens, st) if ok.sum() > 2 else ([np.nan],) * 3
        rows.append(statistic_row(SLOPE.format(ATTRIBUTES[name]), v[0], lo[0], hi[0], n_docs, st["min_documents"],
                                  effective_documents(doc_tokens), st.get("scheme", ""), split=SPLIT,
                                  types=int(ok.sum())))
        points[name] = xs.tolist()
    freq = _frequency(job, lm, lp_lm, lp_knn, words, target, train, doc, doc_tokens, n_docs, st)
    _figures(job, points, rows)
    store, key, metric = job.wildcards["store"], job.wildcards["key"], job.wildcards["metric"]
    label = scheme_label(documents_scheme(job), {SPLIT: n_docs})
    every = cfg["retrieval"]["max_queries"] is None or "alltokens" in store
    frac = cfg["retrieval"].get("table3_fraction", 1.0) if "alltokens" in store else 1.0
    scope = every_token_label(frac) if every else "retrieval scope"
    where = (f"{key}/{METRIC_NAME[metric]} keys, store '{store}' ({len(lm):,} {SPLIT} tokens of the "
             f"{'split' if scope == 'all tokens' else scope}, {n_docs} documents), τ = {tau:g}")
    cap = (f"Which words gain from approximate neighbours ({cfg['name']}; Xu et al. 2023, App. D, Figures 6 and 7): "
           f"per word type with ≥ {hyp['min_occurrences']} occurrences ('types'), y = the share of its occurrences "
           f"with p_kNN > p_LM under real mask + real score minus that under FAISS mask + real score; the "
           f"least-squares slope of y over types against each attribute (bigram entropies from the training "
           f"stream, Eq. 10-11). The paper finds negative slopes (longer, higher-entropy words are better off "
           f"with approximate neighbours). {where}. {ci_caption(st, label)}; here the t interval is on the linear "
           f"scale and the jackknife leaves out one document's tokens (coverage: docs/statistics.md). {cfg.get('profile', {}).get('caption', '')}")
    df = pd.DataFrame(rows)
    shown = df.rename(columns={"relative difference": "slope (share per unit)"})
    write_table(shown, job.path("csv"), job.path("md"), "App. D: which words gain from approximate neighbours", cap,
                note=lm_training_label(job))
    fcap = (f"kNN-LM gains by the target's training frequency ({cfg['name']}; beyond the paper: Wang et al. 2023, "
            f"Nishida et al. 2025): {SPLIT} tokens in {hyp['frequency_buckets']} buckets of about equally many "
            f"tokens by how often the target occurs in the datastore; per bucket the share of tokens whose "
            f"probability the interpolated kNN-LM raises ('helped') or lowers ('hurt') and the mean change of NLL "
            f"per token (nats, negative = better) with its CI, for the usual kNN-LM (FAISS mask + FAISS score) "
            f"and exact retrieval (real mask + real score), λ tuned on valid for each; 'exact − FAISS' is the "
            f"paired difference. {where}. {ci_caption(st, label)} (here on the linear scale).")
    write_table(freq, job.path("freq_csv"), job.path("freq_md"), "kNN-LM gains by training frequency", fcap,
                note=lm_training_label(job))
    write_csv(df.assign(on=f"{key}/{METRIC_NAME[metric]}, store {store}, {scope}"), job.path("cmp_csv"))
    write_json(job.path("points"), {"store": store, "key": key, "metric": metric, "documents": n_docs, **points})
    return {"metrics": {f"slope_{n}": r["relative difference"] for n, r in zip(ATTRIBUTES, rows)},
            "artifacts": [str(job.path(n)) for n in ("csv", "md", "freq_csv", "freq_md", "points")]}


def _frequency(job, lm, lp_lm, lp_knn, words, target, train, doc, doc_tokens, n_docs, st) -> pd.DataFrame:
    """Rows per training-frequency bucket and setting: helped / hurt shares and mean Δ NLL with CIs."""
    steps = job.cfg["knn"]["lambda_steps"]
    order = np.argsort(train[target], kind="stable")
    nb = job.cfg["hypotheses"]["frequency_buckets"]
    bucket = np.empty(len(target), dtype=np.int64)
    bucket[order] = np.minimum(np.arange(len(target)) * nb // max(len(target), 1), nb - 1)
    delta = {}
    for setting, name in ((FAISS_FAISS, "FAISS mask + FAISS score"), (REAL_REAL, "real mask + real score")):
        lam = evaluate(lp_lm, lp_knn[setting], words, steps)["lambda"]
        delta[name] = lm - interpolate(lm, lp_knn[setting][SPLIT], lam)  # Δ NLL: interpolated − base
    rows = []
    for b in range(nb):
        m = bucket == b
        lo_f, hi_f = (int(train[target[m]].min()), int(train[target[m]].max())) if m.any() else (0, 0)
        base = {"split": SPLIT, "bucket": b + 1, "train count of target": f"{lo_f:,}–{hi_f:,}", "tokens": int(m.sum())}
        for name, d in delta.items():
            sums = np.stack([np.bincount(doc, weights=np.where(m, c, 0.0), minlength=n_docs)
                             for c in (d, (d < 0).astype(float), (d > 0).astype(float), np.ones(len(d)))], 1)
            v, lo, hi = jackknife_sums(lambda t: t[..., :3] / t[..., 3:4], sums, doc_tokens, st)
            rows.append({**base, "setting": name, "helped": v[1], "hurt": v[2], "mean Δ NLL": v[0],
                         "Δ NLL CI": f"[{lo[0]:+.4f}, {hi[0]:+.4f}]", "documents": n_docs})
        d_ex, d_fa = delta["real mask + real score"], delta["FAISS mask + FAISS score"]
        sums = np.stack([np.bincount(doc, weights=np.where(m, c, 0.0), minlength=n_docs)
                         for c in (d_ex - d_fa, np.ones(len(d_ex)))], 1)
        v, lo, hi = jackknife_sums(lambda t: t[..., :1] / t[..., 1:2], sums, doc_tokens, st)
        rows.append({**base, "setting": "exact − FAISS", "helped": np.nan, "hurt": np.nan, "mean Δ NLL": v[0],
                     "Δ NLL CI": f"[{lo[0]:+.4f}, {hi[0]:+.4f}]", "documents": n_docs})
    return pd.DataFrame(rows)


def _figures(job: Job, points: dict, rows: list[dict]) -> None:
    """Figure 6 (y vs word length) and Figure 7 (y vs forward and backward bigram entropy), with trend lines."""
    plt = pyplot()
    y = np.array(points["share_real"]) - np.array(points["share_faiss"])
    for fig_name, names in (("fig6", ["length"]), ("fig7", ["entropy_fwd", "entropy_bwd"])):
        fig, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 3.8), squeeze=False, layout="constrained")
        for ax, name in zip(axes[0], names):
            x = np.array(points[name])
            ok = np.isfinite(x)
            ax.scatter(x[ok], 100 * y[ok], s=6, alpha=0.4)
            r = rows[list(ATTRIBUTES).index(name)]
            if ok.sum() > 2 and np.isfinite(r["relative difference"]):
                xs = np.linspace(x[ok].min(), x[ok].max(), 50)
                b = r["relative difference"]
                a = y[ok].mean() - b * x[ok].mean()
                ax.plot(xs, 100 * (a + b * xs), "r-", label=f"slope {100 * b:+.2f} pp "
                                                            f"[{100 * r['CI low']:+.2f}, {100 * r['CI high']:+.2f}]")
                ax.legend(fontsize=7)
            ax.axhline(0, color="k", lw=0.5)
            ax.set_xlabel(ATTRIBUTES[name])
            ax.set_ylabel("share helped: real − FAISS mask (pp)")
        fig.suptitle(f"{'Fig. 6' if fig_name == 'fig6' else 'Fig. 7'} ({job.cfg['name']}): how much exact "
                     f"neighbours beat approximate ones per word type (App. D)", fontsize=9)
        save_figure(fig, job.paths(fig_name))
        plt.close(fig)
