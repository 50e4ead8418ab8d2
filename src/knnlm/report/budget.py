"""The time budgets a run is checked against, per target, and whether its timing was made on an idle machine.

Targets: 'all' (every table, figure and findings row of Xu et al. 2023 and the follow-up claims tested in it),
'extras' (our own robustness checks, the second IVFPQ seed, the subset draws and the probe sweep, and the costliest
follow-ups), 'followups' (RetoMaton, greedy merging, generation: part of 'extras') and 'regime' (the regime map,
its cost beyond 'all': the jobs an invocation that targets only 'regime' runs, after 'all', and the map's own job).
Each job of a run counts against the target that needs it (target_of). The budgets, minutes of job time per CPU kind, are config 'budget'.

Honest timing: every local Snakemake invocation records, at its start and end (invocation_start,
invocation_end, called by the Snakefile's onstart / onsuccess / onerror), the machine's busy CPU time from
/proc/stat and the CPU time the invocation and its jobs used (getrusage of the Snakemake process, its own and its
reaped children's). Over the run's invocations, the share of the machine's busy CPU time that other processes
took is the run's contention; above CONTENDED (10 %) the run's times are marked contended and cannot pass a budget.
"""
from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

INVOCATION_ENV = "KNNLM_INVOCATION_RECORD"  # the record of the running invocation (set by the Snakefile's onstart)
CONTENDED = 0.10  # other processes' share of the machine's busy CPU time above which a run is contended
TARGETS = ("all", "extras", "followups", "regime")
FOLLOWUP_RULES = ("write_retomaton", "datastore_neighbours", "write_pruning", "write_generation")
REGIME_RULES = ("write_regime", "write_findings_regime")


def machine_cpu_seconds(stat: str = "/proc/stat") -> float:
    """Busy CPU seconds of the whole machine since boot: the 'cpu' line of /proc/stat (user, nice, system, irq,
    softirq, steal; idle and iowait left out) over the clock tick. Raises OSError when the file cannot be read,
    ValueError when it has no 'cpu' line."""
    with open(stat) as f:
        line = next((l for l in f if l.startswith("cpu ")), None)
    if line is None:
        raise ValueError(f"{stat}: no 'cpu' line")
    v = [int(x) for x in line.split()[1:]]
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user nice system (idle iowait) irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of every child it has reaped (for Snakemake: its jobs)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _reading() -> dict:
    """{'time', 'machine_cpu_s', 'own_cpu_s'} now (machine_cpu_s None where /proc/stat cannot be read)."""
    try:
        busy = machine_cpu_seconds()
    except (OSError, ValueError):
        busy = None
    return {"time": time.time(), "machine_cpu_s": busy, "own_cpu_s": own_cpu_seconds()}


def _layout(root: str | Path):
    from ..paths import Layout

    return Layout(Path(root).parent, Path(root).name)


def invocation_start(root: str | Path, targets: list[str], budget: dict | None = None, local: bool = True) -> Path:
    """Record the start of one Snakemake invocation of the run at root (artifact 'invocation',
    <root>/invocations/<time>-<pid>.invocation.json): its targets, the config's budgets (config 'budget'), whether
    its jobs run on this machine (`local`; a cluster's jobs cannot be measured here), the CPU model and the first
    reading. Returns the record's path (written atomically)."""
    from ..io import machine, write_json

    start = _reading()
    path = _layout(root).path("invocation",
                              stamp=f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(start['time']))}-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"targets": list(targets), "budget": budget, "local": local, "cpu": machine()["cpu"], "cores": os.cpu_count(),
                      "start": start, "end": None})
    return path


def invocation_end(path: str | Path, ok: bool) -> None:
    """Add the end reading and the outcome to the record `path` of invocation_start (atomically)."""
    from ..io import read_json, write_json

    rec = read_json(path)
    rec.update(end=_reading(), ok=ok)
    write_json(path, rec)


