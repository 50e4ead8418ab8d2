"""Crash and resume, and determinism: a fresh tiny DAG (LM training included) killed with SIGKILL at
several points, rerun with the same command each time, ends with the same LM weights (bit for bit) and the same
numbers (to 1e-6) as the independent uninterrupted run of the test session, and MLflow holds exactly one FINISHED
run per job.

The DAG here is the part of `all` that holds every kill point: one kNN-LM of Table 1 (ffn/IP: LM training,
dumps, the FAISS index and searches, scoring) and one parametric model (nv1, att keys), not all ~150 jobs, so the
test fits the CI's budget; the other rules are the same job runner (knnlm.cli) with the same atomic writes.

LM training resumes from fairseq's checkpoint_last.pt, but a resumed training is not bit-identical to an
uninterrupted one (measured: every downstream table moved by ~1 %), so the kill points here come after it, and
LM training is killed and resumed in a check of its own."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from conftest import PROJECT_ROOT, SNAKEMAKE

# (log file prefix of the job to kill, what it is); the DAG is killed a seeded 0.3-1.5 s after that job starts
TARGETS = ["lms/base/stores/full/scores/ffn_ip.json", "lms/base/parametric/nv1_att/result.json"]  # under results/tiny
KILL_POINTS = [("dump_datastore_", "the datastore dump"), ("build_index_", "an IVFPQ build"),
               ("search_", "a FAISS search"), ("train_parametric_", "a parametric training run")]


def _attempt(cmd, logs: Path, prefix: str | None, delay: float, out_file: Path, timeout: float = 900):
    """Start the DAG (output to out_file: a pipe nobody reads would fill and block it); if `prefix`, SIGKILL its
    whole process group once a job whose log starts with `prefix` has run `delay` seconds. Returns (killed, the
    rules this attempt started)."""
    t0 = time.time()
    with open(out_file, "w") as f:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    killed = False
    while proc.poll() is None and time.time() - t0 < timeout:
        if prefix and logs.is_dir() and any(p.name.startswith(prefix) and p.stat().st_mtime >= t0 for p in logs.iterdir()):
            time.sleep(delay)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            break
        time.sleep(0.2)
    proc.wait(timeout=timeout)
    out = out_file.read_text()
    started = [line.split()[-1].rstrip(":") for line in out.splitlines() if line.startswith(("rule ", "localrule "))]
    if not killed and proc.returncode != 0:
        raise AssertionError(f"attempt failed:\n{out[-4000:]}")
    return killed, started


def _numbers(tree, prefix="") -> dict[str, float]:
    """The numeric leaves of a result.json as {'a.b.c': value}, wall-clock timings left out."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        timing = "seconds" in prefix or "per_second" in prefix
        number = isinstance(tree, (int, float)) and not isinstance(tree, bool)
        return {prefix: float(tree)} if number and not timing else {}
    return {k: v for key, sub in items for k, v in _numbers(sub, f"{prefix}.{key}" if prefix else str(key)).items()}


def test_killed_dag_resumes_to_the_same_tables(tiny_run, tmp_path):
    results = tmp_path / "results"
    cmd = SNAKEMAKE + ["--profile", "profiles/local", "--configfile", "configs/tiny.yaml", tiny_run["data_overlay"],
                       "--config", f"results_dir={results}", "--cores", "2",
                       *(str(results / "tiny" / t) for t in TARGETS)]
    logs = results / "tiny" / "logs"
    rng = np.random.default_rng(13)
    report = []
    for n, (prefix, what) in enumerate(KILL_POINTS):
        # after a kill the working directory's Snakemake lock is stale: a user runs --unlock, then the same command
        if n:
            subprocess.run(cmd + ["--unlock"], cwd=PROJECT_ROOT, capture_output=True, check=True)
        killed, started = _attempt(cmd, logs, prefix, float(rng.uniform(0.3, 1.5)), tmp_path / f"attempt{n}.log")
        report.append(f"kill during {what}: {'killed' if killed else 'finished before the kill point'}; this "
                      f"attempt started {len(started)} jobs ({', '.join(sorted(set(started)))})")
        if not killed:
            break
    subprocess.run(cmd + ["--unlock"], cwd=PROJECT_ROOT, capture_output=True, check=True)
    killed, started = _attempt(cmd, logs, None, 0.0, tmp_path / "final.log")
    report.append(f"final rerun: {len(started)} jobs ({', '.join(sorted(set(started)))})")
    print("\n".join(report))
    assert sum("killed;" in r for r in report) >= 3, report
    assert sum("train_lm" in r for r in report) == 1, report  # trained once, in the first attempt, then kept
    # determinism: the same config and seed train the same LM, bit for bit, as the uninterrupted tiny_run
    import torch

    ours_lm, ref_lm = (torch.load(root / "lms" / "base" / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
                       for root in (results / "tiny", tiny_run["root"]))
    assert ours_lm.keys() == ref_lm.keys() and all(torch.equal(ours_lm[k], ref_lm[k]) for k in ref_lm)
    # every number equals the uninterrupted run's (to 1e-6 relative): the kNN-LM's scores and per-token kNN
    # log-probs, and the parametric model's result and per-token log-probs
    ours, ref = results / "tiny" / "lms" / "base", tiny_run["root"] / "lms" / "base"
    nv1 = Path("parametric") / "nv1_att"
    a, b = (_numbers(json.loads((root / nv1 / "result.json").read_text())) for root in (ours, ref))
    assert a.keys() == b.keys() and any(k.endswith("ppl_word") for k in b)
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, err_msg=f"nv1_att result.json: {k}")
    for split in ("valid", "test"):
        np.testing.assert_allclose(np.load(ours / nv1 / f"{split}_logprobs.npy"),
                                   np.load(ref / nv1 / f"{split}_logprobs.npy"), rtol=1e-6, atol=1e-6)
    scores = Path("stores") / "full" / "scores"
    a, b = (_numbers(json.loads((root / scores / "ffn_ip.json").read_text())) for root in (ours, ref))
    assert a.keys() == b.keys() and any(k.endswith("ppl_word") for k in b)
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, err_msg=f"ffn_ip.json: {k}")
    for split in ("valid", "test"):
        np.testing.assert_allclose(np.load(ours / scores / f"ffn_ip_{split}_knn_logprobs.npy"),
                                   np.load(ref / scores / f"ffn_ip_{split}_knn_logprobs.npy"), rtol=1e-6, atol=1e-6)
    # MLflow: one FINISHED run per job (a killed job logs nothing: runs are written when a job ends), no other
    from mlflow.tracking import MlflowClient

    from knnlm.tracking import tracking_uri

    client = MlflowClient(tracking_uri(results))
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id], max_results=5000)
    jobs = [r for r in runs if r.data.tags.get("rule") != "snakemake"]
    # a job killed after its run ended but before Snakemake recorded it runs again: its earlier run is superseded
    finished = [r.info.run_name for r in jobs if r.info.status == "FINISHED" and "superseded_by" not in r.data.tags]
    assert len(finished) == len(set(finished)) == len(list((results / "tiny" / "benchmarks").glob("*.tsv")))
    assert all(r.info.status == "FINISHED" for r in jobs)
    # no artifact of a killed job under a temporary name
    assert not [p for p in (results / "tiny").rglob("*.tmp-*")]


