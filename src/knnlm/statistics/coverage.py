"""Coverage of the confidence intervals of knnlm.statistics.intervals, measured by simulation on WikiText-like documents.

An interval method is used for verdicts only if its coverage has been measured (docs/statistics.md). Each
repetition draws a split of D documents whose shape follows WikiText-2's valid and test articles: lengths
log-normal (median 2,500 words, σ = 1.3 of log length; the real splits: σ 1.21 and 1.44, 61 and 63 articles),
each document with its own difficulty (per-word NLL ~ N(4.5, 0.4²)) and its own kNN-LM and W_ds effect
(per-word NLL change ~ N(δ, 0.05²)), plus token noise. Three paired settings: base, 'knn' (δ = −0.10, a 9.5 %
lower perplexity) and 'wds' (δ = −0.055); the true ratio ppl_knn / ppl_base − 1 = e^−0.10 − 1 and the true
share of the gain (ppl_base − ppl_wds) / (ppl_base − ppl_knn) = (1 − e^−0.055) / (1 − e^−0.10) hold for the
population of documents because the effects do not depend on the length. Coverage = the fraction of
repetitions whose interval holds the truth.

    python -m knnlm.statistics.coverage --reps 1000 --out docs/coverage.md

The realistic scenarios (scenario_split: effects correlated with length, heavy tails, paragraphs nested in
articles) are measured by scenario_coverage and written below the main table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .intervals import INTERVALS, compare

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


# Realistic scenarios beyond wikitext_like (docs/coverage.md): the coverage that a verdict's interval must reach at
# >= 20 units in each (SCENARIO_MIN_COVERAGE), measured by scenario_coverage.
SCENARIOS = ("wikitext", "length_effect", "heavy_tails", "nested_articles", "nested_paragraphs", "block_sample")
SCENARIO_MIN_COVERAGE = 0.92
LENGTH_SLOPE = 0.02  # length_effect: the kNN effect per word grows by this per unit of log document length
BLOCK_FRACTION = 0.03  # block_sample: the scope's share of each article (the main job: 8,000 of ~270,000 tokens)
SEGMENT_WORDS = 30  # block_sample: the words over which the kNN effect and the difficulty stay put inside an article


def scenario_split(rng: np.random.Generator, name: str, n_units: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One simulated split of scenario `name` (SCENARIOS): (per-unit NLL sums [2, n_units] of settings base and knn,
    words [n_units], the true ratio ppl_knn / ppl_base − 1 of the population).

    'wikitext': wikitext_like. 'length_effect': the kNN effect depends on the document's length, δ = DELTA_KNN +
    LENGTH_SLOPE · (log w − log 2500), so long documents weigh in the truth exp(E[w δ] / E[w]) − 1 =
    exp(DELTA_KNN + LENGTH_SLOPE σ²) − 1 (log-normal lengths). 'heavy_tails': lengths log-normal with σ = 1.8 (a few
    documents carry most words) and Student-t (3 d.o.f.) effects. 'nested_articles' / 'nested_paragraphs': articles of
    ~20 paragraphs whose effect and difficulty are the article's (spread 0.05), resampled by article / by paragraph
    (n_units articles either way): the truth is the same, the second treats dependent paragraphs as independent.
    'block_sample': the retrieval scope (knnlm.search.scope.scope_tokens): WikiText-like articles made of segments
    of SEGMENT_WORDS words whose difficulty and kNN effect vary inside the article (spreads 0.3 and 0.1 around the
    article's), of which each article gives one circular block of max(1, round(BLOCK_FRACTION · segments))
    segments at a uniform offset; resampled by article."""
    sigma, delta = 1.3, DELTA_KNN
    if name in ("wikitext", "length_effect", "heavy_tails"):
        if name == "heavy_tails":
            sigma = 1.8
        words = np.maximum(20, np.round(np.exp(rng.normal(np.log(2500), sigma, n_units))))
        base = words * rng.normal(4.5, 0.4, n_units) + np.sqrt(words) * 2.5 * rng.standard_normal(n_units)
        eff = rng.normal(0, 0.05, n_units) if name != "heavy_tails" else 0.05 * rng.standard_t(3, n_units) / np.sqrt(3)
        truth = delta
        if name == "length_effect":
            eff = eff + LENGTH_SLOPE * (np.log(words) - np.log(2500))
            truth = delta + LENGTH_SLOPE * sigma ** 2
        knn = base + words * (delta + eff) + np.sqrt(words) * 0.5 * rng.standard_normal(n_units)
        return np.stack([base, knn]), words, float(np.exp(truth) - 1)
    if name == "block_sample":
        return _block_sample(rng, n_units, delta)
    if name not in ("nested_articles", "nested_paragraphs"):
        raise ValueError(f"unknown coverage scenario {name!r}: expected one of {SCENARIOS}")
    per = rng.poisson(20, n_units) + 1  # paragraphs per article
    art = np.repeat(np.arange(n_units), per)
    words = np.maximum(10, np.round(np.exp(rng.normal(np.log(120), 0.8, len(art)))))
    level, eff = rng.normal(4.5, 0.4, n_units)[art], rng.normal(0, 0.05, n_units)[art]
    base = words * level + np.sqrt(words) * 2.5 * rng.standard_normal(len(art))
    knn = base + words * (delta + eff) + np.sqrt(words) * 0.5 * rng.standard_normal(len(art))
    nll = np.stack([base, knn])
    if name == "nested_articles":
        nll = np.stack([np.bincount(art, weights=row, minlength=n_units) for row in nll])
        words = np.bincount(art, weights=words, minlength=n_units)
    return nll, words, float(np.exp(delta) - 1)