def contention(root: str | Path, jobs=None) -> dict:
    """How idle the machine was while the run at root ran: over its finished local invocations, {'invocations',
    'machine_cpu_min' (the machine's busy CPU minutes over their spans), 'run_cpu_min' (what Snakemake and its jobs
    used), 'other_share' (the rest's share of the busy time, 0 when the machine was idle otherwise), 'contended'
    (other_share > CONTENDED), 'unmeasured' (invocations without both readings: killed, on a cluster, or without
    /proc/stat), 'covered' (with `jobs`, knnlm.report.times.stage_table(): the share of the jobs' wall time whose job
    ended inside a measured invocation, by its benchmark file's time; None without)}. With no measured invocation,
    other_share is None and contended False."""
    from ..io import read_json

    machine_s = run_s = 0.0
    n = unmeasured = 0
    spans = []
    for _, p in _layout(root).find("invocation"):
        rec = read_json(p)
        a, b = rec.get("start") or {}, rec.get("end") or {}
        if not rec.get("local", True) or a.get("machine_cpu_s") is None or b.get("machine_cpu_s") is None:
            unmeasured += 1
            continue
        n += 1
        spans.append((a["time"], b["time"]))
        machine_s += b["machine_cpu_s"] - a["machine_cpu_s"]
        run_s += b["own_cpu_s"] - a["own_cpu_s"]
    share = max(0.0, 1.0 - run_s / machine_s) if machine_s > 0 else None
    covered = None
    if jobs is not None and len(jobs):
        bench = _layout(root)
        ends = [bench.path("benchmark", job=j).stat().st_mtime if bench.path("benchmark", job=j).exists() else None
                for j in jobs["job"]]
        inside = [e is not None and any(a <= e <= b for a, b in spans) for e in ends]
        total = float(jobs["wall_s"].sum())
        covered = float(jobs["wall_s"][inside].sum()) / total if total > 0 else 1.0
    return {"invocations": n, "machine_cpu_min": machine_s / 60, "run_cpu_min": run_s / 60, "other_share": share,
            "contended": bool(share is not None and share > CONTENDED), "unmeasured": unmeasured, "covered": covered}


def regime_only_jobs(root: str | Path, jobs) -> set[str]:
    """The jobs (of `jobs`, knnlm.report.times.stage_table()) that an invocation targeting only 'regime' ran: those
    whose benchmark file was written inside the span of such an invocation's record (invocation_start). Run
    `snakemake all` first and then `snakemake regime` for these to be the regime map's cost beyond 'all'; an
    invocation of both targets leaves the shared jobs to 'all'."""
    from ..io import read_json

    spans = []
    for _, p in _layout(root).find("invocation"):
        rec = read_json(p)
        if rec.get("targets") and set(rec["targets"]) <= {"regime"} and (rec.get("start") or {}).get("time"):
            spans.append((rec["start"]["time"], (rec.get("end") or {}).get("time", float("inf"))))
    if not spans:
        return set()
    lay = _layout(root)
    out = set()
    for j in jobs["job"]:
        b = lay.path("benchmark", job=j)
        if b.exists() and any(a <= b.stat().st_mtime <= e for a, e in spans):
            out.add(j)
    return out


def target_of(job: str, rule: str, regime_only: bool = False) -> str:
    """The target whose budget a job's time counts against, from its benchmark file stem '<rule>_<wildcards>' and
    its rule (knnlm.report.times.rule_of): 'regime' for the regime map's job and for every job that an invocation
    targeting only 'regime' ran (`regime_only`, from regime_only_jobs); 'followups' for the jobs of RetoMaton, greedy
    merging and generation; 'extras' for our robustness checks (a store of another IVFPQ seed '-ivf<k>', another
    subset draw '-draw<k>', a probe count '-np<n>', and their tables 'variance' and 'probe_sweep'); 'all' for every
    other job."""
    if regime_only or rule in REGIME_RULES:
        return "regime"
    if rule in FOLLOWUP_RULES:
        return "followups"
    parts = job[len(rule) + 1:].split("_") if job.startswith(rule + "_") else []
    if rule in ("write_probe_sweep", "write_variance") or any(
            "-ivf" in p or "-draw" in p or re.search(r"-np\d+", p) or p in ("variance", "probe_sweep") for p in parts):
        return "extras"
    return "all"


