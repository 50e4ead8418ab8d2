"""Summarise a finished run: per-job and per-stage wall time, each stage's share, peak memory (Snakemake
benchmark files), the stages' estimate on the other CPU kind (knnlm.report.cost), artifact sizes, MLflow run count.  Usage: python -m knnlm.report results/<config name>
[--results docs/results.md] (then: write that page from the run's findings report, tables and stages)
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pandas as pd

from ..paths import Layout


def stage_table(root: str | Path) -> pd.DataFrame:
    """One row per job: job, wall seconds, peak RSS in MB, from root/benchmarks/*.tsv (Snakemake's `s`, `max_rss`).

    A benchmark file times only a job's last run. A training job that was killed and resumed records only its last
    segment, so for those the wall time is the larger of that and the training time their own logs count across
    resumes (resumed_seconds); column `from_log` marks them."""
    root = Path(root)
    layout = Layout(root.parent, root.name)
    rows = []
    for p in sorted(Path(root, "benchmarks").glob("*.tsv")):
        b = pd.read_csv(p, sep="\t")
        wall, logged = float(b["s"].iloc[-1]), resumed_seconds(layout, p.stem)
        rows.append({"job": p.stem, "wall_s": max(wall, logged or 0.0), "peak_rss_mb": float(b["max_rss"].iloc[-1]),
                     "from_log": bool(logged and logged > wall)})
    return pd.DataFrame(rows, columns=["job", "wall_s", "peak_rss_mb", "from_log"])


def busy_seconds(root: str | Path) -> float:
    """Seconds during which at least one job of the run at `root` was running: the union of the intervals [end − s,
    end] of its benchmark files (Snakemake's `s`, end = the file's modification time, written as the job ends). With
    2+ cores jobs overlap, so this is at most the sum of the jobs' wall times; a pause between a killed run and its
    resumption is not counted. 0.0 without benchmark files."""
    spans = []
    for p in Path(root, "benchmarks").glob("*.tsv"):
        end = p.stat().st_mtime
        spans.append((end - float(pd.read_csv(p, sep="\t")["s"].iloc[-1]), end))
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur is not None and a <= cur[1]:
            cur[1] = max(cur[1], b)
            continue
        total += 0.0 if cur is None else cur[1] - cur[0]
        cur = [a, b]
    return total + (0.0 if cur is None else cur[1] - cur[0])


def resumed_seconds(layout: Layout, job: str) -> float | None:
    """Training seconds over every resumed segment of a training job of the run at `layout`, from what it logs:
    train_lm_<lm> from its fairseq log (knnlm.lm.training.fairseq_log_seconds, each update counted once),
    train_parametric_<lm>_<variant>_<key> from its result.json ('history.seconds', which a resumed training carries
    on). None for other jobs, or when the file is missing."""
    from ..io import read_json
    from ..lm.training import fairseq_log_seconds

    if job.startswith("train_lm_"):
        path = layout.path("log", job=f"{job}.fairseq")
        if path.exists():
            with open(path) as f:
                return fairseq_log_seconds(f)[0]  # each update once: as an uninterrupted run
    elif job.startswith("train_parametric_") and job.count("_") >= 4:
        lm, variant, key = job[len("train_parametric_"):].rsplit("_", 2)
        path = layout.path("parametric_result", lm=lm, variant=variant, key=key)
        if path.exists():
            return float(read_json(path).get("history", {}).get("seconds", 0.0))
    return None


# Stages of a run ("each stage's share"), by the rule that wrote a benchmark file <rule>_<wildcards>.tsv
STAGES = {
    "corpus (data, BPE, binarise, documents, scope)": ["download", "prepare_data", "bpe", "preprocess", "token_lines",
                                                       "documents", "scope", "tuning_sample", "datastore_corpus"],
    "LM training": ["train_lm", "register_hf", "download_lm"],
    "dumps (datastore, queries)": ["dump_datastore", "dump_queries", "dump_queries_hf"],
    "IVFPQ (stores, indexes, FAISS search)": ["prepare_store", "build_index", "search"],
    "exact search and real score": ["exact_search", "exact_search_nested", "exact_merge", "exact_merge_nested",
                                    "real_score"],
    "kNN-LM scoring, τ × λ sweeps, tables": ["score", "settings", "write_table1", "write_table3", "write_table3_small",
                                            "write_datastore_size", "write_temperature", "write_store_table",
                                            "write_pca", "write_variance", "write_findings", "write_table4",
                                            "write_probe_sweep", "write_speed"],
    "parametric alternatives": ["word_stats", "train_parametric", "write_parametric"],
    "App. D, App. E (which words, rejected hypotheses)": ["write_which_words", "write_hypotheses",
                                                         "write_interpolated_loss", "write_ensembling",
                                                         "write_overfitting", "write_soft_labels"],
    "beyond the paper (token gains, λ by quality, adaptive retrieval, k, leakage, n-grams)": [
        "token_features", "write_token_gains", "write_lambda_by_quality", "write_adaptive_retrieval", "write_k_sweep",
        "write_leakage", "write_ngram"],
    "beyond the paper: RetoMaton (fewer searches)": ["write_retomaton"],
    "beyond the paper: greedy merging (a smaller datastore)": ["datastore_neighbours", "write_pruning"],
    "beyond the paper: generation (entropy by decoding step)": ["write_generation"],
    "beyond the paper: regime map (trends toward the paper's regime)": ["write_regime", "write_findings_regime"],
    "pretrained LMs (checked and copied)": ["pretrained_lm"],
}


def rule_of(job: str) -> str:
    """The rule of a benchmark file stem '<rule>_<wildcards>' (the longest known rule name it starts with)."""
    rules = sorted((r for rs in STAGES.values() for r in rs), key=len, reverse=True)
    return next((r for r in rules if job == r or job.startswith(r + "_")), job.split("_")[0])


def stage_shares(df: pd.DataFrame) -> pd.DataFrame:
    """Per stage: jobs, wall minutes, share of the total, slowest job and max peak RSS, from stage_table()."""
    stage = {r: st for st, rs in STAGES.items() for r in rs}
    d = df.assign(stage=[stage.get(rule_of(j), "other") for j in df["job"]])
    total = d["wall_s"].sum()
    rows = []
    for st in list(STAGES) + ["other"]:
        g = d[d["stage"] == st]
        if len(g):
            slow = g.loc[g["wall_s"].idxmax()]
            rows.append({"stage": st, "jobs": len(g), "wall (min)": g["wall_s"].sum() / 60,
                         "share": f"{100 * g['wall_s'].sum() / total:.1f} %",
                         "slowest job": f"{slow['job']} ({slow['wall_s'] / 60:.1f} min)",
                         "peak RSS (MB)": g["peak_rss_mb"].max()})
    rows.append({"stage": "total", "jobs": len(d), "wall (min)": total / 60, "share": "100 %", "slowest job": "",
                 "peak RSS (MB)": d["peak_rss_mb"].max()})
    return pd.DataFrame(rows)


# Budgets: the paper's main tables on the primary LM (Tables 1-3, Figures 2-5, the parametric tables,
# the findings) are timed against the run-time target; what goes beyond them is budgeted separately.
MAIN_BUDGET = "main tables (primary LM)"
EXTRA_BUDGETS = {"lm": "extra LMs (Table 4, App. A; App. E.5, E.6.1, E.6.2)", "pca": "PCA-reduced stores (He et al. 2021)",
                 "variance": "our randomness (IVFPQ seeds, subset draws)",
                 "probe_sweep": "approximation strength (probe sweep)"}


def budget_of(job: str, primary: str, lms: set[str]) -> str:
    """The budget a job's time counts against: MAIN_BUDGET or one of EXTRA_BUDGETS' values.

    job: a benchmark file stem '<rule>_<wildcards>' ('<rule>_<lm>_<store>_...' for per-store rules); primary: the
    LM the findings report is about; lms: every LM of the run (their train_lm/register_hf jobs). A job of another
    LM, or Table 4, App. E.5's Table 8, E.6.1's Table 9 or E.6.2's table itself, is an extra LM's; a job of a PCA store
    ('pca<d>') or of the 'variance' table, an IVFPQ seed ('-ivf<k>') or a subset draw ('-draw<k>';
    knnlm.datastore.stores) is an extra of its kind, as is a point of the probe sweep ('-np<n>') and its table."""
    rule = rule_of(job)
    parts = job[len(rule) + 1:].split("_") if job.startswith(rule + "_") else []
    if rule in ("write_table4", "write_ensembling", "write_overfitting", "write_soft_labels") or (parts and parts[0] in lms - {primary}):
        return EXTRA_BUDGETS["lm"]
    if any(p.startswith("pca") for p in parts):
        return EXTRA_BUDGETS["pca"]
    if any("-ivf" in p or "-draw" in p or p == "variance" for p in parts):
        return EXTRA_BUDGETS["variance"]
    if rule == "write_probe_sweep" or any(re.search(r"-np\d+", p) for p in parts):
        return EXTRA_BUDGETS["probe_sweep"]
    return MAIN_BUDGET


def budget_shares(df: pd.DataFrame) -> pd.DataFrame:
    """Per budget (budget_of): jobs, wall minutes and share of the total, from stage_table(); the primary LM is the
    one of the run's write_findings job (else the LM with the most jobs)."""
    lms = {j[len(rule_of(j)) + 1:] for j in df["job"] if rule_of(j) in ("train_lm", "register_hf", "pretrained_lm")}
    findings = [j[len("write_findings_"):] for j in df["job"] if j.startswith("write_findings_")]
    firsts = pd.Series([j[len(rule_of(j)) + 1:].split("_")[0] for j in df["job"]])
    primary = findings[0] if findings else (firsts[firsts.isin(lms)].mode().iloc[0] if firsts.isin(lms).any() else "")
    b = df.assign(budget=[budget_of(j, primary, lms) for j in df["job"]])
    total = b["wall_s"].sum()
    secs = b.groupby("budget")["wall_s"].sum()
    rows = [{"budget": name, "jobs": int((b["budget"] == name).sum()), "wall (min)": secs[name] / 60,
             "share": f"{100 * secs[name] / total:.1f} %"}
            for name in [MAIN_BUDGET, *EXTRA_BUDGETS.values()] if name in secs.index]
    rows.append({"budget": "total", "jobs": len(b), "wall (min)": total / 60, "share": "100 %"})
    return pd.DataFrame(rows)


def other_kind_estimate(root: Path, jobs: pd.DataFrame, rate: float | None = None):
    """(the stages on the other CPU kind, knnlm.report.cost.other_kind_table; this machine's kind; its GEMM rate;
    the stage work) of the run at root, or None where this machine is of neither kind or not of the kind that ran
    the run's exact searches. rate: this machine's fp32 GEMM GFLOP/s (None: measured now, cost.gemm_rate)."""
    from . import cost

    _, _, cpus = cost.exact_work(root)
    here = cost.kind_of_this_machine()
    run_kinds = {cost.cpu_kind(c) for c in cpus}
    if here is None or (run_kinds and run_kinds != {here}):
        return None
    rate = rate if rate is not None else cost.gemm_rate(threads=len(os.sched_getaffinity(0)))
    work, _ = cost.stage_work(root, rate, here)
    return cost.other_kind_table(stage_shares(jobs), work, here), here, rate, work


def other_kind_section(root: Path, jobs: pd.DataFrame, rate: float | None = None, est=None) -> str:
    """Markdown: the run's stages on the other CPU kind by knnlm.report.cost (measured minutes here, GEMM work, the
    estimate there), with the rates used, and the run's elapsed time here and there; rate: this machine's fp32 GEMM
    GFLOP/s (None: measured now, knnlm.report.cost.gemm_rate); est: other_kind_estimate's result when already
    computed. A sentence instead where this machine is not of the kind that ran the run's exact searches, or of
    neither kind."""
    from . import cost

    est = est if est is not None else other_kind_estimate(root, jobs, rate)
    if est is None:
        _, _, cpus = cost.exact_work(root)
        return (f"No estimate for the other CPU kind: the run's exact searches ran on {', '.join(sorted(cpus)) or '?'}, "
                f"this machine is {cost.kind_of_this_machine() or 'of neither kind'}; run the report where the run ran.")
    df, here, rate, work = est
    _, _, cpus = cost.exact_work(root)
    cores = len(os.sched_getaffinity(0))
    other = next(k for k in cost.REFERENCE_RATES if k != here)
    ref = cost.REFERENCE_RATES[other]
    table = df.to_markdown(index=False, floatfmt=".1f")
    total = df.iloc[-1]
    f_exact, s_exact, _ = work[cost.EXACT_STAGE]
    exact_rate = f"{f_exact / s_exact / 1e9:.0f} GFLOP/s" if s_exact else "none run"
    busy = busy_seconds(root) / 60
    delta = total[f"estimate on {other} (min)"] - total["measured here (min)"]
    return (f"This run's CPU: {', '.join(sorted(cpus)) or here}. The exact searches' own rate here (their flops over "
            f"their seconds): {exact_rate}; on {other}: {cost.EXACT_RATES[other]:.0f} GFLOP/s (measured there at the main "
            f"job's shape). fp32 GEMM through the jobs' BLAS ({cores} threads, {' × '.join(map(str, cost.SHAPE))}) "
            f"measured here when the report was written: {rate:.0f} GFLOP/s; on {other}: {ref['gflops']:.0f} GFLOP/s "
            f"({ref['cpu']}), for the parametric trainings' row scores. A stage's estimate there is its measured time "
            f"less its GEMM work's time here plus that work at the other kind's rate (knnlm.report.cost; the rest of "
            f"each stage is taken as CPU-independent).\n\n{table}\n\nElapsed with a job running: {busy:.1f} min here "
            f"(the jobs' wall times sum to {total['measured here (min)']:.1f}: with 2 cores some overlap); on {other}: "
            f"{busy:.1f} {delta:+.1f} = {busy + delta:.1f} min (the GEMM-bound jobs hold every core, so their "
            f"difference adds to the elapsed time).")


def budget_section(root: Path, jobs: pd.DataFrame, est) -> str:
    """Markdown: each target's job time against its budgets (knnlm.report.budget.target_lines: measured on this CPU
    kind, estimated on the other by est's stage factors, other_kind_estimate) and whether the run was timed on an
    idle machine (knnlm.report.budget.contention)."""
    from . import budget, cost

    c = budget.contention(root, jobs)
    measured = c["covered"] is not None and c["covered"] >= 0.99
    cover = ("" if c["covered"] is None else f" The measured invocations cover {100 * c['covered']:.0f} % of the "
             f"jobs' wall time" + ("." if measured else ": the rest ran in invocations that recorded no readings, so "
                                    "the times pass no budget."))
    if c["other_share"] is None:
        idle = ("Contention: not measured (no finished local invocation recorded its CPU readings"
                + (f"; {c['unmeasured']} unmeasured" if c["unmeasured"] else "") + ").")
    else:
        idle = (f"Contention: over {c['invocations']} invocation(s) the machine was busy {c['machine_cpu_min']:.1f} "
                f"CPU-min, of which Snakemake and its jobs used {c['run_cpu_min']:.1f}: other processes took "
                f"{100 * c['other_share']:.1f} % " + ("(more than" if c["contended"] else "(at most")
                + f" {100 * budget.CONTENDED:.0f} %: the run is " + ("**contended**: its times are upper bounds and "
                "pass no budget)." if c["contended"] else "idle enough for its times to count).")
                + (f" {c['unmeasured']} invocation(s) unmeasured (killed, on a cluster or without /proc/stat)."
                   if c["unmeasured"] else ""))
    if est is None:
        factors, here = {}, cost.kind_of_this_machine()
    else:
        df, here, _, _ = est
        other = next(k for k in cost.REFERENCE_RATES if k != here)
        factors = {r["stage"]: r[f"estimate on {other} (min)"] / r["measured here (min)"]
                   for _, r in df.iterrows() if r["stage"] != "total" and r["measured here (min)"] > 0}
    stage = {r: st for st, rs in STAGES.items() for r in rs}
    lines = budget.target_lines(jobs, factors, lambda j: stage.get(rule_of(j), "other"), rule_of, here,
                                budget.budgets_of(root), c["contended"], measured, budget.regime_only_jobs(root, jobs))
    return (f"{lines.to_markdown(index=False, floatfmt='.1f')}\n\nEach target's job time is the sum of its jobs' "
            f"wall times (knnlm.report.budget.target_of: 'extras' counts its own jobs and the follow-ups'; 'regime' "
            f"the map's job and every job of an invocation of 'regime' alone, its cost beyond 'all'); the "
            f"estimate on the other kind scales each stage as the table below does. Budgets: config 'budget'. "
            f"{idle}{cover}")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def results_page(root: Path, lm: str = "base", gemm_rate: float | None = None) -> str:
    """The results page of run `root` (docs/results.md for the wikitext2 run): its findings report (headings
    demoted), the PCA and Table 4 tables, and the wall time per stage and per budget, quoted from the files the
    run wrote, so that no number in it is typed by hand, and the stages' estimate on the other CPU kind
    (other_kind_section; gemm_rate as there). Raises FileNotFoundError when the run has neither a findings report
    nor Table 1."""
    import platform

    layout = Layout(root.parent, root.name)
    findings = layout.path("findings", lm=lm)
    quoted = [findings] if findings.exists() else [p for p in (layout.path("table", lm=lm, table=t, ext="md")
                                                               for t in ("table1", "table3")) if p.exists()]
    quoted += [p for p in (layout.path("table", lm=lm, table="pca", ext="md"),
                           layout.path("run_table", table="table4", ext="md")) if p.exists()]
    if not quoted:
        raise FileNotFoundError(f"{findings}: no findings report and no Table 1; run `snakemake findings` first")
    parts = [] if findings.exists() else ["**The findings report is not produced yet** (the run is incomplete); "
                                          "quoted instead: the tables that are."]
    if summary_figure(root, lm).exists():  # copied beside the page by write_results_page
        parts.append(f"![The verdict of each findings row, by part of the paper]({SUMMARY_FIGURE})\n\n"
                     f"*The verdicts by part of the paper (`{summary_figure(root, lm).relative_to(root.parent)}`; what "
                     "each verdict means: [verdicts.md](verdicts.md)).*")
    for p in quoted:
        text = ("\n" + p.read_text()).replace("\n### ", "\n#### ").replace("\n## ", "\n### ").replace("\n# ", "\n## ")
        parts.append(text.strip())
    jobs = stage_table(root)
    est = other_kind_estimate(root, jobs, gemm_rate)
    stages = stage_shares(jobs).to_markdown(index=False, floatfmt=".1f")
    budgets = budget_shares(jobs).to_markdown(index=False, floatfmt=".1f")
    resumed = ("; resumed training timed from its own logs over every segment: " + ", ".join(jobs.job[jobs.from_log])
               if jobs["from_log"].any() else "")
    src = ", ".join(f"`{p.relative_to(root.parent)}`" for p in quoted)
    cores = len(os.sched_getaffinity(0))
    return (f"# Results of the `{root.name}` run\n\n"
            f"Written by `python -m knnlm.report {root} --results <this file>` from {src} and the run's benchmark "
            f"files; no number here is typed by hand. Every table with its intervals is under `{root}/lms/{lm}/"
            f"tables/`, and `snakemake --report` renders them with their captions. Machine of the report: "
            f"{platform.processor() or platform.machine()}, {cores} cores.\n\n" + "\n\n".join(parts) + "\n\n"
            f"## Budgets per target\n\n{budget_section(root, jobs, est)}\n\n"
            f"## Wall time per stage (sum of the jobs' wall times from `benchmarks/*.tsv`{resumed})"
            f"\n\n{stages}\n\n"
            f"The same jobs by what they serve (the paper's main tables on the primary LM, and each extra):\n\n{budgets}\n\n"
            f"## The same stages on the other CPU kind (estimate)\n\n{other_kind_section(root, jobs, gemm_rate, est)}\n")


SUMMARY_FIGURE = "findings_summary.png"  # beside the results page: the findings job's figure of the verdicts


def summary_figure(root: Path, lm: str = "base") -> Path:
    """The findings job's summary figure of run `root` (the verdicts by part of the paper)."""
    return Layout(root.parent, root.name).path("figure", lm=lm, figure="findings_summary", ext="png")


def write_results_page(out: Path, root: Path) -> None:
    """Write results_page(root) to `out` and the run's findings summary figure beside it (SUMMARY_FIGURE), each
    atomically."""
    import shutil

    from ..io import atomic_path

    text = results_page(root)
    if summary_figure(root).exists():
        with atomic_path(Path(out).with_name(SUMMARY_FIGURE)) as tmp:
            shutil.copyfile(summary_figure(root), tmp)
    with atomic_path(out) as tmp:
        tmp.write_text(text)


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m knnlm.report",
                                description="A run's measured job times by stage and budget, their estimate on the "
                                            "other CPU kind, and its disk use; with --results, its results page.")
    p.add_argument("root", type=Path, help="the run's folder: <results_dir>/<name>, e.g. results/wikitext2")
    p.add_argument("--results", type=Path, metavar="PAGE", help="write the results page (e.g. docs/results.md)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    root = args.root
    if not (root / "benchmarks").is_dir():
        p.error(f"{root}: expected a run's folder with benchmarks/ (<results_dir>/<name>), found none")
    if args.results:
        write_results_page(args.results, root)
        print(f"wrote {args.results} from {root}")
        return
    layout = Layout(root.parent, root.name)
    df = stage_table(root)
    print(df.to_markdown(index=False, floatfmt=".1f"))
    if df["from_log"].any():
        print("\nresumed training jobs, timed from their own logs over every segment: "
              + ", ".join(df.job[df.from_log]))
    print(f"\ntotal wall time of all jobs: {df['wall_s'].sum() / 60:.1f} min; elapsed with a job running: "
          f"{busy_seconds(root) / 60:.1f} min; max peak RSS {df['peak_rss_mb'].max():.0f} MB")
    print("\nStages (sum of job wall times; with 2+ cores some jobs overlap):\n")
    print(stage_shares(df).to_markdown(index=False, floatfmt=".1f"))
    print("\nBy what the jobs serve (the paper's main tables on the primary LM, and each extra):\n")
    print(budget_shares(df).to_markdown(index=False, floatfmt=".1f"))
    est = other_kind_estimate(root, df)
    print("\nBudgets per target:\n")
    print(budget_section(root, df, est))
    print("\nThe same stages on the other CPU kind (estimate):\n")
    print(other_kind_section(root, df, est=est))
    for lm_dir in sorted((layout.root / "lms").glob("*")):
        for sub in sorted(p for p in lm_dir.iterdir() if p.is_dir()):
            print(f"{sub.relative_to(layout.root)}: {dir_size(sub) / 2**20:.1f} MiB on disk")
        for store in sorted((lm_dir / "stores").glob("*")):
            print(f"  {store.relative_to(layout.root)}: {dir_size(store) / 2**20:.1f} MiB")
    try:
        from ..tracking import count_runs

        print(f"MLflow runs in experiment {root.name!r}: {count_runs(root.parent, root.name)}")
    except Exception as e:  # noqa: BLE001
        print(f"MLflow: {e}")


if __name__ == "__main__":
    main()
