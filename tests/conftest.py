import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now, MB, from /proc/self/status: 'VmRSS' (anonymous and mapped file pages) or
    'RssFile' (mapped file pages only, e.g. a memmap's)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:")) / 1024


def run_snakemake(*args, check=True):
    """Run snakemake from the project root; returns CompletedProcess (stdout+stderr merged)."""
    cmd = SNAKEMAKE + ["--profile", "profiles/local", *args]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{r.stdout[-6000:]}")
    return r


TINY_HF = "gpt2-tiny"


def tiny_lms(results: Path) -> Path:
    """A config overlay that adds a second base LM to the tiny run: a random 2-layer GPT-2 with its own byte-level
    BPE tokenizer (tests/hf_tiny.py), made once under results/hf/. Returns the overlay's path."""
    from hf_tiny import make_tiny_hf

    model = results / "hf" / TINY_HF
    if not (model / "config.json").exists():
        data = yaml.safe_load((PROJECT_ROOT / "configs" / "tiny.yaml").read_text())["data"]["dir"]
        make_tiny_hf(model, PROJECT_ROOT / data / "wiki.train.tokens", "gpt2")
    overlay = results / "lms.yaml"
    overlay.write_text(yaml.safe_dump({"lms": {"base": {"source": "train"},
                                               TINY_HF: {"source": "hf", "path": str(model)}}}))
    return overlay


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The whole DAG on configs/tiny.yaml, once per test session, into a temporary results_dir, or (for quick
    iterations while developing) into $KNNLM_TINY_RESULTS, where only what changed is rerun."""
    reused = bool(os.environ.get("KNNLM_TINY_RESULTS"))
    results = Path(os.environ["KNNLM_TINY_RESULTS"]) if reused else tmp_path_factory.mktemp("results")
    overlay = tiny_lms(results)
    env_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        r = run_snakemake("--configfile", "configs/tiny.yaml", str(overlay), "--config", f"results_dir={results}",
                          "--cores", "2")
    finally:
        if env_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env_uri
    return {"results_dir": results, "root": results / "tiny", "log": r.stdout, "reused": reused,
            "configfiles": ["configs/tiny.yaml", str(overlay)]}
