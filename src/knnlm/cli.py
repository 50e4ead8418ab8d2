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
import faulthandler
import importlib
import json
import logging
import os
import sys
import time

from .job import Job

log = logging.getLogger("knnlm")


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


def _files(named: dict) -> list[str]:
    return [p for v in named.values() for p in (v if isinstance(v, list) else [v]) if p]


def verify_inputs(job: Job) -> int:
    """Check every named input of `job` against its checksum record (knnlm.io.verify_checksum; every output of a job of
    this pipeline has one) before the job reads it. A file outside the run's folder without one (a corpus, a
    published LM) is read as it is; one under the run's folder without one is an error: it was not written by a
    finished job of this pipeline (copied in by hand, or its record deleted), so nothing vouches for it. Returns how
    many were checked. Raises ArtifactError naming the file, the job that reads it and the commands that make it
    trustworthy: rerun the job that makes it (snakemake -R <file>, which reruns what rests on it too) or adopt the
    file as it is (python -m knnlm.adopt <file>: checked and recorded)."""
    from pathlib import Path

    from .io import verify_checksum

    root = Path(job.cfg["results_dir"], job.cfg["name"]).resolve() if "results_dir" in job.cfg and "name" in job.cfg else None
    n = 0
    for p in _files(job.input):
        path = Path(p)
        if not path.exists():
            continue  # the reader names it
        in_run = root is not None and path.resolve().is_relative_to(root)
        n += verify_checksum(path, required=in_run, reader=job.snakemake_rule or job.rule)
    return n


def seal_outputs(job: Job) -> None:
    """Write the checksum record of every output of `job` that exists (knnlm.io.write_checksum), naming the rule,
    the job and its wildcards, once the job has written them all."""
    from pathlib import Path

    from .io import write_checksum

    maker = {"rule": job.snakemake_rule or job.rule, "job": job.rule, "wildcards": job.wildcards}
    for p in _files(job.output):
        if Path(p).exists():
            write_checksum(p, maker)


def run_job(name: str, job: Job) -> dict:
    """Run job `name` ('<module>.<function>') and log its MLflow run; returns what the job returned.

    Its inputs are checked against their checksum records first (verify_inputs) and its outputs get theirs once it
    has finished (seal_outputs): a damaged or edited artifact stops the next job that reads it with an error naming
    the file and its maker, never a number."""
    from .tracking import log_run

    fn = resolve(name)
    start = time.time()
    params = {k: v for k, v in job.cfg.items() if k not in ("name", "results_dir", "threads")}
    try:
        verify_inputs(job)
        out = fn(job) or {}
        seal_outputs(job)
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
    p.add_argument("--rule", default="", help="the Snakemake rule that runs the job (named by a failed checksum check)")
    args = p.parse_args(argv)
    faulthandler.enable()  # a fatal signal (a SIGBUS from a memory map on a full disk) leaves a traceback in the job log
    # every library the job imports (torch, faiss, numpy's BLAS) uses the threads Snakemake scheduled, no more
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")  # a busy machine must not change MKL's thread count (and sums)
    if args.job.startswith("parametric."):
        # a W_ds step alternates torch's log-softmax (OpenMP) with numpy's GEMMs (OpenBLAS): idle OpenMP threads that
        # sleep at once leave the cores to the GEMMs (a step of benchmarks/bench_wds.py's shape on the run's keys,
        # 2 Intel Xeon cores: 110 ms with OpenMP's default wait policy, 101 ms passive); a user's setting wins
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    io = json.loads(args.io)
    job = Job(cfg=json.loads(args.cfg), input=io.get("input", {}), output=io.get("output", {}),
              wildcards=io.get("wildcards", {}), extra=io.get("extra", {}), threads=args.threads, rule=args.job,
              snakemake_rule=args.rule)
    run_job(args.job, job)


if __name__ == "__main__":
    main(sys.argv[1:])
