"""MLflow logging: one run per DAG job, one experiment per config.

Default store: sqlite at <results_dir>/mlflow.db (no server); set MLFLOW_TRACKING_URI to use a team
server instead. Artifacts go to <results_dir>/mlartifacts/<experiment>/ for the sqlite store.

Jobs run in parallel, and sqlite dislikes concurrent schema creation, so every write goes through an exclusive
file lock: what a job logs is sent in one go at its end (`log_run`), except the curves of long trainings, which
are logged while they run (`open_job_run`, `log_points`) into the run the job's end then finishes.

Under Snakemake a job does not import MLflow for its end: importing mlflow and its sqlite store takes ~7 s of a
job process (3.6 s and 3.2 s, measured on 2 AMD EPYC cores), longer than most jobs compute. The Snakefile's onstart
sets SPOOL_ENV and starts a SpoolLogger, a thread of the Snakemake process (which has imported MLflow once); each
job writes its run as a JSON record into the spool (`log_run`), and the thread logs the records as they arrive,
seconds later, and the rest when the invocation ends. A record left by a killed invocation is logged by the next
one, or by `python -m knnlm.tracking replay <results_dir>`. A training's live curve goes the same way: each point
is a record (`spool_points`) that the thread logs into the job's run, opened at its first point (or the RUNNING run
a killed attempt left), which the job's final record then finishes.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
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


def env_number(name: str, default: float, kind: type = float) -> float:
    """The environment variable `name` as a number of `kind` (float or int), `default` when unset. Raises ValueError
    naming the variable, what was expected and what was found, for a value that is not such a number or is < 0."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < 0:
        raise ValueError(f"environment variable {name}: expected a number ≥ 0 ({'an integer' if kind is int else 'seconds'}"
                         f"), found {raw!r}")
    return value


LOCK_TIMEOUT_S = env_number("KNNLM_MLFLOW_LOCK_TIMEOUT", 600.0)
RETRIES = env_number("KNNLM_MLFLOW_RETRIES", 4, int)  # attempts after the first, backing off 2, 4, 8, 16 s


@contextlib.contextmanager
def _lock(results_dir: Path):
    """The store's exclusive file lock; TimeoutError after LOCK_TIMEOUT_S (a stuck holder never hangs a job)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / ".mlflow.lock", "w") as f:
        t0 = time.time()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() - t0 > LOCK_TIMEOUT_S:
                    raise TimeoutError(f"{results_dir / '.mlflow.lock'} held by another process for "
                                       f"{LOCK_TIMEOUT_S:.0f} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_NOT_IN_NAMES = re.compile(r"[^0-9A-Za-z_\-. /]+")  # MLflow keys: alphanumerics, _ - . space /


def mlflow_key(name: str) -> str:
    """A metric or param name MLflow accepts: each run of other characters (parentheses, '%', 'τ', ...) becomes
    '_'. Every job's names pass through here (_log_run_once, log_points)."""
    return _NOT_IN_NAMES.sub("_", str(name)).strip("_ ") or "_"


def _deterministic(e: Exception) -> bool:
    """An MLflow rejection that a retry cannot fix (an invalid name or value)."""
    return getattr(e, "error_code", None) in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST")


def _retrying(fn, what: str, retries: int | None = None):
    """fn() retried on errors of a busy or unreachable store (sqlite locked, HTTP errors, lock timeout), with
    exponential backoff; the last error is raised, and a deterministic rejection (an invalid name or value) at
    once."""
    retries = RETRIES if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any store error is retried the same way
            if attempt == retries or _deterministic(e):
                raise
            wait = 2.0 ** (attempt + 1)
            log.warning("MLflow: %s failed (%s: %s); retrying in %.0f s", what, type(e).__name__, e, wait)
            time.sleep(wait)


PARENT_ENV = "KNNLM_MLFLOW_PARENT_RUN"  # set by the Snakefile's onstart: the run of this Snakemake invocation
SPOOL_ENV = "KNNLM_MLFLOW_SPOOL"  # set by the Snakefile's onstart: the folder jobs write their runs into (SpoolLogger)
SPOOL_DIR = "mlflow_spool"  # under results_dir


