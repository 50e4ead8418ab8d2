"""One Snakemake job as a knnlm job function sees it (knnlm.cli runs it; knnlm.experiments defines them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    """One job: cfg (the config sections its rule passes), input / output ({name: path or [paths]}, as the
    rule's named `input:` / `output:`), wildcards, extra (named paths that are neither, e.g. a resumable work
    dir), threads (as Snakemake schedules them), rule (the job name, an MLflow tag), snakemake_rule (the rule's name
    in the Snakefile)."""

    cfg: dict
    input: dict = field(default_factory=dict)
    output: dict = field(default_factory=dict)
    wildcards: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    threads: int = 1
    rule: str = ""
    snakemake_rule: str = ""  # the Snakemake rule that runs it (named in its outputs' checksum records)
    run_id: str | None = None  # the MLflow run, once the job logged a live curve point (curve)
    live: set = field(default_factory=set)  # the metrics logged live (not logged again at the end)

    def curve(self, step: int, values: dict[str, float]) -> None:
        """Log points of a training curve to the job's MLflow run while the job runs (LM and parametric training).

        The run is opened at the first point, or reopened when a killed attempt of this job left one RUNNING, so a
        resumed job still has one run (knnlm.tracking.open_job_run); the job's end finishes it (run_job). Under
        Snakemake (knnlm.tracking.SPOOL_ENV set) the points are spooled instead (knnlm.tracking.spool_points) and the
        invocation's SpoolLogger does the same, so that the job never imports MLflow."""
        import os

        from .tracking import SPOOL_ENV, log_points, open_job_run, spool_points

        spool = os.environ.get(SPOOL_ENV)
        if spool and not self.run_id:
            try:
                spool_points(Path(spool), self.cfg, self.rule, self.wildcards, step, values)
                self.live.update(values)
                return
            except OSError as e:
                import logging

                logging.getLogger(__name__).warning("MLflow: could not spool a live point (%s); logging it here", e)
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
