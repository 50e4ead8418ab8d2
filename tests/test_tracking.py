"""MLflow bookkeeping (knnlm.tracking): a failed job leaves a FAILED run, jobs are children of the invocation's run."""
import pytest

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
    tracking.end_parent_run(cfg, parent, ok=False)
    runs = _runs(tmp_path)
    assert runs["m.broken"].info.status == "FAILED"
    assert runs["m.broken"].data.tags["error"] == "ValueError: config key 'x': expected 1, found 2"
    assert runs["m.fine"].info.status == "FINISHED" and runs["m.fine"].data.metrics == {"a": 1.0}
    assert {runs[n].data.tags["mlflow.parentRunId"] for n in ("m.broken", "m.fine")} == {parent}
    assert [r.info.status for r in runs.values() if r.info.run_id == parent] == ["FAILED"]
