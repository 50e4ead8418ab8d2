"""Adaptive retrieval (He et al. 2021, "Efficient Nearest Neighbor Language Models", Sec. 3): a small model predicts
λ from what the LM knows before retrieving (its entropy and max log-prob, the context's n-gram frequencies and
fertilities in the training data), so that retrieval can be skipped for the tokens it expects little from.

The model (knnlm.scoring.quality.fit_lambda_model) is trained on valid only, on a seeded share of its documents, and
early-stopped on the rest; the skip threshold for a share s is the s-quantile of its predicted λ on those held-out
documents; on test, a skipped token gets λ = 0 (the base LM alone), the others their predicted λ. Compared, paired
over test documents, with Table 1's kNN-LM of Table 3's pair at τ* with its one global λ (every token retrieved).

Job: table (table and figure 'adaptive_retrieval', comparisons read by the findings).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..job import Job
from ..scoring.quality import fit_lambda_model, interpolate_per_token, lambda_features
from ..scoring.interpolation import interpolate, summarize
from ..statistics.captions import ci_caption, comparison_rows, fmt_ci
from ..statistics.intervals import compare, per_document
from ..report.tables import write_csv, write_table
from .common import documents_label, lm_training_label, stats_options
from .token_gains import tuned_knn_lm

GLOBAL = "kNN-LM, global λ"
ADAPTIVE = "adaptive λ"


def skip_name(share: float) -> str:
    """The row name of the adaptive λ with the share `share` of retrievals skipped."""
    return ADAPTIVE if share == 0 else f"{ADAPTIVE}, {100 * share:g} % skipped"


def held_out_documents(n_docs: int, share: float, seed: int) -> np.ndarray:
    """[n_docs] bool: a seeded share of the valid documents (at least one, and one left to train on) held out for
    the λ model's early stopping and the skip thresholds."""
    n = min(max(1, int(round(share * n_docs))), n_docs - 1)
    out = np.zeros(n_docs, dtype=bool)
    out[np.random.default_rng(seed).choice(n_docs, size=n, replace=False)] = True
    return out


