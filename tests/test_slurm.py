"""profiles/slurm against a real SLURM: a single-node slurmctld + slurmd on localhost with a fake GPU
(scripts/local_slurm.sh), the tiny config submitted through the pinned snakemake-executor-plugin-slurm. Every job
is a SLURM job; GPU rules ask for a GPU in partition gpu and CPU rules do not; each job asks for the CPUs it uses;
its outputs equal the local run's; MLflow holds one run per job. The run is a slice of the DAG that holds every
kind of job (dumps, store, index, searches, real score, exact search, one parametric model: GPU and CPU rules, a job
group), not all of it. Skipped, with the reason, where SLURM cannot be
started (no root, or slurm-wlm/munge not installed)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import PROJECT_ROOT, SNAKEMAKE, copy_artifact
from knnlm.io import read_json
from knnlm.paths import Layout

PROFILE = yaml.safe_load((PROJECT_ROOT / "profiles" / "slurm" / "config.yaml").read_text())
GPU_RULES = {r for r, res in PROFILE["set-resources"].items() if res.get("gpu")}
# The slice of the tiny DAG submitted to SLURM (12 jobs, every kind: the datastore and query dumps, store, IVFPQ index
# and FAISS search, the real score, the exact search (a GPU rule), W_ds (nv1) training, and the small jobs' group)
_FULL_IP = {"lm": "base", "store": "full", "key": "ffn", "metric": "ip", "split": "valid"}
TARGETS = [("exact_dists", _FULL_IP), ("real_dists", _FULL_IP),
           ("parametric_result", {"lm": "base", "variant": "nv1", "key": "att"})]


@pytest.fixture(scope="module")
def slurm(scontrol_without_controller):
    if not shutil.which("slurmctld"):
        pytest.skip("SLURM not installed (apt-get install slurm-wlm munge; .ci/run does this where it can)")
    shimmed, os.environ["PATH"] = os.environ["PATH"], scontrol_without_controller  # the real scontrol (conftest)
    try:
        yield from _local_slurm()
    finally:
        os.environ["PATH"] = shimmed


def _local_slurm():
    script = str(PROJECT_ROOT / "scripts" / "local_slurm.sh")
    state = Path(os.environ.get("LOCAL_SLURM_STATE", "/run/knnlm-local-slurm.pids"))
    ours = not state.exists()  # a SLURM someone else started (and its state file) is left as it was
    r = subprocess.run(["bash", script, "start"], capture_output=True, text=True)
    started = state.read_text().split() if ours and state.exists() else []
    try:
        if r.returncode != 0:
            pytest.skip(f"local SLURM could not be started: {r.stderr.strip()[-500:]}")
        yield r.stdout
    finally:
        if ours and started:  # the daemons this fixture's start launched, ended by their pid
            subprocess.run(["bash", script, "stop"], capture_output=True, text=True)


def _jobs_of(workdir) -> list[dict]:
    """The SLURM jobs (scontrol, kept MinJobAge after they end) whose working directory is `workdir`."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout
    jobs = []
    for line in out.splitlines():
        f = dict(re.findall(r"(\S+?)=(\S*)", line))
        if f.get("WorkDir") == str(workdir):
            jobs.append(f)
    return jobs


def _run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    """Run snakemake; on a timeout, fail with what SLURM held (squeue, sinfo -R) and the end of snakemake's output,
    so a job stuck PENDING behind a stale allocation is told apart from a slow run."""
    try:
        return subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        held = subprocess.run("squeue -o '%i %P %j %T %M %R'; sinfo -R", shell=True, capture_output=True, text=True)
        pytest.fail(f"snakemake ran past {timeout} s. SLURM now:\n{held.stdout}{held.stderr}\n"
                    f"snakemake's output (end):\n{out[-4000:]}")


def _threads_by_slurm_id(log: str) -> dict[str, int]:
    """{SLURM job id: the --threads of its knnlm command} from Snakemake's log ('jobid: N' and the shell command of
    each job, then 'Job N has been submitted with SLURM jobid S')."""
    threads, current = {}, None
    for line in log.splitlines():
        m = re.match(r"\s+jobid: (\d+)", line)
        if m:
            current = m.group(1)
        m = re.search(r"-m knnlm \S+ --threads (\d+)", line)
        if m and current is not None:
            threads[current] = int(m.group(1))
            current = None
    return {s: threads[j] for j, s in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log)
            if j in threads}


