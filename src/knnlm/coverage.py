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


SLOPE = 0.05  # token-level truth: y rises by 0.05 per 1,000 tokens of position
TYPE_SLOPE = -0.01  # word-type-level truth: the share difference falls by 1 point per character


def slope_split(rng: np.random.Generator, n_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One simulated split for the token-level slope and correlation (E.3): documents of log-normal length (median
    300 tokens, σ 1.3 as wikitext_like), x = the position in the document in thousands of tokens, y = a per-token
    value (an NLL) with a per-document level N(4.5, 0.4²) and a per-document slope SLOPE + N(0, 0.05²), plus noise.
    Returns (x [T], y [T], doc [T])."""
    n = np.maximum(20, np.round(np.exp(rng.normal(np.log(300), 1.3, n_docs)))).astype(int)
    doc = np.repeat(np.arange(n_docs), n)
    x = (np.arange(len(doc)) - np.repeat(np.cumsum(n) - n, n)) / 1000.0
    y = rng.normal(4.5, 0.4, n_docs)[doc] + (SLOPE + rng.normal(0, 0.05, n_docs))[doc] * x + rng.normal(0, 2.0, len(doc))
    return x, y, doc


def type_split(rng: np.random.Generator, n_docs: int, types: int = 300):
    """One simulated split for App. D's slope over word types: Zipf-distributed targets in documents of log-normal
    length (median 2,500 tokens), type lengths 1..12 characters, for each token two paired flags (p_kNN > p_LM under
    the real and the FAISS mask) whose rates differ per type by TYPE_SLOPE × length + N(0, 0.02²), with a
    per-document shift shared by both. Returns (target [T], doc [T], flag_real [T], flag_faiss [T], length [types],
    true share difference [types])."""
    n = np.maximum(20, np.round(np.exp(rng.normal(np.log(2500), 1.3, n_docs)))).astype(int)
    doc = np.repeat(np.arange(n_docs), n)
    p = 1.0 / np.arange(1, types + 1)
    target = rng.choice(types, len(doc), p=p / p.sum())
    length = rng.integers(1, 13, types).astype(float)
    base = rng.uniform(0.3, 0.6, types)
    diff = TYPE_SLOPE * (length - 6) + rng.normal(0, 0.02, types)
    shift = rng.normal(0, 0.05, n_docs)[doc]
    u = rng.random(len(doc))  # the same uniform for both flags: paired settings
    real = u < np.clip(base[target] + shift + diff[target] / 2, 0, 1)
    faiss = u < np.clip(base[target] + shift - diff[target] / 2, 0, 1)
    return target, doc, real, faiss, length, diff


def slope_coverage(n_docs: int, reps: int, seed: int = 0, level: float = 0.95, min_occurrences: int = 10) -> dict:
    """Measured coverage of knnlm.stats.jackknife_sums at n_docs documents over `reps` simulated splits: {'slope':
    of the token-level slope (slope_split, truth SLOPE), 'type_slope': of App. D's slope over word types (type_split;
    truth: the least-squares slope of the true share differences over the types kept, ≥ min_occurrences)}."""
    from .analysis import regression_leverage, regression_sums, slope_of, type_counts, type_slope
    from .stats import jackknife_sums

    rng = np.random.default_rng(seed)
    st = {"level": level, "min_documents": 0, "documents": "blocks"}
    hit_s = hit_t = 0
    for _ in range(reps):
        x, y, doc = slope_split(rng, n_docs)
        _, lo, hi = jackknife_sums(slope_of, regression_sums(x, y, doc, n_docs), regression_leverage(x, doc, n_docs), st)
        hit_s += lo[0] <= SLOPE <= hi[0]
        target, doc, real, faiss, length, diff = type_split(rng, n_docs)
        kept = np.flatnonzero(np.bincount(target, minlength=len(length)) >= min_occurrences)
        c = type_counts(target, doc, n_docs, [real, faiss], kept)
        _, lo, hi = jackknife_sums(type_slope(length[kept]), c.reshape(n_docs, -1), np.bincount(doc), st)
        truth = np.polyfit(length[kept], diff[kept], 1)[0]
        hit_t += lo[0] <= truth <= hi[0]
    return {"slope": hit_s / reps, "type_slope": hit_t / reps}


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