# The experiment's kind for MLflow 3 (tag mlflow.experimentKind): model training. MLflow 3.17's UI still opens an
# experiment on its GenAI overview (traces, tokens) whatever the tag; the query parameter of UI_RUNS_PAGE opens it
# on its runs (checked in headless Chromium).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
UI_RUNS_PAGE = "#/experiments/{experiment_id}?workflowType=machine_learning"


def ui_url(run_id: str, cfg: dict, base: str = "http://127.0.0.1:5000/") -> str:
    """The MLflow UI's page of the runs of the experiment that holds run `run_id` (a parent run: its jobs nest under
    it), for `mlflow ui` at `base`: '<base>#/experiments/<id>?workflowType=machine_learning'."""
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking_uri(Path(cfg["results_dir"]))).get_run(run_id).info.experiment_id
    return base + UI_RUNS_PAGE.format(experiment_id=exp)


def _experiment(client, cfg: dict, uri: str, results_dir: Path) -> str:
    """Id of experiment cfg['name'], created (artifacts under results_dir/mlartifacts for sqlite) if missing, tagged
    as model training (EXPERIMENT_KIND; its runs page in the UI: ui_url)."""
    exp = client.get_experiment_by_name(cfg["name"])
    if exp is not None:
        if any(exp.tags.get(k) != v for k, v in EXPERIMENT_KIND.items()):
            for k, v in EXPERIMENT_KIND.items():
                client.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    kw = {}
    if uri.startswith("sqlite:"):
        kw["artifact_location"] = (results_dir.resolve() / "mlartifacts" / cfg["name"]).as_uri()
    return client.create_experiment(cfg["name"], tags=EXPERIMENT_KIND, **kw)


def start_parent_run(cfg: dict, targets: Iterable[str] = ()) -> str:
    """Create the parent run of one Snakemake invocation (status RUNNING) and return its id; every job's run
    becomes its child (tag mlflow.parentRunId, read from the environment variable PARENT_ENV), so the MLflow UI
    groups a whole run of the DAG."""
    from mlflow.tracking import MlflowClient

    import socket

    results_dir = Path(cfg["results_dir"])
    uri = tracking_uri(results_dir)
    with _lock(results_dir):
        client = MlflowClient(uri)
        exp_id = _experiment(client, cfg, uri, results_dir)
        close_abandoned_parents(client, exp_id)
        run = client.create_run(exp_id, run_name=f"snakemake {time.strftime('%Y-%m-%d %H:%M:%S')}",
                                tags={"rule": "snakemake", "config": cfg["name"], "git_commit": git_commit(),
                                      "targets": " ".join(targets)[:5000], "pid": str(os.getpid()),
                                      "host": socket.gethostname()})
    return run.info.run_id


def close_abandoned_parents(client, exp_id: str) -> list[str]:
    """Mark KILLED every parent run of experiment `exp_id` left RUNNING by an invocation of this machine whose process
    is gone (killed, or ended without its onsuccess/onerror), tagging why; returns their ids. A parent run of
    another host, or without the 'pid' and 'host' tags, is left as it is (its process cannot be checked here)."""
    import socket

    host = socket.gethostname()
    closed = []
    runs = client.search_runs([exp_id], filter_string="tags.rule = 'snakemake' and attributes.status = 'RUNNING'",
                              max_results=1000)
    for r in runs:
        tags = r.data.tags
        if tags.get("host") != host or not tags.get("pid", "").isdigit():
            continue
        if int(tags["pid"]) == os.getpid() or _alive(int(tags["pid"])):
            continue
        client.set_tag(r.info.run_id, "ended_by", "a later invocation: its Snakemake process was gone")
        client.set_terminated(r.info.run_id, "KILLED")
        closed.append(r.info.run_id)
    if closed:
        log.warning("MLflow: %d parent run(s) of killed invocations marked KILLED: %s", len(closed), ", ".join(closed))
    return closed