def test_slurm_profile_runs_the_tiny_dag(slurm, tiny_run, tmp_path):
    results = tmp_path / "results"
    ours, ref = Layout(results, "tiny"), Layout(tiny_run["results_dir"], "tiny")
    for part in ("data", "bpe", "data-bin", "lms/base/checkpoint.pt", "lms/base/training.json", "lms/base/fairseq"):  # the local run's LM
        copy_artifact(tiny_run["root"] / part, results / "tiny" / part)  # with its checksum record
    before = {j["JobId"] for j in _jobs_of(PROJECT_ROOT)}
    # the profile as users get it; on this 2-core machine: the config's threads instead of the cluster's
    # set-threads, 2 jobs at a time, no account, and job status from squeue (no slurmdbd here)
    cmd = SNAKEMAKE + ["--profile", "profiles/slurm", "--configfile", "configs/tiny.yaml", tiny_run["data_overlay"],
                       "--config", f"results_dir={results}", "--jobs", "2", "--set-threads", "bpe=2", "--slurm-no-account",
                       "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "5",
                       "--latency-wait", "10", *(str(ours.path(n, **w)) for n, w in TARGETS)]
    r = _run(cmd, timeout=3000)
    assert r.returncode == 0, r.stdout[-6000:]
    jobs = [j for j in _jobs_of(PROJECT_ROOT) if j["JobId"] not in before]
    benchmarks = sorted(p.stem for p in (results / "tiny" / "benchmarks").glob("*.tsv"))
    assert jobs and all(j["JobState"] == "COMPLETED" for j in jobs)
    rules = {}
    for j in jobs:  # the plugin names each SLURM job's rule in its comment: rule_<name>_wildcards_<...>
        c = j.get("Comment", "")  # rule_<rule>_wildcards_<values>, or for a group (profile 'groups') rule_<group>_<rules>
        group = next((g for g in PROFILE["group-components"] if c.startswith(f"rule_{g}_")), None)
        m = re.match(r"rule_(.+?)_wildcards", c) or re.match(r"rule_(\w+)", c)
        rules.setdefault(f"group {group}" if group else m.group(1) if m else j["JobName"], []).append(j)
    print({k: len(v) for k, v in rules.items()})
    threads = _threads_by_slurm_id(r.stdout)
    assert {r for r, js in rules.items() for j in js if j["JobId"] not in threads} <= {f"group {g}" for g in
                                                                                   PROFILE["group-components"]}
    for rule, js in rules.items():
        for j in js:
            # the plugin's gpu resource becomes --gpus=1: scontrol's TresPerJob=gres:gpu:1
            gpu = "gres:gpu:1" in j.get("TresPerJob", "") + j.get("TresPerNode", "")
            assert gpu == (rule in GPU_RULES), (rule, j.get("TresPerJob"), j.get("TresPerNode"))
            assert j["Partition"] == ("gpu" if rule in GPU_RULES else "cpu"), (rule, j["Partition"])
            if j["JobId"] in threads:  # the CPUs SLURM gave = the threads the job runs with (--threads)
                assert int(j["NumCPUs"]) == threads[j["JobId"]], (rule, j["NumCPUs"], threads[j["JobId"]])
    assert {"dump_datastore", "dump_queries", "exact_search", "real_score", "train_parametric"} <= set(rules)
    # the grouped small jobs run several Snakemake jobs per SLURM job: SLURM jobs <= Snakemake jobs
    assert len(jobs) <= len(benchmarks)
    # the outputs equal the local run's (same LM): the exact and the FAISS neighbours' real distances, W_ds's NLL
    for name, w in TARGETS[:2]:
        a, b = np.load(ours.path(name, **w)), np.load(ref.path(name, **w))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=name)
    got, want = (read_json(lay.path("parametric_result", lm="base", variant="nv1", key="att")) for lay in (ours, ref))
    assert got["history"]["steps"] == want["history"]["steps"]
    assert got["stages"]["trained"]["test"]["interp"]["ppl_word"] == pytest.approx(
        want["stages"]["trained"]["test"]["interp"]["ppl_word"], rel=1e-4)
    # MLflow: one run per Snakemake job, plus the invocation's parent run
    from knnlm.tracking import count_runs

    assert count_runs(results, "tiny") == len(benchmarks) + 1


def test_unsatisfiable_request_fails_before_submitting(slurm, tmp_path):
    """A request larger than every node of its partition stops the run at once, naming rule, resource and limit."""
    cmd = SNAKEMAKE + ["--profile", "profiles/slurm", "--configfile", "configs/tiny.yaml", "--config",
                       f"results_dir={tmp_path}", "--slurm-no-account", "--slurm-status-command", "squeue",
                       "--set-resources", "prepare_data:mem_mb=99999999"]
    r = _run(cmd, timeout=600)
    assert r.returncode != 0
    assert re.search(r"rule prepare_data: mem_mb = 99999999 MB but the largest node of partition 'cpu' has \d+ MB", r.stdout), r.stdout[-3000:]
    assert not (tmp_path / "tiny" / "data").exists()  # nothing ran