def budgets_of(root: str | Path) -> dict:
    """{target: {kind: minutes or None}}: config 'budget' as the run's latest invocation recorded it
    (invocation_start), else the schema's defaults (knnlm.config.section_defaults)."""
    from ..config import section_defaults
    from ..io import read_json

    recs = [p for _, p in _layout(root).find("invocation")]
    got = read_json(recs[-1]).get("budget") if recs else None
    base = section_defaults("budget")
    return {t: {**base.get(t, {}), **((got or {}).get(t) or {})} for t in TARGETS}


def target_lines(jobs, factors: dict[str, float], stage_of, rule_of, kind_here: str | None,
                 budgets: dict, contended: bool, measured: bool = True, regime_jobs: set[str] = frozenset()):
    """One row per target: its jobs, the measured job minutes here, the estimate on the other CPU kind, each
    against its budget, and the outcome.

    jobs: knnlm.report.times.stage_table(); factors: {stage: estimate there / measured here} (from
    knnlm.report.cost.other_kind_table; a stage without one keeps its time); stage_of: job -> stage; rule_of: job ->
    its rule (knnlm.report.times.rule_of); kind_here:
    'intel' | 'amd' | None; budgets: budgets_of(); contended: contention()['contended']; measured: whether the
    invocations' readings cover the run's jobs (contention()['covered'] ≥ 0.99); regime_jobs: regime_only_jobs().
    'extras' counts its own jobs and
    the follow-ups'. Outcome: 'pass' when every known budget holds, 'FAIL' when one does not, 'contended (no
    verdict)' when the run was contended and its times pass, 'unmeasured (no verdict)' when they pass but the
    machine's idleness was not measured over the jobs, 'incomplete (no verdict)' when they pass but 'all' has no
    findings job, 'no budget' when none applies, 'not run' for a target other than 'all' without a job in the run."""
    import pandas as pd

    other = {"intel": "amd", "amd": "intel"}.get(kind_here or "")
    t = jobs.assign(target=[target_of(j, rule_of(j), j in regime_jobs) for j in jobs["job"]], stage=[stage_of(j) for j in jobs["job"]])
    t["there_s"] = [w * factors.get(s, 1.0) for w, s in zip(t["wall_s"], t["stage"])]
    rows = []
    for target in TARGETS:
        g = t[t["target"].isin(["extras", "followups"] if target == "extras" else [target])]
        here, there = g["wall_s"].sum() / 60, g["there_s"].sum() / 60
        b_here = budgets.get(target, {}).get(kind_here) if kind_here else None
        b_there = budgets.get(target, {}).get(other) if other else None
        fails = [(v, b) for v, b in ((here, b_here), (there, b_there)) if b is not None and v > b]
        known = [b for b in (b_here, b_there) if b is not None]
        complete = target != "all" or any(r == "write_findings" for r in map(rule_of, g["job"]))
        outcome = ("not run" if g.empty and target != "all" else "no budget" if not known else "FAIL" if fails
                   else "contended (no verdict)" if contended else "unmeasured (no verdict)" if not measured
                   else "incomplete (no verdict)" if not complete else "pass")
        rows.append({"target": target, "jobs": len(g), f"measured on {kind_here or '?'} (min)": here,
                     "budget here (min)": b_here if b_here is not None else "-",
                     f"estimate on {other or '?'} (min)": there,
                     "budget there (min)": b_there if b_there is not None else "-", "outcome": outcome})
    return pd.DataFrame(rows)
