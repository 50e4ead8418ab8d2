"""MLflow bookkeeping (knnlm.tracking): a failed job leaves a FAILED run, jobs are children of the invocation's run."""
import json
import os

import pytest

from conftest import PROJECT_ROOT
from knnlm import cli, tracking


def _runs(results_dir):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri(results_dir))
    exp = client.get_experiment_by_name("t")
    return {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}


def test_a_failed_job_leaves_a_failed_run_under_its_parent(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}
    parent = tracking.start_parent_run(cfg, ["all"])
    monkeypatch.setenv(tracking.PARENT_ENV, parent)

    def broken(job):
        raise ValueError("config key 'x': expected 1, found 2")

    monkeypatch.setattr(cli, "resolve", lambda name: broken if name == "m.broken" else (lambda job: {"metrics": {"a": 1.0}}))
    with pytest.raises(ValueError, match="config key 'x'"):
        cli.run_job("m.broken", cli.Job(cfg=cfg, rule="m.broken"))
    cli.run_job("m.fine", cli.Job(cfg=cfg, rule="m.fine"))
    import logging

    logs = []
    handler = logging.Handler()
    handler.emit = lambda record: logs.append(record.getMessage())
    tracking.log.addHandler(handler)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking.tracking_uri(tmp_path))  # as MLflow sets it for a local store
    try:
        tracking.end_parent_run(cfg, parent, ok=False)
    finally:
        tracking.log.removeHandler(handler)
    hint = next(m for m in logs if "browse them with" in m)
    assert f"`mlflow ui --backend-store-uri sqlite:///{tmp_path.resolve()}/mlflow.db`" in hint
    assert "tracking server" not in hint
    runs = _runs(tmp_path)
    assert runs["m.broken"].info.status == "FAILED"
    assert runs["m.broken"].data.tags["error"] == "ValueError: config key 'x': expected 1, found 2"
    assert runs["m.fine"].info.status == "FINISHED" and runs["m.fine"].data.metrics == {"a": 1.0}
    assert {runs[n].data.tags["mlflow.parentRunId"] for n in ("m.broken", "m.fine")} == {parent}
    assert [r.info.status for r in runs.values() if r.info.run_id == parent] == ["FAILED"]
    from mlflow.tracking import MlflowClient  # an experiment of model training; its runs page is logged at the end

    exp = MlflowClient(tracking.tracking_uri(tmp_path)).get_experiment_by_name("t")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    url = f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}?workflowType=machine_learning"
    assert tracking.ui_url(parent, cfg) == url and any(url in m and parent in m for m in logs)


