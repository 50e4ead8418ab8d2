import os
import shutil
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


def copy_artifact(src: Path, dst: Path) -> None:
    """Copy a run's artifact (a file, or a folder such as data-bin/) with its checksum record beside it
    (knnlm.io.checksum_path), as a run folder is moved: a job refuses an artifact of a run's folder without one."""
    from knnlm.io import checksum_path

    dst.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    if checksum_path(src).exists():
        shutil.copy2(checksum_path(src), checksum_path(dst))


def run_snakemake(*args, check=True):
    """Run snakemake from the project root; returns CompletedProcess (stdout+stderr merged)."""
    cmd = SNAKEMAKE + ["--profile", "profiles/local", *args]
    r = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{r.stdout[-6000:]}")
    return r


TINY_HF = "gpt2-tiny"
TINY_SEED2 = "base-s2"  # the tiny LM with another seed (App. E.5)
TINY_OVERFIT = "base-overfit"  # the tiny LM trained further without dropout (App. E.6.1)
TINY_SOFT = "base-soft"  # a tiny LM on the tiny LM's soft labels, otherwise base-s2's twin (App. E.6.2)
WIKITEXT2 = PROJECT_ROOT / "corpora" / "wikitext-2-v1.tar.xz"  # shipped with the pipeline (corpora/README.md)


def unpack_wikitext2(dest: Path) -> Path:
    """The shipped WikiText-2 splits unpacked into dest/wikitext-2 (once); returns that folder."""
    import tarfile

    out = dest / "wikitext-2"
    if not all((out / f"wiki.{s}.tokens").is_file() for s in ("train", "valid", "test")):
        with tarfile.open(WIKITEXT2) as t:
            t.extractall(dest, filter="data")
    return out


@pytest.fixture(scope="session", autouse=True)
def scontrol_without_controller(tmp_path_factory):
    """Snakemake imports every installed executor plugin when it starts, and the SLURM plugin then asks `scontrol show
    config` for MinJobAge (to word a help text). Where SLURM's tools are installed but no controller answers (CI
    installs slurm-wlm for tests/test_slurm.py), scontrol retries for ~9 s, so each of the suite's snakemake
    invocations would wait that long. For the tests, `scontrol` fails at once (the plugin takes MinJobAge as unknown);
    tests/test_slurm.py, which starts a controller, puts the real one back. Yields the PATH with the real scontrol."""
    real_path = os.environ["PATH"]
    if shutil.which("scontrol") is None:
        yield real_path
        return
    shim = tmp_path_factory.mktemp("scontrol-shim")
    (shim / "scontrol").write_text("#!/bin/sh\necho 'scontrol: no SLURM controller in this test' >&2\nexit 1\n")
    (shim / "scontrol").chmod(0o755)
    os.environ["PATH"] = f"{shim}{os.pathsep}{real_path}"
    try:
        yield real_path
    finally:
        os.environ["PATH"] = real_path


@pytest.fixture(scope="session")
def wikitext2_dir(tmp_path_factory) -> Path:
    """A folder with the shipped WikiText-2 splits (wiki.{train,valid,test}.tokens), unpacked once per session."""
    return unpack_wikitext2(tmp_path_factory.mktemp("corpora"))


def tiny_lms(results: Path) -> Path:
    """A config overlay that adds base LMs to the tiny run: a random 2-layer GPT-2 with its own byte-level BPE
    tokenizer (tests/hf_tiny.py), made once under results/hf/, the tiny LM trained with another seed, which App.
    E.5 ensembles with the base LM (config 'hypotheses.ensemble_lms'), the base LM trained 20 updates further
    without dropout (App. E.6.1, 'hypotheses.overfit_lms') and the seed-2 LM trained on the base LM's soft labels
    (App. E.6.2, 'hypotheses.soft_label_lms'); the base and overfit LMs are the regime map's LM axis
    ('regime.lms'). Returns the overlay's path."""
    from hf_tiny import make_tiny_hf

    model = results / "hf" / TINY_HF
    if not (model / "config.json").exists():
        make_tiny_hf(model, unpack_wikitext2(results / "corpora") / "wiki.train.tokens", "gpt2")
    overlay = results / "lms.yaml"
    overlay.write_text(yaml.safe_dump({"lms": {"base": {"source": "train"},
                                               TINY_HF: {"source": "hf", "path": str(model)},
                                               TINY_SEED2: {"source": "train", "lm": {"seed": 2}},
                                               TINY_OVERFIT: {"source": "train", "init_from": "base", "checkpoint": "last",
                                                              "lm": {"dropout": 0.0, "max_update": 20,
                                                                     "warmup_updates": 5}},
                                               TINY_SOFT: {"source": "train", "teacher": "base", "lm": {"seed": 2}}},
                                       "hypotheses": {"ensemble_lms": [TINY_SEED2], "overfit_lms": [TINY_OVERFIT],
                                                      "soft_label_lms": [TINY_SOFT]},
                                       # the regime map's LM axis: the base LM and the base LM trained further
                                       # (two points, which a trend needs; CI's time keeps it to two)
                                       "regime": {"lms": ["base", TINY_OVERFIT]}}))
    return overlay


def headingless_data(results: Path) -> Path:
    """A config overlay whose data are the shipped WikiText-2 files without their heading lines (' = Title = ',
    ' = = Section = = '), as a corpus without WikiText markup looks: the tiny DAG runs on it with no 'stats'
    setting, so its documents come from 'stats.documents: auto'. Returns the overlay's path."""
    import re

    src = unpack_wikitext2(results / "corpora")
    dst = results / "data-headingless"
    dst.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        lines = (src / f"wiki.{split}.tokens").read_text(encoding="utf-8").splitlines(keepends=True)
        text = "".join(l for l in lines if not re.match(r"^ =.* = $", l.rstrip("\n")))
        if not (dst / f"wiki.{split}.tokens").exists() or (dst / f"wiki.{split}.tokens").read_text() != text:
            (dst / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
    overlay = results / "data.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"dir": str(dst), "archive": None, "sha256": None}}))
    return overlay


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The whole DAG (targets 'all' and 'regime') on configs/tiny.yaml over its WikiText-2 slice without headings (headingless_data), once per
    test session, into a temporary results_dir, or (for quick iterations while developing) into
    $KNNLM_TINY_RESULTS, where only what changed is rerun."""
    reused = bool(os.environ.get("KNNLM_TINY_RESULTS"))
    results = Path(os.environ["KNNLM_TINY_RESULTS"]) if reused else tmp_path_factory.mktemp("results")
    data = headingless_data(results)
    overlay = tiny_lms(results)
    env_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        r = run_snakemake("--configfile", "configs/tiny.yaml", str(data), str(overlay), "--config",
                          f"results_dir={results}", "--cores", "2", "--", "all", "regime")
    finally:
        if env_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env_uri
    return {"results_dir": results, "root": results / "tiny", "log": r.stdout, "reused": reused,
            "configfiles": ["configs/tiny.yaml", str(data), str(overlay)], "data_overlay": str(data)}


# The lanes (markers declared in pyproject.toml): every test is exactly one of unit, dag, slurm, gpu.
_MODULE_LANE = {"test_slurm": "slurm", "test_gpu": "gpu", "test_resume": "dag"}
_LANES = ("unit", "dag", "slurm", "gpu")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in _LANES):
            continue
        lane = _MODULE_LANE.get(item.module.__name__.rpartition(".")[2])
        if lane is None:
            lane = "dag" if "tiny_run" in getattr(item, "fixturenames", ()) else "unit"
        item.add_marker(getattr(pytest.mark, lane))