def end_parent_run(cfg: dict, run_id: str, ok: bool) -> None:
    """Mark the parent run FINISHED (the DAG succeeded) or FAILED, and log where the MLflow UI shows its runs."""
    from mlflow.tracking import MlflowClient

    results_dir = Path(cfg["results_dir"])
    with _lock(results_dir):
        MlflowClient(tracking_uri(results_dir)).set_terminated(run_id, "FINISHED" if ok else "FAILED")
    try:  # a server's own UI for an http(s) store; `mlflow ui` on a local store (which MLflow may have put in the env)
        uri = tracking_uri(results_dir)
        server = uri.startswith(("http://", "https://"))
        where = "the tracking server's UI: " if server else f"`mlflow ui --backend-store-uri {uri}`, then "
        log.warning("MLflow: this run's jobs are under run %s; browse them with %s%s", run_id, where,
                    ui_url(run_id, cfg, uri.rstrip("/") + "/") if server else ui_url(run_id, cfg))
    except Exception as e:  # a hint only: never fail the DAG over it
        log.debug("MLflow UI address not resolved: %s", e)


def _job_name(rule: str, wildcards: dict) -> str:
    return rule + "".join(f"_{k}={v}" for k, v in sorted(wildcards.items()))


def _job_tags(cfg: dict, rule: str, wildcards: dict) -> dict:
    tags = {"rule": rule, "config": cfg["name"], "git_commit": git_commit(),
            **{f"wildcard.{k}": str(v) for k, v in wildcards.items()}}
    if os.environ.get(PARENT_ENV):
        tags["mlflow.parentRunId"] = os.environ[PARENT_ENV]
    return tags


def open_job_run(cfg: dict, rule: str, wildcards: dict | None = None) -> str | None:
    """The id of a RUNNING run for this job: the one a killed attempt of the same job (same name) left RUNNING, else
    a new one. Its curve points survive a kill, and a resumed job goes on logging into it. None (with a warning)
    when the store is busy or unreachable: the job then logs its curve at its end only."""
    from mlflow.tracking import MlflowClient

    results_dir = Path(cfg["results_dir"])
    uri, wildcards = tracking_uri(results_dir), dict(wildcards or {})
    name = _job_name(rule, wildcards)

    def open_run():
        with _lock(results_dir):
            return _open_run(MlflowClient(uri), cfg, uri, name, _job_tags(cfg, rule, wildcards))
    try:
        return _retrying(open_run, f"opening the run of {name}", retries=1)
    except Exception as e:  # noqa: BLE001
        log.warning("MLflow: no live curve for %s (%s: %s)", name, type(e).__name__, e)
        return None


def _open_run(client, cfg: dict, uri: str, name: str, tags: dict) -> str:
    """The RUNNING run of job `name` that a killed attempt left (tagged 'resumed'), else a new one with `tags`, the
    job's earlier ended runs tagged superseded by it. Call under the store's lock."""
    exp_id = _experiment(client, cfg, uri, Path(cfg["results_dir"]))
    left = _left_running(client, exp_id, name)
    if left:
        return left
    rid = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
    _supersede(client, exp_id, name, rid)
    return rid