def test_live_curves_survive_a_kill_in_one_run(tmp_path, monkeypatch):
    """A training logs its curve while it runs; a killed attempt leaves its run RUNNING, and the resumed job (with or
    without new curve points) goes on in that run and finishes it: one run per job, every point kept."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}
    killed = cli.Job(cfg=cfg, rule="m.train", wildcards={"key": "att"})
    for step in (10, 20):
        killed.curve(step, {"valid_nll": 5.0 - step / 100})  # ... then SIGKILL: no run_job epilogue
    assert _runs(tmp_path)["m.train_key=att"].info.status == "RUNNING"

    def resumed(job):
        job.curve(30, {"valid_nll": 4.6})
        return {"metrics": {"best": 4.6}, "step_metrics": {"valid_nll": [(10, 4.9), (20, 4.8), (30, 4.6)]}}

    monkeypatch.setattr(cli, "resolve", lambda name: resumed if name == "m.train" else (lambda job: {"metrics": {"a": 1.0}}))
    cli.run_job("m.train", cli.Job(cfg=cfg, rule="m.train", wildcards={"key": "att"}))
    runs = _runs(tmp_path)
    assert list(runs) == ["m.train_key=att"] and runs["m.train_key=att"].info.status == "FINISHED"
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    hist = client.get_metric_history(runs["m.train_key=att"].info.run_id, "valid_nll")
    assert sorted(m.step for m in hist) == [10, 20, 30]  # live points once, not again from step_metrics
    # a killed attempt's run is also reused when the resumed job logs no live point
    other = cli.Job(cfg=cfg, rule="m.other")
    other.curve(1, {"x": 1.0})
    cli.run_job("m.other", cli.Job(cfg=cfg, rule="m.other"))
    runs = _runs(tmp_path)
    assert len(runs) == 2 and runs["m.other"].info.status == "FINISHED" and runs["m.other"].data.tags["resumed"] == "true"
    # a job that runs again after its run ended (killed after logging, before Snakemake recorded it; or changed)
    # gets a new run, and the earlier one is tagged superseded_by it
    first = runs["m.other"].info.run_id
    cli.run_job("m.other", cli.Job(cfg=cfg, rule="m.other"))
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    again = client.search_runs([client.get_experiment_by_name("t").experiment_id],
                               filter_string="attributes.run_name = 'm.other'")
    newest = [r for r in again if "superseded_by" not in r.data.tags]
    assert len(again) == 2 and len(newest) == 1 and newest[0].info.run_id != first
    assert client.get_run(first).data.tags["superseded_by"] == newest[0].info.run_id


def test_unreachable_store_keeps_the_job_and_its_run(tmp_path, monkeypatch, caplog):
    """A store that cannot be reached: the job still succeeds (its outputs are valid), says the run was not logged,
    and keeps it under mlflow_pending/; `replay` logs it once the store is back."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setattr(tracking, "RETRIES", 1)
    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}

    def job_fn(job):
        job.curve(1, {"loss": 2.0})  # a live point: skipped, never fatal
        return {"metrics": {"ppl": 12.5}, "step_metrics": {"loss": [(1, 2.0), (2, 1.5)]}}

    monkeypatch.setattr(cli, "resolve", lambda name: job_fn)
    out = cli.run_job("m.job", cli.Job(cfg=cfg, rule="m.job", wildcards={"split": "valid"}))
    assert out["metrics"] == {"ppl": 12.5}
    pending = list((tmp_path / tracking.PENDING_DIR).glob("*.json"))
    assert len(pending) == 1 and "NOT logged" in caplog.text
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.replay(tmp_path) == 1 and not list((tmp_path / tracking.PENDING_DIR).glob("*.json"))
    run = _runs(tmp_path)["m.job_split=valid"]
    assert run.info.status == "FINISHED" and run.data.metrics == {"ppl": 12.5, "loss": 1.5}