def test_killed_lm_training_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL during fairseq-train once checkpoint_last.pt exists (end of the first epoch); the same command then
    resumes from it (fairseq logs "Loaded checkpoint"), stops at max_update exactly, and writes the LM with the
    whole validation curve. The LM trains 3 epochs here (about 3 s) so that the kill lands inside the run."""
    from knnlm.lm.training import parse_fairseq_json_log, trained_updates

    results = tmp_path / "results"
    ckpt = results / "tiny" / "lms" / "base" / "checkpoint.pt"
    max_update = 120
    longer = tmp_path / "longer.yaml"  # a second config file: Snakemake merges it into tiny.yaml's 'lm' section
    longer.write_text(f"lm:\n  max_update: {max_update}\n")
    cmd = SNAKEMAKE + ["--profile", "profiles/local", "--configfile", "configs/tiny.yaml", str(longer), "--config",
                       f"results_dir={results}", "--cores", "2", str(ckpt)]
    with open(tmp_path / "attempt0.log", "w") as f:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    fairseq = results / "tiny" / "lms" / "base" / "fairseq"
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < 600 and not list(fairseq.glob("*/checkpoint_last.pt")):
        time.sleep(0.05)
    assert proc.poll() is None, "training ended before its first checkpoint: nothing to resume"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not ckpt.exists()
    (last,) = fairseq.glob("*/checkpoint_last.pt")
    assert trained_updates(last) < max_update, "killed after the last update: nothing left to resume"
    subprocess.run(cmd + ["--unlock"], cwd=PROJECT_ROOT, capture_output=True, check=True)
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    log = (results / "tiny" / "logs" / "train_lm_base.log").read_text()
    assert "Loaded checkpoint" in log and ckpt.exists()
    assert trained_updates(last) == max_update  # fairseq resumed and stopped at max_update, not one update later
    training = json.loads((results / "tiny" / "lms" / "base" / "training.json").read_text())
    with open(results / "tiny" / "logs" / "train_lm_base.fairseq.log") as lf:
        valid = [u for u, _ in parse_fairseq_json_log(lf)["valid_loss"]]
    assert valid[-1] == max_update and training["updates"] == max_update


def test_fairseq_log_survives_a_kill_of_the_job_that_follows_it(tmp_path):
    """knnlm.lm.training._run_fairseq: every line fairseq wrote before a SIGKILL of the whole job is in its log file,
    even when the job was still behind in following it (here: a slow on_log), because the operating system, not the job,
    writes fairseq's output to the file. A finished run whose last records were lost could never be completed."""
    n = 200
    done = tmp_path / "printed"
    child = ("import json, pathlib, time\n"
             f"for i in range({n}):\n"
             "    print('| INFO | valid | ' + json.dumps({'valid_loss': '5.0', 'valid_num_updates': str(i)}), flush=True)\n"
             f"pathlib.Path({str(done)!r}).touch()\n"
             "time.sleep(120)\n")
    parent = ("import sys, time\n"
              "from knnlm.lm.training import _run_fairseq\n"
              f"_run_fairseq([sys.executable, '-c', {child!r}], 1, {str(tmp_path / 'fairseq.log')!r},\n"
              "             on_log=lambda step, values: time.sleep(0.05), poll_s=0.05)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=PROJECT_ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not done.exists() and proc.poll() is None and time.time() - t0 < 60:
        time.sleep(0.02)
    assert done.exists(), "the fake fairseq did not run"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from knnlm.lm.training import parse_fairseq_json_log

    with open(tmp_path / "fairseq.log") as lf:
        assert [u for u, _ in parse_fairseq_json_log(lf)["valid_loss"]] == list(range(n))