def table(job: Job) -> dict:
    """Train the λ model on valid, then on test: perplexity with its predicted λ and with a share of retrievals
    skipped (config quality.adaptive.skip), each against the kNN-LM with one global λ and the base LM."""
    cfg, st = job.cfg, stats_options(job)
    a = cfg["quality"]["adaptive"]
    sc, lp_lm, lp_knn, feats, docs = tuned_knn_lm(job)
    lam = sc["tuned"]["lambda"]
    x, names = {}, None
    for s, f in feats.items():
        x[s], names = lambda_features(f, cfg["quality"]["context_ngrams"])
    vdoc, vwords = docs["valid"]
    held_docs = held_out_documents(len(vwords), a["held_out"], a["seed"])
    held = held_docs[vdoc]
    predict, hist = fit_lambda_model(x["valid"][~held], lp_lm["valid"][~held], lp_knn["valid"][~held],
                                     x["valid"][held], lp_lm["valid"][held], lp_knn["valid"][held], a["hidden"], a["lr"],
                                     a["batch_size"], a["max_epochs"], a["patience"], a["seed"])
    lam_held, lam_test = predict(x["valid"][held]), predict(x["test"])
    doc, doc_words = docs["test"]
    words = int(doc_words.sum())
    lps = {"base": lp_lm["test"], GLOBAL: interpolate(lp_lm["test"], lp_knn["test"], lam)}
    skipped = {}
    for share in a["skip"]:
        thr = float(np.quantile(lam_held, share)) if share > 0 else -np.inf
        keep = lam_test >= thr if share > 0 else np.ones(len(lam_test), bool)
        skipped[skip_name(share)] = (share, float(1 - keep.mean()))
        lps[skip_name(share)] = interpolate_per_token(lp_lm["test"], lp_knn["test"], np.where(keep, lam_test, 0.0))
    names_all = list(lps)
    pairs = [(n, GLOBAL) for n in skipped] + [(n, "base") for n in skipped] + [(GLOBAL, n) for n in skipped]
    nll = per_document(-np.stack([lps[n] for n in names_all]), doc, len(doc_words))
    c = compare(nll, doc_words, names_all, pairs, st)
    rows = []
    for n in names_all:
        summ = summarize(lps[n], words)
        share, actual = skipped.get(n, (None, 0.0 if n == GLOBAL else 1.0))
        rows.append({"split": "test", "model": n, "skip (target)": "-" if share is None else share,
                     "retrievals skipped (test)": actual, "PPL (word)": summ["ppl_word"],
                     "PPL (token)": summ["ppl_token"], "95% CI (word)": fmt_ci(c["ppl"][n]),
                     f"vs {GLOBAL} (95% CI)": fmt_ci(c["diff"][f"{n} vs {GLOBAL}"], pct=True) if n in skipped else "-",
                     "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base"], pct=True) if n in skipped else "-",
                     "documents": len(doc_words)})
    df = pd.DataFrame(rows)
    figure(df, lps, c, job.paths("fig"))
    held_docs = int(held_docs.sum())
    cap = (f"Adaptive retrieval ({cfg['name']}; He et al. 2021, Sec. 3): an MLP ({len(names)} features known before "
           f"retrieval: {', '.join(names)}; {a['hidden']} hidden units) predicts λ; trained on valid by the "
           f"interpolated NLL ({len(vwords) - held_docs} documents), early-stopped on {held_docs} held-out valid "
           f"documents ({hist['epochs']} epochs, best {hist.get('best_epoch', 0) + 1}, "
           f"{'stopped by patience' if hist['converged'] else 'stopped at max_epochs: may be under-trained'}). "
           f"Skipping a share s: the tokens whose predicted λ is under the s-quantile of the held-out documents' get "
           f"λ = 0 (no retrieval), the others their predicted λ. '{GLOBAL}': Table 1's kNN-LM "
           f"({sc['key_type']}/{sc['metric'].upper()}, full store, τ* = {sc['tuned']['temperature']:g}) with its one "
           f"global λ = {lam:g}, every token retrieved. He et al.: retrieval skipped for a large share of tokens at "
           f"little perplexity cost. {ci_caption(st, documents_label(job))}. "
           f"{cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Adaptive retrieval: perplexity vs retrievals skipped", cap,
                note=lm_training_label(job))
    on = f"{sc['key_type']}/{sc['metric'].upper()}, full store, FAISS mask at τ*, all tokens"
    write_csv(pd.DataFrame(comparison_rows(c, split="test")).assign(on=on), job.path("cmp_csv"))
    return {"metrics": {"held_out_nll": min(hist["held_nll"]), "epochs": hist["epochs"],
                        **{f"ppl_skip_{int(100 * s)}": r["PPL (word)"] for s, r in
                           zip(a["skip"], rows[2:])}},
            "step_metrics": {"held_out_nll": list(enumerate(hist["held_nll"]))},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def figure(df: pd.DataFrame, lps: dict, c: dict, paths: list) -> None:
    """Test perplexity (word) against the share of retrievals skipped, with 95 % CIs; the base LM and the kNN-LM
    with one global λ as lines."""
    from ..report.figures import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sk = df[df["model"].str.startswith(ADAPTIVE)]
    ppl = sk["PPL (word)"].to_numpy()
    lo = np.array([c["ppl"][n]["lo"] for n in sk["model"]])
    hi = np.array([c["ppl"][n]["hi"] for n in sk["model"]])
    x = 100 * sk["retrievals skipped (test)"].to_numpy()
    ax.errorbar(x, ppl, yerr=[ppl - lo, hi - ppl], marker="o", capsize=3, label=ADAPTIVE)
    for n, style in (("base", ":"), (GLOBAL, "--")):
        ax.axhline(c["ppl"][n]["value"], ls=style, color="grey", label=n)
    ax.set_xlabel("retrievals skipped on test (%)")
    ax.set_ylabel("test perplexity (word)")
    ax.legend(fontsize=8)
    ax.set_title("Adaptive retrieval (He et al. 2021)", fontsize=10)
    save_figure(fig, paths)
    plt.close(fig)