def test_replay_keeps_a_damaged_record_and_logs_the_others(tmp_path, monkeypatch, caplog):
    """A pending record that is not JSON stays where it is, named in a warning and in `failed`; the good one beside
    it is still logged (replay goes on)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setattr(tracking, "RETRIES", 1)
    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}
    monkeypatch.setattr(cli, "resolve", lambda name: (lambda job: {"metrics": {"ppl": 3.0}}))
    cli.run_job("m.job", cli.Job(cfg=cfg, rule="m.job", wildcards={"split": "test"}))
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    damaged = tmp_path / tracking.PENDING_DIR / "0000-damaged.json"
    damaged.write_text('{"cfg": {"name": ')
    partial = tmp_path / tracking.PENDING_DIR / "0001-partial.json"  # JSON, but not a record: no rule
    partial.write_text(json.dumps({"cfg": {"name": "t", "results_dir": str(tmp_path)}, "wildcards": {}, "tags": {},
                                   "kw": {"metrics": {"ppl": 1.0}}}))
    failed = []
    assert tracking.replay(tmp_path, failed) == 1
    assert damaged.exists() and partial.exists() and [p for p, _ in failed] == [damaged, partial]
    assert "not valid JSON" in failed[0][1]
    assert "not a valid MLflow spool record" in failed[1][1] and "'rule' is a required property" in failed[1][1]
    assert str(damaged) in caplog.text and str(partial) in caplog.text
    assert _runs(tmp_path)["m.job_split=test"].data.metrics == {"ppl": 3.0}


@pytest.mark.parametrize("value", ["x", "-1"])
def test_a_bad_lock_timeout_names_its_variable(monkeypatch, value):
    monkeypatch.setenv("KNNLM_MLFLOW_LOCK_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"KNNLM_MLFLOW_LOCK_TIMEOUT: expected a number ≥ 0 .*found '{value}'"):
        tracking.env_number("KNNLM_MLFLOW_LOCK_TIMEOUT", 600.0)
    monkeypatch.setenv("KNNLM_MLFLOW_LOCK_TIMEOUT", "2.5")
    assert tracking.env_number("KNNLM_MLFLOW_LOCK_TIMEOUT", 600.0) == 2.5


def test_a_held_lock_times_out_instead_of_hanging(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr(tracking, "LOCK_TIMEOUT_S", 0.5)
    with open(tmp_path / ".mlflow.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match="held by another process"):
            with tracking._lock(tmp_path):
                pass


def test_invalid_names_are_made_valid_and_a_rejection_is_not_retried(tmp_path, monkeypatch):
    """Names MLflow rejects (parentheses, %, τ) are made valid in one place, so every job's run ends FINISHED; a
    deterministic rejection is raised at once instead of being retried as if the store were busy."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
    from mlflow.tracking import MlflowClient

    from knnlm import tracking

    assert tracking.mlflow_key("n_inconclusive (under-trained)") == "n_inconclusive _under-trained"
    assert tracking.mlflow_key("best_tau τ*") == "best_tau"
    cfg = {"name": "names", "results_dir": str(tmp_path)}
    rid = tracking.log_run(cfg, "write_findings", {"lm": "base"}, metrics={"n_inconclusive (5 documents)": 2.0},
                           params={"a (b)": 1})
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    run = client.get_run(rid)
    assert run.info.status == "FINISHED" and run.data.metrics == {"n_inconclusive _5 documents": 2.0}
    assert not (tmp_path / tracking.PENDING_DIR).exists()
    calls = []

    def rejected():
        calls.append(1)
        raise MlflowException("Invalid metric name", error_code=INVALID_PARAMETER_VALUE)

    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    with pytest.raises(MlflowException):
        tracking._retrying(rejected, "a rejected call", retries=4)
    assert len(calls) == 1


def test_spooled_runs_are_logged_by_the_invocations_thread(tmp_path, monkeypatch):
    """Under Snakemake (start_spool) a job writes its run into the spool and imports no MLflow; the thread logs each
    record with the job's own tags, metrics, artifacts, status and times; stop_spool logs the rest and leaves the
    spool empty; a record a killed invocation left is logged by the next one."""
    import json
    import subprocess
    import sys
    import time

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.SPOOL_ENV, raising=False)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}
    parent = tracking.start_parent_run(cfg, ["all"])
    monkeypatch.setenv(tracking.PARENT_ENV, parent)
    table = tmp_path / "table.csv"
    table.write_text("a,b\n1,2\n")
    spool = tmp_path / tracking.SPOOL_DIR
    # a job process: no MLflow import, one record in the spool
    code = ("import sys, time; sys.path.insert(0, 'src'); from knnlm import cli\n"
            f"cli.resolve = lambda name: (lambda job: {{'metrics': {{'ppl': 9.5}}, 'artifacts': [{str(table)!r}]}})\n"
            f"cli.run_job('m.job', cli.Job(cfg={cfg!r}, rule='m.job', wildcards={{'split': 'test'}}))\n"
            "assert 'mlflow' not in sys.modules, 'the job imported mlflow'\n")
    env = {**os.environ, tracking.SPOOL_ENV: str(spool)}
    r = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = spool.glob("*.json")
    assert json.loads(rec.read_text())["tags"]["mlflow.parentRunId"] == parent
    assert all(name.startswith("snakemake") for name in _runs(tmp_path))  # nothing logged yet but the parent
    # the invocation's thread logs it; a failed job in this process is spooled and logged too
    logger = tracking.start_spool(cfg)
    monkeypatch.setattr(logger, "interval", 0.05)

    def broken(job):
        raise ValueError("bad input")

    monkeypatch.setattr(cli, "resolve", lambda name: broken)
    with pytest.raises(ValueError):
        cli.run_job("m.broken", cli.Job(cfg=cfg, rule="m.broken"))
    deadline = time.time() + 60
    while list(spool.glob("*.json")) and time.time() < deadline:
        time.sleep(0.1)
    tracking.stop_spool()
    assert tracking.SPOOL_ENV not in os.environ and not list(spool.glob("*"))
    runs = _runs(tmp_path)
    job, failed = runs["m.job_split=test"], runs["m.broken"]
    assert job.info.status == "FINISHED" and job.data.metrics == {"ppl": 9.5}
    assert job.data.tags["mlflow.parentRunId"] == parent == failed.data.tags["mlflow.parentRunId"]
    assert job.info.start_time <= job.info.end_time
    assert failed.info.status == "FAILED" and failed.data.tags["error"] == "ValueError: bad input"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri(tmp_path))
    assert [a.path for a in client.list_artifacts(job.info.run_id)] == ["table.csv"]
    # a record left behind (a killed invocation) is logged when the next invocation starts its logger
    tracking.spool_run(spool, cfg, "m.left", {}, metrics={"x": 1.0}, start_time=time.time())
    tracking.start_spool(cfg)
    tracking.stop_spool()
    assert _runs(tmp_path)["m.left"].info.status == "FINISHED" and not list(spool.glob("*.json"))


