"""Entry point of every Snakemake job: `python -m knnlm <module>.<job> --threads N --cfg JSON --io JSON`.

A thin dispatcher. A job is a plain function `job(j: Job) -> dict | None` in an experiment module
knnlm.experiments.<module> (spine, retrieval, table1, datastore_size, temperature, parametric, ...); adding
a module adds its jobs, with no registry to edit. --cfg carries the config sections the rule depends on (its
`params.cfg`), --io the rule's named `input:` and `output:` files and its wildcards (built by
workflow/rules/common.smk), so a job reads exactly the files Snakemake knows about and never rebuilds a path.
What the job returns ({'metrics', 'step_metrics', 'artifacts', 'params'}) is logged as one MLflow run
(knnlm.tracking.log_run), with the config sections as params and the job ('<module>.<job>', the tag 'rule')
and wildcards as tags.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("knnlm")

@dataclass
class Job:
    """One job: cfg (the config sections its rule passes), input / output ({name: path or [paths]}, as the
    rule's named `input:` / `output:`), wildcards, extra (named paths that are neither, e.g. a resumable work
    dir), threads (as Snakemake schedules them), rule (the job name, an MLflow tag)."""

    cfg: dict
    input: dict = field(default_factory=dict)
    output: dict = field(default_factory=dict)
    wildcards: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    threads: int = 1
    rule: str = ""
    run_id: str | None = None  # the MLflow run, once the job logged a live curve point (curve)
    live: set = field(default_factory=set)  # the metrics logged live (not logged again at the end)

    def curve(self, step: int, values: dict[str, float]) -> None:
        """Log points of a training curve to the job's MLflow run while the job runs (LM and parametric training).

        The run is opened at the first point, or reopened when a killed attempt of this job left one RUNNING, so a
        resumed job still has one run (knnlm.tracking.open_job_run); the job's end finishes it (run_job)."""
        from .tracking import log_points, open_job_run

        if self.run_id is None:
            self.run_id = open_job_run(self.cfg, self.rule, self.wildcards) or ""  # "": the store refused, no retry
        if self.run_id:
            log_points(self.cfg, self.run_id, step, values)
            self.live.update(values)

    def path(self, name: str) -> Path:
        """The input or output file `name` (outputs first); KeyError naming the rule's files otherwise."""
        for files in (self.output, self.input):
            if name in files:
                v = files[name]
                if isinstance(v, list):
                    raise KeyError(f"rule {self.rule}: {name!r} is a list of {len(v)} files; use paths()")
                return Path(v)
        raise KeyError(f"rule {self.rule}: no input or output named {name!r} (inputs {sorted(self.input)}, "
                       f"outputs {sorted(self.output)})")

    def paths(self, name: str) -> list[Path]:
        """The input or output `name` as a list of paths (one file gives a list of one)."""
        v = self.output.get(name, self.input.get(name))
        if v is None:
            raise KeyError(f"rule {self.rule}: no input or output named {name!r}")
        return [Path(p) for p in (v if isinstance(v, list) else [v])]


def resolve(name: str):
    """The job function of '<module>.<function>' in knnlm.experiments; ValueError naming what exists otherwise."""
    import pkgutil

    from . import experiments

    module, _, fn = name.partition(".")
    modules = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if m.name != "common")
    if module not in modules or not fn:
        raise ValueError(f"job {name!r}: expected <module>.<function> with module one of {modules}")
    mod = importlib.import_module(f"knnlm.experiments.{module}")
    if not callable(getattr(mod, fn, None)):
        raise ValueError(f"job {name!r}: knnlm.experiments.{module} has no function {fn!r}")
    return getattr(mod, fn)


def run_job(name: str, job: Job) -> dict:
    """Run job `name` ('<module>.<function>') and log its MLflow run; returns what the job returned."""
    from .tracking import log_run

    fn = resolve(name)
    start = time.time()
    params = {k: v for k, v in job.cfg.items() if k not in ("name", "results_dir", "threads")}
    try:
        out = fn(job) or {}
    except BaseException as e:  # the job failed (or was interrupted): a FAILED run says so, then re-raise
        try:
            log_run(job.cfg, job.rule or name, job.wildcards, params=params, start_time=start, status="FAILED",
                    error=f"{type(e).__name__}: {e}", run_id=job.run_id or None)
        except Exception as log_err:  # noqa: BLE001 - never hide the job's own error behind a logging one
            logging.getLogger(__name__).warning("MLflow: could not log the FAILED run: %s", log_err)
        raise
    params.update(out.get("params", {}))
    steps = {k: v for k, v in (out.get("step_metrics") or {}).items() if k not in job.live}
    log_run(job.cfg, job.rule or name, job.wildcards, params=params, metrics=out.get("metrics"),
            step_metrics=steps, artifacts=out.get("artifacts", ()), start_time=start,
            run_id=job.run_id or None)
    return out


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="knnlm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="<module>.<function> in knnlm.experiments, e.g. table1.score")
    p.add_argument("--cfg", required=True, help="JSON of the config sections the rule uses (validated by the Snakefile)")
    p.add_argument("--io", default="{}", help='JSON {"input": {...}, "output": {...}, "wildcards": {...}, "extra": {...}}')
    p.add_argument("--threads", type=int, default=1, help="threads Snakemake gave the job")
    args = p.parse_args(argv)
    # every library the job imports (torch, faiss, numpy's BLAS) uses the threads Snakemake scheduled, no more
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")  # a busy machine must not change MKL's thread count (and sums)
    io = json.loads(args.io)
    job = Job(cfg=json.loads(args.cfg), input=io.get("input", {}), output=io.get("output", {}),
              wildcards=io.get("wildcards", {}), extra=io.get("extra", {}), threads=args.threads, rule=args.job)
    run_job(args.job, job)


if __name__ == "__main__":
    main(sys.argv[1:])
