"""How many tokens a measurement on part of a split needs: the intervals of Table 3's settings (Xu et al. 2023,
Sec. 5.1-5.2) on proportional block samples of the every-token store, against every token.

The rule the configs follow (docs/statistics.md, "How large a sample"): a measurement made on part of a split
takes the smallest proportional block sample (knnlm.search.scope.scope_tokens: every document gives one
word-aligned block, its share of the budget) at which every interval that rests on it is at most 1.15 times as
wide as on every token (or 1.25, 1.5 where the budget needs it: `retrieval.sample_rule.ratios`), with the same
verdict. This job
measures that on a run whose '-alltokens' store is scored on every token: it reads the store's caches once
(knnlm.experiments.retrieval.load_settings) and, for each fraction of the tokens in `retrieval.sample_rule.fractions`,
draws the block sample of test and of the store's valid tokens, tunes τ and λ on the sample's valid tokens as the
settings job does (temperature_sweep, evaluate) and recomputes every comparison of the store's settings
(knnlm.scoring.settings.SETTING_PAIRS) with its interval over the same documents. Nothing is searched again: a
smaller sample is a subset of the cached rows.
"""
from __future__ import annotations

import logging

import numpy as np

from ..io import read_checked_json
from ..job import Job
from ..search.scope import block_sample
from .common import by_split, scoped_documents

log = logging.getLogger(__name__)


def _subset(sub: dict, lp_lm, words_tok, docs_all, lp_knn, per_tau):
    """The settings' arrays restricted to the sample positions sub {split: [t'] positions into the scored tokens}."""
    lp = {s: lp_lm[s][i] for s, i in sub.items()}
    docs = {}
    for s, i in sub.items():
        doc, _, ids = docs_all[s]
        d, dw, local = scoped_documents(doc, words_tok[s], i)
        docs[s] = (d, dw, ids[local])
    words = {s: int(docs[s][1].sum()) for s in sub}
    knn = {st: {s: v[s][i] for s, i in sub.items()} for st, v in lp_knn.items()}
    sweep = {st: {s: v[s][:, i] for s, i in sub.items()} for st, v in per_tau.items()}
    return lp, words, docs, knn, sweep


def _intervals(job: Job, lp_lm, words, docs, lp_knn, per_tau, taus) -> dict:
    """{split: compare() of the store's settings at the config τ and at τ*} on the given tokens, with {'tau': τ*
    per setting}: the settings job's tuning and intervals (knnlm.experiments.retrieval.tuned_intervals)."""
    from ..scoring.interpolation import temperature_sweep
    from .common import stats_options
    from .retrieval import tuned_intervals

    sweep = temperature_sweep(lp_lm, per_tau, words, taus, job.cfg["temperature"]["lambda_steps"])
    _, tuned, _, ci = tuned_intervals(lp_lm, words, lp_knn, docs, sweep, stats_options(job), job.cfg["knn"]["lambda_steps"])
    return {**ci, "tau": {n: v["tau"] for n, v in tuned.items()}}