def test_spooled_live_curves_end_in_the_jobs_run(tmp_path, monkeypatch):
    """Under Snakemake a training's live curve points are spooled too (the job imports no MLflow): the thread logs
    them into one run per job, which the job's final record finishes (every point once, not again from its
    step_metrics); a killed attempt's RUNNING run is reopened by the resumed attempt (another process) and tagged
    'resumed', as in one run without the spool."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.SPOOL_ENV, raising=False)
    cfg = {"name": "t", "results_dir": str(tmp_path), "threads": 1}
    spool = tmp_path / tracking.SPOOL_DIR

    def job_process(rule, live_steps, finish):
        code = ("import sys; sys.path.insert(0, 'src'); from knnlm import cli\n"
                f"job = cli.Job(cfg={cfg!r}, rule={rule!r}, wildcards={{'key': 'att'}})\n"
                "def train(job):\n"
                f"    for s in {live_steps!r}:\n"
                "        job.curve(s, {'valid_nll': 5.0 - s / 100})\n"
                "    return {'metrics': {'best': 4.7}, 'step_metrics': {'valid_nll': [(s, 5.0 - s / 100) for s in (10, 20, 30)]}}\n"
                + ("cli.resolve = lambda name: train\ncli.run_job(job.rule, job)\n" if finish else "train(job)\n")
                + "assert 'mlflow' not in sys.modules, 'the job imported mlflow'\n")
        r = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env={**os.environ, tracking.SPOOL_ENV: str(spool)},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]

    job_process("m.fit", (10, 20, 30), finish=True)  # one attempt
    job_process("m.train", (10, 20), finish=False)  # killed after two points ...
    job_process("m.train", (30,), finish=True)  # ... and resumed by another process
    assert len(list(spool.glob("*.json"))) == (3 + 1) + 2 + (1 + 1)  # points and final records
    tracking.start_spool(cfg)
    tracking.stop_spool()
    assert not list(spool.glob("*.json"))
    runs = _runs(tmp_path)
    assert sorted(runs) == ["m.fit_key=att", "m.train_key=att"]
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    for name, resumed in (("m.fit_key=att", None), ("m.train_key=att", "true")):
        run = runs[name]
        assert run.info.status == "FINISHED" and run.data.metrics["best"] == 4.7 and run.data.tags.get("resumed") == resumed
        hist = client.get_metric_history(run.info.run_id, "valid_nll")
        assert sorted(m.step for m in hist) == [10, 20, 30]