def _block_sample(rng: np.random.Generator, n_units: int, delta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """scenario_split's 'block_sample': per-article NLL sums [2, n_units] and words of each article's block."""
    words = np.maximum(20, np.round(np.exp(rng.normal(np.log(2500), 1.3, n_units))))
    level, eff = rng.normal(4.5, 0.4, n_units), rng.normal(0, 0.05, n_units)
    nll, kept = np.zeros((2, n_units)), np.zeros(n_units)
    for a in range(n_units):
        seg = max(1, int(round(words[a] / SEGMENT_WORDS)))
        w = np.full(seg, words[a] / seg)
        lev, e = level[a] + rng.normal(0, 0.3, seg), eff[a] + rng.normal(0, 0.1, seg)
        take = (int(rng.integers(seg)) + np.arange(max(1, int(round(BLOCK_FRACTION * seg))))) % seg
        w, lev, e = w[take], lev[take], e[take]
        base = w * lev + np.sqrt(w) * 2.5 * rng.standard_normal(len(w))
        knn = base + w * (delta + e) + np.sqrt(w) * 0.5 * rng.standard_normal(len(w))
        nll[:, a], kept[a] = (base.sum(), knn.sum()), w.sum()
    return nll, kept, float(np.exp(delta) - 1)


def scenario_coverage(name: str, n_units: int, reps: int, method: str = "jackknife_t", seed: int = 0,
                      resamples: int = 1000, level: float = 0.95) -> dict:
    """Measured coverage of `method` in scenario `name` (scenario_split) at n_units units over `reps` splits:
    {'coverage', 'width' (median width of the ratio's CI)}."""
    rng = np.random.default_rng(seed)
    st = {"interval": method, "resamples": resamples, "level": level, "min_documents": 0, "documents": "blocks"}
    hits, widths = 0, []
    for r in range(reps):
        nll, words, truth = scenario_split(rng, name, n_units)
        d = compare(nll, words, ["base", "knn"], [("knn", "base")], {**st, "seed": r})["diff"]["knn vs base"]
        hits += d["lo"] <= truth <= d["hi"]
        widths.append(d["hi"] - d["lo"])
    return {"coverage": hits / reps, "width": float(np.median(widths))}


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
    """Measured coverage of knnlm.statistics.intervals.jackknife_sums at n_docs documents over `reps` simulated splits:
    {'slope': of the token-level slope (slope_split, truth SLOPE), 'type_slope': of App. D's slope over word types
    (type_split; truth: the least-squares slope of the true share differences over the types kept, ≥ min_occurrences)}."""
    from .regression import regression_leverage, regression_sums, slope_of, type_counts, type_slope
    from .intervals import jackknife_sums

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


def scenario_table(reps: int, sizes=(9, 20, 60, 200), method: str = "jackknife_t") -> str:
    """A Markdown table of the coverage of `method` per scenario (SCENARIOS) and number of units, the median CI
    width beside it, and which scenarios fall short of SCENARIO_MIN_COVERAGE at >= 20 units."""
    lines = ["| scenario | " + " | ".join(f"{n} units" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    short = []
    for name in SCENARIOS:
        cells = []
        for n in sizes:
            c = scenario_coverage(name, n, reps, method, seed=1000 + n)
            cells.append(f"{100 * c['coverage']:.1f} % (width {100 * c['width']:.1f} pp)")
            if n >= 20 and c["coverage"] < SCENARIO_MIN_COVERAGE:
                short.append(f"{name} at {n}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Below {100 * SCENARIO_MIN_COVERAGE:.0f} % at >= 20 units: {', '.join(short) or 'none'}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown table here (else print it)")
    ap.add_argument("--scenarios-only", action="store_true", help="only the realistic scenarios (jackknife_t)")
    a = ap.parse_args(argv)
    text = "" if a.scenarios_only else (
        f"Coverage of nominal 95 % intervals ({a.reps} simulated splits per cell, {a.resamples} bootstrap "
        f"resamples; knnlm.statistics.coverage). Truth: ratio {100 * TRUE_DIFF:+.2f} %, share {100 * TRUE_SHARE:.1f} %.\n\n"
        + table(a.reps, resamples=a.resamples) + "\n")
    text += (f"## Realistic scenarios (jackknife_t, the default; {a.reps} simulated splits per cell)\n\n"
             "wikitext: as above. length_effect: the kNN effect per word grows with the document's log length "
             f"({LENGTH_SLOPE} per unit), so long documents weigh in the truth. heavy_tails: log-normal lengths with "
             "σ = 1.8 and Student-t effects. nested_articles / nested_paragraphs: articles of ~20 paragraphs whose "
             "effect is the article's, resampled by article / by paragraph (the count is of articles either way). "
             f"block_sample: the retrieval scope, one circular block of {100 * BLOCK_FRACTION:g} % of each article's "
             f"{SEGMENT_WORDS}-word segments, whose difficulty and effect vary inside the article.\n\n"
             + scenario_table(a.reps))
    if a.out:
        from ..io import atomic_path

        with atomic_path(a.out) as tmp:
            Path(tmp).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
