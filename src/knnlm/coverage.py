"""Coverage of the confidence intervals of knnlm.stats, measured by simulation on WikiText-like documents.

An interval method is used for verdicts only if its coverage has been measured (docs/statistics.md). Each
repetition draws a split of D documents whose shape follows WikiText-2's valid and test articles: lengths
log-normal (median 2,500 words, σ = 1.3 of log length; the real splits: σ 1.21 and 1.44, 61 and 63 articles),
each document with its own difficulty (per-word NLL ~ N(4.5, 0.4²)) and its own kNN-LM and W_ds effect
(per-word NLL change ~ N(δ, 0.05²)), plus token noise. Three paired settings: base, 'knn' (δ = −0.10, a 9.5 %
lower perplexity) and 'wds' (δ = −0.055); the true ratio ppl_knn / ppl_base − 1 = e^−0.10 − 1 and the true
share of the gain (ppl_base − ppl_wds) / (ppl_base − ppl_knn) = (1 − e^−0.055) / (1 − e^−0.10) hold for the
population of documents because the effects do not depend on the length. Coverage = the fraction of
repetitions whose interval holds the truth.

    python -m knnlm.coverage --reps 1000 --out docs/coverage.md
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .stats import INTERVALS, compare

DELTA_KNN, DELTA_WDS = -0.10, -0.055
TRUE_DIFF = float(np.exp(DELTA_KNN) - 1)
TRUE_SHARE = float((1 - np.exp(DELTA_WDS)) / (1 - np.exp(DELTA_KNN)))
SIZES = (5, 10, 20, 60, 200)


def wikitext_like(rng: np.random.Generator, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document NLL sums [3, n_docs] (settings base, knn, wds; nats) and words [n_docs] of one simulated split."""
    words = np.maximum(20, np.round(np.exp(rng.normal(np.log(2500), 1.3, n_docs))))
    base = words * rng.normal(4.5, 0.4, n_docs) + np.sqrt(words) * 2.5 * rng.standard_normal(n_docs)
    knn = base + words * rng.normal(DELTA_KNN, 0.05, n_docs) + np.sqrt(words) * 0.5 * rng.standard_normal(n_docs)
    wds = base + words * rng.normal(DELTA_WDS, 0.05, n_docs) + np.sqrt(words) * 0.5 * rng.standard_normal(n_docs)
    return np.stack([base, knn, wds]), words


def coverage(n_docs: int, method: str, reps: int, seed: int = 0, resamples: int = 1000,
             level: float = 0.95) -> dict[str, float]:
    """Measured coverage of `method` ('stats.interval') at n_docs documents over `reps` simulated splits:
    {'diff': of the ratio's CI, 'share': of the share's CI, 'width': median width of the ratio's CI}."""
    rng = np.random.default_rng(seed)
    st = {"interval": method, "resamples": resamples, "level": level, "min_documents": 0, "documents": "blocks"}
    hit_d = hit_s = 0
    widths = []
    for r in range(reps):
        nll, words = wikitext_like(rng, n_docs)
        res = compare(nll, words, ["base", "knn", "wds"], [("knn", "base")], {**st, "seed": r},
                      shares=[("wds", "knn")])
        d, s = res["diff"]["knn vs base"], res["share"]["wds of knn"]
        hit_d += d["lo"] <= TRUE_DIFF <= d["hi"]
        hit_s += s["lo"] <= TRUE_SHARE <= s["hi"]
        widths.append(d["hi"] - d["lo"])
    return {"diff": hit_d / reps, "share": hit_s / reps, "width": float(np.median(widths))}


def table(reps: int, sizes=SIZES, methods=INTERVALS, resamples: int = 1000) -> str:
    """A Markdown table of coverage per method and number of documents (relative difference / share)."""
    lines = ["| documents | " + " | ".join(f"{m}: ratio | {m}: share" for m in methods) + " |",
             "|---:|" + "---:|---:|" * len(methods)]
    for n in sizes:
        cells = []
        for m in methods:
            c = coverage(n, m, reps, seed=n, resamples=resamples)
            cells += [f"{100 * c['diff']:.1f} %", f"{100 * c['share']:.1f} %"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown table here (else print it)")
    a = ap.parse_args(argv)
    text = (f"Coverage of nominal 95 % intervals ({a.reps} simulated splits per cell, {a.resamples} bootstrap "
            f"resamples; knnlm.coverage). Truth: ratio {100 * TRUE_DIFF:+.2f} %, share {100 * TRUE_SHARE:.1f} %.\n\n"
            + table(a.reps, resamples=a.resamples))
    if a.out:
        from .io import atomic_path

        with atomic_path(a.out) as tmp:
            Path(tmp).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