def _left_running(client, exp_id: str, name: str) -> str | None:
    """The run a killed attempt of job `name` left RUNNING (tagged 'resumed'), or None."""
    left = client.search_runs([exp_id], filter_string=f"attributes.run_name = '{name}' and attributes.status = 'RUNNING'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not left:
        return None
    client.set_tag(left[0].info.run_id, "resumed", "true")
    return left[0].info.run_id


def _supersede(client, exp_id: str, name: str, run_id: str) -> None:
    """Tag every earlier ended run of job `name` 'superseded_by' = run_id: the job ran again (its config or code
    changed, or Snakemake found its outputs incomplete after a kill that came between the run's end and Snakemake's
    record of it), so the newest run holds the job's current numbers and the UI can filter the older ones out
    (tags.superseded_by IS NULL)."""
    for r in client.search_runs([exp_id], filter_string=f"attributes.run_name = '{name}'", max_results=1000):
        if r.info.run_id != run_id and r.info.status != "RUNNING" and "superseded_by" not in r.data.tags:
            client.set_tag(r.info.run_id, "superseded_by", run_id)


def _point_metrics(values: dict[str, float], time_ms: int, step: int) -> list:
    """MLflow Metric entities of one curve point {metric: value} at `step` (time in ms since the epoch)."""
    from mlflow.entities import Metric

    return [Metric(mlflow_key(k), float(v), int(time_ms), int(step)) for k, v in values.items()]


def log_points(cfg: dict, run_id: str, step: int, values: dict[str, float]) -> None:
    """Log {metric: value} at `step` into run `run_id` now (under the store's lock). A live point is a convenience:
    when the store is busy or unreachable it is skipped with a warning (the job's end logs the whole curve)."""
    from mlflow.tracking import MlflowClient

    results_dir = Path(cfg["results_dir"])
    now = int(time.time() * 1000)

    def send():
        with _lock(results_dir):
            MlflowClient(tracking_uri(results_dir)).log_batch(run_id, metrics=_point_metrics(values, now, step))
    try:
        _retrying(send, "a live curve point", retries=1)
    except Exception as e:  # noqa: BLE001
        log.warning("MLflow: live point at step %d not logged (%s)", step, e)


PENDING_DIR = "mlflow_pending"  # under results_dir: runs that could not be logged, replayed by `replay`


def log_run(cfg: dict, rule: str, wildcards: dict[str, Any] | None = None, **kw) -> str | None:
    """Log one job as an MLflow run (_log_run_once), retried while the store is busy or unreachable.

    If it still fails, the job is not failed (its outputs are written and valid): the run is saved as JSON under
    <results_dir>/mlflow_pending/ with a warning, and `python -m knnlm.tracking replay <results_dir>` logs it
    later. Where SPOOL_ENV is set (a job under Snakemake) and the job has no live run (run_id), the run is written
    to that folder instead (spool_run) and logged by the Snakemake process's SpoolLogger. Returns the run id, or
    None when the run was spooled or left pending.
    """
    spool = os.environ.get(SPOOL_ENV)
    if spool and not kw.get("run_id"):  # a job under Snakemake: its run goes to the invocation's SpoolLogger
        try:
            path = spool_run(Path(spool), cfg, rule, wildcards, **kw)
            log.info("MLflow: the %s run of %s is spooled to %s (logged by the Snakemake process)",
                     kw.get("status", "FINISHED"), _job_name(rule, dict(wildcards or {})), path)
            return None
        except OSError as e:
            log.warning("MLflow: could not spool the run of %s (%s); logging it here", rule, e)
    try:
        return _retrying(lambda: _log_run_once(cfg, rule, wildcards, **kw), f"logging the run of {rule}")
    except Exception as e:  # noqa: BLE001
        path = spool_run(Path(cfg["results_dir"]) / PENDING_DIR, cfg, rule, wildcards,
                         extra={"log_error": f"{type(e).__name__}: {e}"}, **kw)
        log.warning("MLflow: the run of %s was NOT logged (%s: %s); saved to %s - replay it with "
                    "`python -m knnlm.tracking replay %s`", rule, type(e).__name__, e, path, cfg["results_dir"])
        return None


def spool_run(spool: Path, cfg: dict, rule: str, wildcards: dict[str, Any] | None = None, extra: dict | None = None,
              **kw) -> Path:
    """Write one job's run (log_run's arguments) as a JSON record into folder `spool`, atomically (a temporary name,
    then a rename): '<ns since the epoch>-<pid>.json', so that the records sort in the order the jobs ended. The
    record keeps what the job's own process knows: its tags (the parent run, the git commit), its start and end
    times, the artifacts' absolute paths; `extra`: more fields for a reader (log_run's pending records: the error that
    kept the run from the store). Returns the record's path; OSError when the folder cannot be written."""
    kw = dict(kw)
    kw["artifacts"] = [str(Path(a).resolve()) for a in kw.get("artifacts") or ()]
    kw["end_time"] = time.time()
    return _write_record(spool, cfg, rule, wildcards, {"kw": kw, **(extra or {})})


def spool_points(spool: Path, cfg: dict, rule: str, wildcards: dict[str, Any] | None, step: int,
                 values: dict[str, float]) -> Path:
    """Write live curve points {metric: value} at `step` of a running job as a record into folder `spool` (as
    spool_run, atomically): the SpoolLogger logs them into the job's run, which it opens at the job's first point (or
    reopens where a killed attempt left one RUNNING), and the job's final record (spool_run) finishes that run.
    Returns the record's path; OSError when the folder cannot be written."""
    points = {"step": int(step), "values": {k: float(v) for k, v in values.items()}, "time": time.time()}
    return _write_record(spool, cfg, rule, wildcards, {"points": points})


def _write_record(spool: Path, cfg: dict, rule: str, wildcards: dict[str, Any] | None, fields: dict) -> Path:
    """One spool record '<ns since the epoch>-<pid>.json' (written under a temporary name, then renamed) with the
    job's config name, results_dir, rule, wildcards, tags and pid, and `fields`."""
    import json

    spool.mkdir(parents=True, exist_ok=True)
    wildcards = dict(wildcards or {})
    record = {"cfg": {k: cfg[k] for k in ("name", "results_dir") if k in cfg}, "rule": rule, "wildcards": wildcards,
              "tags": _job_tags(cfg, rule, wildcards), "pid": os.getpid(), **fields}
    path = spool / f"{time.time_ns()}-{os.getpid()}.json"
    tmp = spool / f".{path.name}.tmp"
    try:
        tmp.write_text(json.dumps(record, default=str))
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill: no partial record stays behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def _sweep_partial_records(folder: Path) -> int:
    """Remove the temporaries of spool records ('.<ns>-<pid>.json.tmp') whose writer is gone (killed while writing);
    returns how many."""
    n = 0
    for tmp in folder.glob(".*.json.tmp"):
        try:
            pid = int(tmp.name[1:].split(".", 1)[0].rsplit("-", 1)[1])
        except (IndexError, ValueError):
            continue
        if not _alive(pid):
            tmp.unlink(missing_ok=True)
            n += 1
    return n


def _alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _replay_record(path: Path, results_dir: str | Path | None = None, live: dict | None = None) -> None:
    """Log one record (spool_run's run, spool_points's curve points, or log_run's pending fallback) and delete it.
    results_dir: where the store is (None: the record's own); live: {(job name, pid): run id} of the runs opened for
    live points so far, which the same job's final record finishes (updated here)."""
    from .io import read_checked_json

    live = {} if live is None else live
    rec = read_checked_json(path, "spool_record", remake="it stays for a retry; delete it to drop its run")
    cfg = {**rec["cfg"], **({"results_dir": str(results_dir)} if results_dir is not None else {})}
    attempt = (_job_name(rec["rule"], rec["wildcards"]), rec.get("pid"))
    if "points" in rec:
        from mlflow.tracking import MlflowClient

        pts, uri = rec["points"], tracking_uri(cfg["results_dir"])

        def send():
            with _lock(Path(cfg["results_dir"])):
                client = MlflowClient(uri)
                if attempt not in live:
                    live[attempt] = _open_run(client, cfg, uri, attempt[0], rec["tags"])
                client.log_batch(live[attempt], metrics=_point_metrics(pts["values"], pts["time"] * 1000, pts["step"]))
        _retrying(send, f"replaying {path.name}")
    else:
        kw = dict(rec["kw"])  # log_run's own arguments, as the job gave them
        if kw.get("step_metrics"):
            kw["step_metrics"] = {k: [tuple(p) for p in v] for k, v in kw["step_metrics"].items()}
        kw["run_id"] = kw.get("run_id") or live.get(attempt)
        _retrying(lambda: _log_run_once(cfg, rec["rule"], rec["wildcards"], tags=rec.get("tags"), **kw),
                  f"replaying {path.name}")
        live.pop(attempt, None)
    path.unlink()


def replay(results_dir: str | Path, failed: list | None = None) -> int:
    """Log every run saved under <results_dir>/mlflow_pending/ (log_run's fallback) and <results_dir>/mlflow_spool/
    (runs spooled by jobs of an invocation that ended before logging them) and delete its file; returns how many
    were logged. A record that cannot be read or logged (damaged JSON, a missing field, the store refusing it) stays
    where it is with a warning naming it, and the others are still logged (a spooled job's later records wait
    behind its failed one, to keep its order); `failed`, when given, gets (path, error) of each."""
    done, live, held = 0, {}, set()
    failed = [] if failed is None else failed
    records = [(p, True) for p in sorted((Path(results_dir) / PENDING_DIR).glob("*.json"))] + \
        [(p, False) for p in sorted((Path(results_dir) / SPOOL_DIR).glob("*.json"))]
    for path, pending in records:
        pid = None if pending else path.stem.rpartition("-")[2]
        if pid is not None and pid in held:
            failed.append((path, "an earlier record of the same job failed"))
            continue
        try:
            if pending:
                _replay_record(path, results_dir)
            else:
                _replay_record(path, live=live)
            done += 1
        except Exception as e:  # noqa: BLE001 - one damaged record never stops the others
            if pid is not None:
                held.add(pid)
            failed.append((path, f"{type(e).__name__}: {e}"))
            log.warning("MLflow: the saved run %s was not logged (%s: %s); it stays for a retry", path,
                        type(e).__name__, e)
    return done


class SpoolLogger:
    """Logs the runs that jobs write into folder `spool` (log_run under SPOOL_ENV), in the order they ended: a
    daemon thread of the process that starts it (the Snakemake process: MLflow is imported once for the whole
    invocation, not once per job), looking for new records every `interval` seconds. stop() logs the rest. A
    record that fails to log stays in the folder (a warning; the next round, the next invocation or
    `python -m knnlm.tracking replay` logs it)."""

    def __init__(self, spool: str | Path, interval: float = 2.0):
        import threading

        self.spool, self.interval = Path(spool), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mlflow-spool", daemon=True)
        self._failed: set[str] = set()
        self._live: dict = {}  # {(job name, pid): run id} opened for live points (_replay_record)

    def start(self) -> "SpoolLogger":
        self._thread.start()
        return self

    def drain(self) -> int:
        """Log every record now in the folder; returns how many were logged."""
        done, held = 0, set()
        for path in sorted(self.spool.glob("*.json")):
            pid = path.stem.rpartition("-")[2]
            if pid in held:  # a job's records are logged in its order: after one that failed, its later ones wait
                continue
            try:
                _replay_record(path, live=self._live)
                done += 1
            except Exception as e:  # noqa: BLE001 - one bad record never stops the other jobs' records
                held.add(pid)
                if path.name not in self._failed:
                    self._failed.add(path.name)
                    log.warning("MLflow: the spooled run %s was not logged (%s: %s); it stays for a retry", path,
                                type(e).__name__, e)
        return done

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.drain()

    def stop(self) -> int:
        """Stop the thread and log what is left; returns how many records are still unlogged (with a warning)."""
        self._stop.set()
        self._thread.join()
        self.drain()
        left = len(list(self.spool.glob("*.json")))
        if left:
            log.warning("MLflow: %d spooled run(s) not logged; `python -m knnlm.tracking replay %s` logs them", left,
                        self.spool.parent)
        return left


_SPOOL_LOGGER: list[SpoolLogger] = []  # the SpoolLogger of this process's invocation (start_spool)


def start_spool(cfg: dict) -> SpoolLogger:
    """Start this process's SpoolLogger over <results_dir>/mlflow_spool/ (logging at once what a killed invocation
    left there) and set SPOOL_ENV, which the jobs this process starts inherit: their runs then go through it. For the
    Snakefile's onstart; stop_spool ends it."""
    spool = Path(cfg["results_dir"]).resolve() / SPOOL_DIR
    spool.mkdir(parents=True, exist_ok=True)
    for folder in (spool, Path(cfg["results_dir"]).resolve() / PENDING_DIR):
        if folder.is_dir():
            _sweep_partial_records(folder)
    logger = SpoolLogger(spool).start()
    _SPOOL_LOGGER.append(logger)
    os.environ[SPOOL_ENV] = str(spool)
    return logger


def stop_spool() -> None:
    """Stop this process's SpoolLogger (start_spool) after logging every record left; jobs started later log their
    runs themselves. For the Snakefile's onsuccess and onerror."""
    os.environ.pop(SPOOL_ENV, None)
    while _SPOOL_LOGGER:
        _SPOOL_LOGGER.pop().stop()


def _log_run_once(
    cfg: dict,
    rule: str,
    wildcards: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    step_metrics: dict[str, Iterable[tuple[int, float]]] | None = None,
    artifacts: Iterable[str | Path] = (),
    start_time: float | None = None,
    status: str = "FINISHED",
    error: str | None = None,
    run_id: str | None = None,
    end_time: float | None = None,
    tags: dict[str, str] | None = None,
) -> str:
    """Log one job as an MLflow run in experiment cfg['name'] (one attempt); return the run id.

    params: flattened into 'a.b' keys (config values and wildcards); metrics: name -> float
    (non-finite values are logged as-is, MLflow stores inf/nan); step_metrics: name -> [(step, value)];
    artifacts: files (tables, manifests) copied into the run. Tags: rule, wildcards, git commit, config, the
    parent run of the Snakemake invocation (PARENT_ENV) when set. status: 'FINISHED', or 'FAILED' for a job that
    raised (`error`: its message, tag 'error'). run_id: the job's run opened while it ran (open_job_run), which
    this finishes; None creates it. end_time: when the job ended (a spooled run: logged later); None: now. tags:
    the job's tags as its process made them (a spooled run), instead of this process's.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    results_dir = Path(cfg["results_dir"])
    wildcards = dict(wildcards or {})
    uri = tracking_uri(results_dir)
    with _lock(results_dir):
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        exp_id = _experiment(client, cfg, uri, results_dir)
        name = _job_name(rule, wildcards)
        tags = dict(tags) if tags is not None else _job_tags(cfg, rule, wildcards)
        if error:
            tags["error"] = error[:5000]
        run_id = run_id or _left_running(client, exp_id, name)
        if run_id is None:
            rid = client.create_run(exp_id, run_name=name, tags=tags,
                                    start_time=int((start_time or time.time()) * 1000)).info.run_id
            _supersede(client, exp_id, name, rid)
        else:
            rid = run_id
            for k, v in tags.items():
                client.set_tag(rid, k, v)
        all_params = {**{f"wildcard.{k}": v for k, v in wildcards.items()}, **flatten(params or {})}
        from mlflow.entities import Metric, Param
        now = int((end_time or time.time()) * 1000)
        ms = [Metric(mlflow_key(k), float(v), now, 0) for k, v in (metrics or {}).items() if v is not None]
        for k, series in (step_metrics or {}).items():
            ms += [Metric(mlflow_key(k), float(v), now, int(s)) for s, v in series]
        ps = [Param(mlflow_key(k), str(v)[:6000]) for k, v in all_params.items()]
        for i in range(0, len(ps), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            client.log_batch(rid, params=ps[i:i + 100])
        for i in range(0, len(ms), 1000):
            client.log_batch(rid, metrics=ms[i:i + 1000])
        for a in artifacts:
            if Path(a).exists():
                client.log_artifact(rid, str(a))
        client.set_terminated(rid, status, end_time=int(end_time * 1000) if end_time else None)
    log.info("MLflow: logged %s run %s (%s) to %s", status, rid, name, uri)
    return rid


def count_runs(results_dir: str | Path, experiment: str) -> int:
    """Number of runs in MLflow experiment `experiment` (0 if it does not exist)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(results_dir))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return 0
    return len(client.search_runs([exp.experiment_id], max_results=50000))


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "replay":
        raise SystemExit("usage: python -m knnlm.tracking replay <results_dir>")
    logging.basicConfig(level=logging.INFO)
    bad: list = []
    print(f"replayed {replay(sys.argv[2], bad)} run(s) from {sys.argv[2]}/{PENDING_DIR} and {sys.argv[2]}/{SPOOL_DIR}")
    for path, why in bad:
        print(f"not replayed (kept): {path}: {why}")
    raise SystemExit(1 if bad else 0)
