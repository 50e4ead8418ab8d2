"""MLflow logging: one run per DAG job, one experiment per config.

Default store: sqlite at <results_dir>/mlflow.db (no server); set MLFLOW_TRACKING_URI to use a team
server instead. Artifacts go to <results_dir>/mlartifacts/<experiment>/ for the sqlite store.

Jobs run in parallel, and sqlite dislikes concurrent schema creation, so everything a job logs is
sent in one go at the end of the job, under an exclusive file lock (`log_run`).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

from .config import PROJECT_ROOT, flatten

log = logging.getLogger(__name__)


def tracking_uri(results_dir: str | Path) -> str:
    """MLFLOW_TRACKING_URI if set, else sqlite:///<results_dir>/mlflow.db (absolute path)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - no git is not an error
        return "unknown"


@contextlib.contextmanager
def _lock(results_dir: Path):
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / ".mlflow.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def log_run(
    cfg: dict,
    rule: str,
    wildcards: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    step_metrics: dict[str, Iterable[tuple[int, float]]] | None = None,
    artifacts: Iterable[str | Path] = (),
    start_time: float | None = None,
) -> str:
    """Log one finished job as an MLflow run in experiment cfg['name']; return the run id.

    params: flattened into 'a.b' keys (config values and wildcards); metrics: name -> float
    (non-finite values are logged as-is, MLflow stores inf/nan); step_metrics: name -> [(step, value)];
    artifacts: files (tables, manifests) copied into the run. Tags: rule, wildcards, git commit, config.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    results_dir = Path(cfg["results_dir"])
    wildcards = dict(wildcards or {})
    uri = tracking_uri(results_dir)
    with _lock(results_dir):
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(cfg["name"])
        if exp is None:
            kw = {}
            if uri.startswith("sqlite:"):
                kw["artifact_location"] = (results_dir.resolve() / "mlartifacts" / cfg["name"]).as_uri()
            exp_id = client.create_experiment(cfg["name"], **kw)
        else:
            exp_id = exp.experiment_id
        name = rule + "".join(f"_{k}={v}" for k, v in sorted(wildcards.items()))
        tags = {"rule": rule, "config": cfg["name"], "git_commit": git_commit(),
                **{f"wildcard.{k}": str(v) for k, v in wildcards.items()}}
        run = client.create_run(exp_id, run_name=name, tags=tags,
                                start_time=int((start_time or time.time()) * 1000))
        rid = run.info.run_id
        all_params = {**{f"wildcard.{k}": v for k, v in wildcards.items()}, **flatten(params or {})}
        from mlflow.entities import Metric, Param
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        for k, series in (step_metrics or {}).items():
            ms += [Metric(k, float(v), now, int(s)) for s, v in series]
        ps = [Param(k, str(v)[:6000]) for k, v in all_params.items()]
        for i in range(0, len(ps), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            client.log_batch(rid, params=ps[i:i + 100])
        for i in range(0, len(ms), 1000):
            client.log_batch(rid, metrics=ms[i:i + 1000])
        for a in artifacts:
            if Path(a).exists():
                client.log_artifact(rid, str(a))
        client.set_terminated(rid, "FINISHED")
    log.info("MLflow: logged run %s (%s) to %s", rid, name, uri)
    return rid


def count_runs(results_dir: str | Path, experiment: str) -> int:
    """Number of runs in MLflow experiment `experiment` (0 if it does not exist)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(results_dir))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return 0
    return len(client.search_runs([exp.experiment_id], max_results=50000))
