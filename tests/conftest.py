import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def run_snakemake(*args, check=True):
    """Run snakemake from the project root; returns CompletedProcess (stdout+stderr merged)."""
    cmd = SNAKEMAKE + ["--profile", "profiles/local", *args]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{r.stdout[-6000:]}")
    return r


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The whole DAG on configs/tiny.yaml, once per test session, into a temporary results_dir, or (for quick
    iterations while developing) into $KNNLM_TINY_RESULTS, where only what changed is rerun."""
    reused = bool(os.environ.get("KNNLM_TINY_RESULTS"))
    results = Path(os.environ["KNNLM_TINY_RESULTS"]) if reused else tmp_path_factory.mktemp("results")
    env_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        r = run_snakemake("--configfile", "configs/tiny.yaml", "--config", f"results_dir={results}", "--cores", "2")
    finally:
        if env_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env_uri
    return {"results_dir": results, "root": results / "tiny", "log": r.stdout, "reused": reused}
