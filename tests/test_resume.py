"""Crash and resume, and determinism: the DAG killed with SIGKILL inside each kind of long job and rerun with the same
command ends with the same numbers (to 1e-6; the findings byte for byte) as the uninterrupted run of the test session,
and MLflow holds exactly one FINISHED run per job; the same config and seed train the same LM bit for bit.

Each kill forces one rule to run again on a copy of the tiny run (the part of `all` that holds every kind of long job:
one kNN-LM of Table 1, its mask/score settings with the exact search in shards, the nested exact search, one
parametric model, and the findings), not all ~175 jobs, so the test fits the CI's budget; the other rules are the
same job runner (knnlm.cli) with the same atomic writes.

LM training resumes from fairseq's checkpoint_last.pt, but a resumed training is not bit-identical to an
uninterrupted one (measured: every downstream table moved by ~1 %), so LM training is killed and resumed in a check of
its own."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from conftest import PROJECT_ROOT, SNAKEMAKE, copy_artifact
from knnlm.paths import Layout

_FFN_IP = {"lm": "base", "store": "full", "key": "ffn", "metric": "ip"}
# What the killed DAG computes (the kNN-LM of Table 1 with ffn/IP keys, its mask/score settings, the nested exact
# search of the 20 % and full stores, W_ds nv1 on att keys) in 2 exact-search shards, so that a shard and its merge are
# killed too; the findings are killed on their own, first.
TARGETS = [("score", _FFN_IP), ("settings", _FFN_IP), ("parametric_result", {"lm": "base", "variant": "nv1", "key": "att"}),
           *(("exact_ids", {"lm": "base", "store": s, "key": "ffn", "metric": "l2", "split": "valid"}) for s in ("r0.2", "full"))]
# (rule forced to run again, what it is) in the order of the DAG: the DAG is SIGKILLed, by its process group, at a
# seeded 20-60 % of that job's time in the uninterrupted run, and each kill must land inside the job
KILL_POINTS = [("dump_datastore", "the datastore dump"), ("build_index", "an IVFPQ build"), ("search", "a FAISS search"),
               ("exact_search", "an exact-search shard"), ("exact_merge", "the merge of exact-search shards"),
               ("settings", "the mask/score settings"), ("train_parametric", "a parametric training run")]
TIMINGS = ("seconds", "per_second", "machine", "scan", "sweep_seconds", "merge", "gflops", "shards")


def _attempt(cmd, t_kill: dict[str, float] | None, rule: str | None, out_file: Path, timeout: float = 900):
    """Run the DAG (output to out_file: a pipe nobody reads would fill and block it); with `rule`, SIGKILL its whole
    process group once the first job of that rule has run t_kill[its log name] seconds. Returns (the killed job's
    outputs as the DAG printed them, or None when the DAG ended first; the DAG's output)."""
    t0 = time.time()
    with open(out_file, "w") as f:  # unbuffered: a job's block is in the file when the job starts, not when it ends
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    victim = None
    while proc.poll() is None and time.time() - t0 < timeout:
        if rule and victim is None:
            blocks = _jobs(out_file.read_text())
            victim = next((b for b in blocks if b["rule"] == rule), None)
            started = time.time()
        if victim is not None and time.time() - started >= t_kill[victim["log"]]:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(timeout=timeout)
    out = out_file.read_text()
    if victim is None and proc.returncode != 0:
        raise AssertionError(f"attempt failed:\n{out[-4000:]}")
    return victim, out


def _jobs(out: str) -> list[dict]:
    """The jobs a Snakemake run printed: [{'rule', 'outputs', 'log' (the log file's stem)}] in the order started."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        m = re.match(r"(?:local)?rule (\w+):", block)
        outs, log = re.search(r"\n\s+output: (.+)", block), re.search(r"\n\s+log: (\S+)", block)
        if m and outs and log:
            jobs.append({"rule": m.group(1), "outputs": outs.group(1).split(", "), "log": Path(log.group(1)).stem})
    return jobs


def _numbers(tree, prefix="") -> dict[str, float]:
    """The numeric leaves of a result JSON as {'a.b.c': value}, wall-clock timings and how the scan ran left out."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        skip = any(t in prefix for t in TIMINGS)
        number = isinstance(tree, (int, float)) and not isinstance(tree, bool)
        return {prefix: float(tree)} if number and not skip else {}
    return {k: v for key, sub in items for k, v in _numbers(sub, f"{prefix}.{key}" if prefix else str(key)).items()}


def _same_numbers(a: Path, b: Path):
    x, y = (_numbers(json.loads(p.read_text())) for p in (a, b))
    assert x.keys() == y.keys() and x, f"{a}: other fields than {b}"
    for k in y:
        np.testing.assert_allclose(x[k], y[k], rtol=1e-6, err_msg=f"{a.name}: {k}")


def test_killed_in_every_long_job_the_dag_resumes_to_the_same_tables(tiny_run, tmp_path):
    """SIGKILL of the whole DAG inside each kind of long job: the findings, the datastore dump, an IVFPQ build, a FAISS
    search, an exact-search shard, the shards' merge, the settings and W_ds training, each job forced to run again on a copy of the tiny run and killed part-way; each kill
    lands inside its job (its outputs are absent after it, under their names and any temporary one), and the same
    command then completes. Every number equals the uninterrupted tiny run's (to 1e-6; the findings byte for byte, the
    real masks bit for bit up to which of the keys tied at the k-th distance is kept), the shards are gone, and MLflow
    holds one FINISHED run per job. LM training is killed and resumed in a test of its own; here the same config
    and seed train the same LM, bit for bit."""
    import torch

    results = tmp_path / "results"
    ours, ref = Layout(results, "tiny"), Layout(tiny_run["results_dir"], "tiny")
    # determinism: the same config and seed train the same LM, bit for bit, as the tiny run did
    fresh = tmp_path / "fresh"
    for part in ("data", "bpe", "data-bin"):
        copy_artifact(tiny_run["root"] / part, fresh / "tiny" / part)
    lm = SNAKEMAKE + ["--profile", "profiles/local", "--configfile", *tiny_run["configfiles"], "--config",
                      f"results_dir={fresh}", "--cores", "2", str(Layout(fresh, "tiny").path("checkpoint", lm="base"))]
    r = subprocess.run(lm, cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    a, b = (torch.load(root.path("checkpoint", lm="base"), map_location="cpu", weights_only=False)["model"]
            for root in (Layout(fresh, "tiny"), ref))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
    # a copy of the whole tiny run (mtimes kept, so it is up to date), searched in 2 exact-search shards from here on
    shutil.copytree(tiny_run["root"], results / "tiny", symlinks=True)
    overlay = tmp_path / "sharded.yaml"
    overlay.write_text("retrieval: {exact_shards: 2}\n")
    base = SNAKEMAKE + ["--profile", "profiles/local", "--configfile", *tiny_run["configfiles"], str(overlay),
                        "--config", f"results_dir={results}", "--cores", "2"]
    t_ref = {p.stem: _bench_seconds(p) for p in (tiny_run["root"] / "benchmarks").glob("*.tsv")}
    rng = np.random.default_rng(13)
    t_kill = {log: s * rng.uniform(0.2, 0.6) for log, s in sorted(t_ref.items())}
    report = []

    def kill(targets, rule, what, n):
        # a job that ends before its kill (the machine runs it faster now than in the uninterrupted run) is forced
        # again, killed at 10-30 % (half the first kill's share) of the time it has just taken (its own benchmark
        # file), so the kill follows this machine's speed at the moment, not the reference run's
        times = _KillTimes(t_kill)
        for tries in range(4):
            # (--nolock: a killed DAG leaves its lock behind; a user runs --unlock once, as before the final run)
            victim, out = _attempt(base + [*targets, "--nolock", "--forcerun", rule], times, rule,
                                   tmp_path / f"kill{n}_{tries}.log")
            assert victim is not None, f"the DAG ended before {what} ({rule}) started:\n{out[-3000:]}"
            if not [o for o in victim["outputs"] if Path(o).exists()]:
                break
            bench = results / "tiny" / "benchmarks" / f"{victim['log']}.tsv"
            took = _bench_seconds(bench) if bench.exists() else times[victim["log"]]
            times = _KillTimes({**times, victim["log"]: min(times[victim["log"]], took) * rng.uniform(0.1, 0.3)})
        left = [o for o in victim["outputs"] if Path(o).exists()]
        assert not left, f"kill during {what}: {victim['log']} ended before each of {tries + 1} kills ({left})"
        tmp = [p for o in victim["outputs"] for p in Path(o).parent.glob(Path(o).name + ".tmp-*")]
        report.append(f"killed during {what}: {victim['log']} (try {tries + 1}), {len(_jobs(out))} jobs started, "
                      f"temporary files {len(tmp)}")

    findings = [str(ours.path("findings", lm="base"))]
    kill(findings, "write_findings", "the findings", 0)
    subprocess.run(base + ["--unlock"], cwd=PROJECT_ROOT, capture_output=True, check=True)
    _, out = _attempt(base + findings, None, None, tmp_path / "findings.log")
    assert [j["rule"] for j in _jobs(out)] == ["write_findings"], out[-3000:]
    written = _jobs(out)[0]["outputs"]
    for f in written:
        g = Path(f.replace(str(results), str(tiny_run["results_dir"])))
        assert Path(f).read_bytes() == g.read_bytes(), f
    targets = [str(ours.path(n, **w)) for n, w in TARGETS]
    for n, (rule, what) in enumerate(KILL_POINTS, 1):
        kill(targets, rule, what, n)
    subprocess.run(base + ["--unlock"], cwd=PROJECT_ROOT, capture_output=True, check=True)
    _, out = _attempt(base + targets, None, None, tmp_path / "final.log")
    report.append(f"final rerun: {len(_jobs(out))} jobs ({', '.join(sorted({j['rule'] for j in _jobs(out)}))})")
    print("\n".join(report))
    # every number equals the uninterrupted run's
    for split in ("valid", "test"):
        w = {**_FFN_IP, "split": split}
        for name in ("knn_logprobs", "knn_logprobs_tuned"):
            np.testing.assert_allclose(np.load(ours.path(name, **w)), np.load(ref.path(name, **w)), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.load(ours.path("real_dists", **w)), np.load(ref.path("real_dists", **w)))
        par = {"lm": "base", "variant": "nv1", "key": "att", "split": split}
        np.testing.assert_allclose(np.load(ours.path("parametric_logprobs", **par)), np.load(ref.path("parametric_logprobs", **par)),
                                   rtol=1e-6, atol=1e-6)
    for name, w in TARGETS[:3]:
        _same_numbers(ours.path(name, **w), ref.path(name, **w))
    # the real masks of the shards' merges equal the one-scan masks; each merged meta lists shards covering the keys
    for w in [{**_FFN_IP, "split": s} for s in ("valid", "test")] + [w for n, w in TARGETS[3:]]:
        got_i, got_d = np.load(ours.path("exact_ids", **w)), np.load(ours.path("exact_dists", **w))
        want_i, want_d = np.load(ref.path("exact_ids", **w)), np.load(ref.path("exact_dists", **w))
        np.testing.assert_array_equal(got_d, want_d)
        tied = want_d == want_d[:, -1:]
        np.testing.assert_array_equal(got_i[~tied], want_i[~tied])
        spans = [s["span"] for s in json.loads(ours.path("exact_meta", **w).read_text())["shards"]]
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
        assert len(spans) >= 2 if w["store"] == "full" else len(spans) >= 1
    root = results / "tiny"
    assert not list(root.rglob("shards/*")) and not list((root / "lms/base/nested_scan").glob("*"))
    assert not [p for p in root.rglob("*.tmp-*")]  # no artifact of a killed job under a temporary name
    # MLflow: one FINISHED run per job that ran here (a killed job logs nothing: runs are written when a job ends)
    from mlflow.tracking import MlflowClient

    from knnlm.tracking import tracking_uri

    client = MlflowClient(tracking_uri(results))
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id], max_results=5000)
    jobs = [r for r in runs if r.data.tags.get("rule") != "snakemake"]
    finished = [r.info.run_name for r in jobs if r.info.status == "FINISHED" and "superseded_by" not in r.data.tags]
    assert len(finished) == len(set(finished)) and all(r.info.status == "FINISHED" for r in jobs)
    assert {"findings.findings", "spine.dump_datastore", "retrieval.exact_merge", "parametric.train_parametric"} <= \
        {r.data.tags.get("rule") for r in jobs}


def _bench_seconds(path: Path) -> float:
    """A job's wall time in seconds from its Snakemake benchmark file (column 's' of its one row)."""
    return float(path.read_text().splitlines()[1].split()[0])


class _KillTimes(dict):
    """t_kill by log name; a job the uninterrupted run did not have (a shard, a merge) is killed after 0.4 s."""

    def __missing__(self, log):
        return 0.4


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
