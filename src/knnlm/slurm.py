"""Before a SLURM run submits anything: every job's request must fit a node of its partition.

A request that no node of the partition can satisfy (more CPUs, memory or GPUs than its largest node, or a
longer runtime than its time limit) pends forever with reason PartitionConfig while Snakemake waits silently.
The Snakefile's onstart hook (SLURM executor only) reads the partitions with `sinfo` and fails the run with
one line per offending rule, naming the resource, the request and the limit.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

SINFO_FORMAT = "%P|%c|%m|%G|%l"  # partition (default marked *), CPUs per node, memory per node (MB), generic resources, time limit


@dataclass
class Partition:
    """The largest node of a partition: cpus, mem_mb, gpus, and the time limit in minutes (None: unlimited)."""

    cpus: int = 0
    mem_mb: int = 0
    gpus: int = 0
    time_min: float | None = None


def parse_time(text: str) -> float | None:
    """SLURM time limit -> minutes: 'infinite'/'UNLIMITED' -> None; '[days-]hours:minutes:seconds', 'M:S', 'M'."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0.0, parts
    else:
        h, m, s = 0.0, parts[0], 0.0
    return (float(days) * 24 * 60 if days else 0.0) + h * 60 + m + s / 60


def _gpus(gres: str) -> int:
    """GPUs of a node from sinfo's %G, e.g. 'gpu:1', 'gpu:a100:4(S:0-1)', '(null)'."""
    n = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            n += int(m.group(1))
    return n


def parse_sinfo(text: str) -> dict[str, Partition]:
    """{partition: its largest node's resources} from `sinfo -h -o '%R|%c|%m|%G|%l'` lines (one per node group)."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, cpus, mem, gres, limit = line.split("|")
        p = out.setdefault(name.strip(), Partition(time_min=parse_time(limit)))
        p.cpus = max(p.cpus, int(re.sub(r"\D.*", "", cpus) or 0))
        p.mem_mb = max(p.mem_mb, int(re.sub(r"\D.*", "", mem) or 0))
        p.gpus = max(p.gpus, _gpus(gres))
    return out


def sinfo() -> dict[str, Partition]:
    """The cluster's partitions (parse_sinfo of a live `sinfo`). Raises RuntimeError if sinfo fails."""
    r = subprocess.run(["sinfo", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"sinfo failed ({r.returncode}): {r.stderr.strip()}")
    return parse_sinfo(r.stdout)


def unsatisfiable(requests: list[dict], partitions: dict[str, Partition], default: str | None = None) -> list[str]:
    """Messages for the requests no node of their partition can satisfy.

    requests: [{'rule', 'partition' (None: `default`), 'cpus', 'mem_mb', 'gpus', 'runtime' (minutes)}], one per
    rule (values may be None: not requested). Returns one message per violated limit, naming the rule, the
    resource, the request and the partition's limit; [] when every request fits.
    """
    msgs = []
    for r in requests:
        part = r.get("partition") or default
        if part not in partitions:
            msgs.append(f"rule {r['rule']}: partition {part!r} does not exist (cluster has {sorted(partitions)})")
            continue
        p = partitions[part]
        for res, have, unit in (("cpus", p.cpus, "CPUs"), ("mem_mb", p.mem_mb, "MB"), ("gpus", p.gpus, "GPUs"),
                                ("runtime", p.time_min, "min")):
            want = r.get(res)
            if want and have is not None and want > have:
                msgs.append(f"rule {r['rule']}: {res} = {want} {unit} but the largest node of partition {part!r} "
                            f"has {have} {unit}" if res != "runtime" else
                            f"rule {r['rule']}: runtime = {want} min exceeds the time limit of partition {part!r} "
                            f"({have:g} min)")
    return msgs


def check_jobs(jobs) -> None:
    """Raise RuntimeError listing every rule whose request (Snakemake jobs: threads, resources mem_mb, gpu,
    runtime, slurm_partition) no node of its partition can satisfy; the largest request per rule is checked."""
    parts = sinfo()
    default = next((n.rstrip("*") for n in parts if n.endswith("*")), None)
    parts = {n.rstrip("*"): p for n, p in parts.items()}
    per_rule: dict[str, dict] = {}
    for job in jobs:
        res = job.resources
        r = {"rule": job.rule.name, "partition": res.get("slurm_partition") or None, "cpus": job.threads,
             "mem_mb": res.get("mem_mb"), "gpus": res.get("gpu") or 0, "runtime": res.get("runtime")}
        old = per_rule.setdefault(r["rule"], r)
        for k in ("cpus", "mem_mb", "gpus", "runtime"):
            if isinstance(r[k], (int, float)) and (not isinstance(old[k], (int, float)) or r[k] > old[k]):
                old[k] = r[k]
    msgs = unsatisfiable(list(per_rule.values()), parts, default)
    if msgs:
        raise RuntimeError("SLURM: these requests can never be scheduled (edit profiles/slurm/config.yaml or "
                           "the partitions):\n  " + "\n  ".join(msgs))