def measure(job: Job) -> list[dict]:
    """Rows of table 'sample_size': per fraction of config 'retrieval.sample_rule.fractions' (and 1.0, every token)
    and per split and comparison of SETTING_PAIRS, the tokens and documents, the relative difference with its 95 %
    interval and verdict, the interval's width over its width on every token, and whether the verdict is the
    every-token one. Reads the '-alltokens' store's caches once (load_settings), on the τ grid of its settings
    (input 'settings', extended there while τ* sat on its edge), so that fraction 1.0 gives the settings' own
    intervals. Raises ArtifactError when the store's test tokens are not every token (a smaller sample cannot be
    measured against every token)."""
    from ..config import temperatures
    from ..io import ArtifactError
    from .retrieval import load_settings, scope_file

    if scope_file(job, "test") is not None:
        raise ArtifactError(f"{job.path('settings')}: the store's test tokens are a sample, not every token: measure "
                            "on a run whose Table 3 store scores every test token (retrieval.table3_fraction: 1)")
    rule = job.cfg["retrieval"]["sample_rule"]
    # the store's settings on every token: τ's grid as it was extended there
    done = read_checked_json(job.path("settings"), "settings")
    taus = next(iter(done["tau_sweep"].values()))["tau"] if done.get("tau_sweep") else temperatures(job.cfg)
    lp_lm, words, lp_knn, per_tau, docs, _, _ = load_settings(job, taus)
    words_tok = {}
    for split, path in by_split(job, "documents").items():
        d = np.load(path)
        sc = np.arange(len(d["doc"])) if scope_file(job, split) is None else np.load(scope_file(job, split))
        words_tok[split] = np.asarray(d["words"])[sc]
    ref = None
    rows = []
    for fraction in sorted({*rule["fractions"], 1.0}, reverse=True):
        sub = {s: block_sample(docs[s][0], words_tok[s], fraction, job.cfg["retrieval"]["scope_seed"]) for s in docs}
        lp, w, dd, knn, sw = _subset(sub, lp_lm, words_tok, docs, lp_knn, per_tau)
        ci = _intervals(job, lp, w, dd, knn, sw, taus)
        ref = ref or ci
        log.info("fraction %.2f: %s tokens of test", fraction, len(sub["test"]))
        for split in ("test", "valid"):
            for pair, c in ci[split]["diff"].items():
                r = ref[split]["diff"][pair]
                width, ref_width = c["hi"] - c["lo"], r["hi"] - r["lo"]
                rows.append({"fraction": fraction, "split": split, "comparison": pair, "tokens": len(sub[split]),
                             "documents": c["documents"], "effective documents": round(float(c["effective"]), 1),
                             "difference": c["value"], "CI low": c["lo"], "CI high": c["hi"], "verdict": c["verdict"],
                             "width / every token": width / ref_width if ref_width > 0 else float("nan"),
                             "same verdict": c["verdict"] == r["verdict"],
                             "τ* (a)": ci["tau"].get(pair.split(" vs ")[0].replace(" τ*", ""), float("nan"))})
    return rows


def choose(rows: list[dict], max_ratio: float, split: str = "test") -> float | None:
    """The smallest fraction whose every comparison on `split` has width / every token ≤ max_ratio and the
    every-token verdict, and so has every larger fraction measured (the rule); None when only every token does."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df = df[df["split"] == split]
    ok = df.groupby("fraction").apply(lambda g: bool((g["width / every token"] <= max_ratio + 1e-12).all()
                                                     and g["same verdict"].all()), include_groups=False)
    best = None
    for fraction in sorted(ok.index, reverse=True):
        if not ok[fraction]:
            break
        best = fraction
    return None if best is None or best >= 1.0 else float(best)


def table(job: Job) -> dict:
    """Table 'sample_size' (docs/statistics.md, "How large a sample"): measure(), with the fraction the rule picks at
    each width ratio of 'retrieval.sample_rule.ratios' in the caption; returns what MLflow logs."""
    import pandas as pd

    from ..report.tables import write_table

    rows = measure(job)
    rule = job.cfg["retrieval"]["sample_rule"]
    picks = {r: choose(rows, r) for r in rule["ratios"]}
    df = pd.DataFrame(rows)
    summary = (df[df["split"] == "test"].groupby("fraction")
               .agg(tokens=("tokens", "first"), max_width=("width / every token", "max"),
                    verdicts_kept=("same verdict", "all")).reset_index().sort_values("fraction"))
    said = "; ".join(f"≤ {r:g}× as wide: " + (f"{p:g} of the tokens" if p else "every token") for r, p in picks.items())
    summ = ", ".join(f"{f:g}: {m:.3f}×{'' if k else ' (a verdict changes)'}"
                     for f, m, k in zip(summary["fraction"], summary["max_width"], summary["verdicts_kept"]))
    cap = (f"How large a sample ({job.cfg['name']}): the comparisons of Table 3's store "
           f"({job.wildcards.get('store')}, {job.wildcards.get('key')}/{job.wildcards.get('metric')}) on proportional "
           f"block samples of a fraction of its tokens (test: every token; valid: its tuned tokens), τ and λ tuned on "
           f"each sample's valid tokens; each interval's width over its width on every token, and whether its verdict "
           f"is the every-token one. Widest test interval per fraction: {summ}. The rule picks the smallest fraction "
           f"whose every test comparison stays within the ratio with its verdict: {said}.")
    write_table(df, job.path("csv"), job.path("md"), "How large a sample: interval widths by sample size", cap)
    metrics = {f"fraction_at_{r:g}": (p or 1.0) for r, p in picks.items()}
    return {"metrics": metrics, "artifacts": [job.path("csv"), job.path("md")]}
