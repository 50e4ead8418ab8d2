"""Every kind of bad artifact a job reads, tried once on the tiny run's own files: each job gets a clear error naming
the file and what it expected, before any work, and leaves none of its outputs behind.

A case copies the job's inputs it corrupts into a temporary folder, points the job (its config and files as the tiny
DAG runs it: `python -m knnlm <job> --cfg ... --io ...`, taken from a dry run) at the copy and at temporary outputs,
and runs it as that command does (knnlm.cli.run_job, which logs the FAILED run).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import run_snakemake
from knnlm.config import PROJECT_ROOT


def _commands(tiny_run) -> dict[str, tuple[str, dict, dict]]:
    """{log name: (job, cfg, io)} of every job of the tiny DAG, from a forced dry run that prints their commands."""
    r = run_snakemake("--configfile", *tiny_run["configfiles"], "--config", f"results_dir={tiny_run['results_dir']}",
                      "-n", "-p", "--forceall")
    out = {}
    for line in r.stdout.splitlines():
        if " -m knnlm " not in line or "--io" not in line:
            continue
        argv = shlex.split(line.split(" -m knnlm ", 1)[1].split(" > ", 1)[0])
        job, cfg, io = argv[0], json.loads(argv[argv.index("--cfg") + 1]), json.loads(argv[argv.index("--io") + 1])
        log = line.rsplit(" > ", 1)[1].split()[0]
        out[os.path.basename(log).removesuffix(".log")] = (job, cfg, io)
    return out


@pytest.fixture(scope="module")
def commands(tiny_run):
    return _commands(tiny_run)


def _run(commands, name, tmp_path, corrupt):
    """Run job `name` in this process (knnlm.cli.run_job, as `python -m knnlm` does) with its outputs in tmp_path/out
    and `corrupt(io, tmp)` rewriting its inputs; returns (the error it raised, or None; the output paths)."""
    from knnlm.cli import run_job
    from knnlm.job import Job

    job, cfg, io = commands[name]
    io = json.loads(json.dumps(io))
    outs = []
    for k, v in io["output"].items():
        paths = v if isinstance(v, list) else [v]
        new = [str(tmp_path / "out" / f"{k}_{i}_{os.path.basename(p)}") for i, p in enumerate(paths)]
        io["output"][k] = new if isinstance(v, list) else new[0]
        outs += new
    (tmp_path / "out").mkdir(parents=True, exist_ok=True)
    corrupt(io, tmp_path)
    cfg = {**cfg, "results_dir": str(tmp_path / "results")}
    try:
        run_job(job, Job(cfg=cfg, input=io["input"], output=io["output"], wildcards=io.get("wildcards", {}),
                         extra=io.get("extra", {}), threads=1, rule=job))
    except Exception as e:  # noqa: BLE001 - the test asserts what it is
        return e, outs
    return None, outs


def _copy(io, tmp_path, name, i=None):
    """Copy input `name` (its i-th path for a list) into tmp_path and point io at the copy; returns the copy."""
    v = io["input"][name]
    src = v[i] if i is not None else v
    dst = tmp_path / f"in_{name}_{i}_{os.path.basename(src)}"
    shutil.copy(os.path.join(PROJECT_ROOT, src) if not os.path.isabs(src) else src, dst)
    if i is not None:
        io["input"][name][i] = str(dst)
    else:
        io["input"][name] = str(dst)
    return dst


def _edit_json(path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


def _find(commands, prefix):
    names = sorted(n for n in commands if n.startswith(prefix))
    assert names, f"no job {prefix}* in the tiny DAG"
    return names[0]


def _swap_index(io, tmp_path, other):
    """Point input 'index' at a copy of the same store's index `other` ('att_l2', 'ffn_ip', ...), as a file put under
    the job's index name; returns the copy."""
    src = Path(io["input"]["index"])
    dst = tmp_path / f"in_index_{src.name}"
    shutil.copy(src.with_name(f"{other}.faiss"), dst)
    io["input"]["index"] = str(dst)
    return dst


def _unrecorded_in_run(io, tmp_path, name):
    """Copy input `name` into the job's run folder (results_dir/tiny, where every artifact has a checksum record)
    without its record, as a file copied in by hand or whose record was deleted; returns the copy."""
    src = Path(io["input"][name])
    dst = tmp_path / "results" / "tiny" / "lms" / "base" / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    io["input"][name] = str(dst)
    return dst


CASES = {
    # (job log-name prefix, what is corrupted, the error it must give)
    "another metric's index under this name": ("search_base_full_ffn_l2_test", lambda io, t: _swap_index(io, t, "ffn_ip"),
                                               r"an index of metric ip, where this job searches l2"),
    "the other key type's index under this name": ("search_base_full_ffn_l2_test",
                                                   lambda io, t: _swap_index(io, t, "att_l2"),
                                                   r"the vectors it holds are not these ffn keys"),
    "an index recorded for another store": ("search_base_full_ffn_l2_test",
                                            lambda io, t: _edit_json(_copy(io, t, "index_meta"), store="r0.2"),
                                            r"an index built for .*'store': 'r0.2'.*where this job searches .*'full'"),
    "an index in the run's folder without its record": (
        "search_base_full_ffn_l2_test", lambda io, t: _unrecorded_in_run(io, t, "index"),
        r"no checksum record .*`snakemake -R .*ffn_l2\.faiss <your options>`.*`python -m knnlm\.adopt "),
    "index from another checkpoint": ("search_base_full_ffn_l2_test",
                                      lambda io, t: _edit_json(_copy(io, t, "index_meta"), datastore_checkpoint_sha256="0" * 64),
                                      r"was built from another checkpoint than the datastore"),
    "neighbours of another datastore": ("score_base_full_ffn_l2",
                                        lambda io, t: _edit_json(_copy(io, t, "nb_meta", 0), N=7),
                                        r"neighbours were searched in another datastore"),
    "a cache of another size": ("real_score_base_r0.2_ffn_l2_test",
                                lambda io, t: _edit_json(_copy(io, t, "nb_meta"), T=3, queries="scope"),
                                r"expected shape \(3, \d+\), found \(\d+, \d+\)"),
    "a truncated query file": ("search_base_full_ffn_l2_test",
                               lambda io, t: (lambda p: p.write_bytes(p.read_bytes()[:-1000]))(_copy(io, t, "queries")),
                               r"is truncated: header promises"),
    "a garbage .npy header": ("search_base_full_ffn_l2_test",
                              lambda io, t: _copy(io, t, "key_file").write_bytes(b"not an array" * 100),
                              r"not a valid \.npy file"),
    "a truncated index": ("search_base_full_ffn_l2_test",
                          lambda io, t: (lambda p: p.write_bytes(p.read_bytes()[:200]))(_copy(io, t, "index")),
                          r"not a complete faiss IVF index"),
    "settings on an exact search of another scope": ("settings_base_full_ffn_ip",
                                                     lambda io, t: _edit_json(_copy(io, t, "exact_meta", 1), T=5),
                                                     r"exact search of 5 queries, the scope has \d+"),
    "settings on an exact search of other tokens of the scope's size": (
        "settings_base_full_ffn_ip", lambda io, t: _edit_json(_copy(io, t, "exact_meta", 1), token_digest="0" * 16),
        r"exact search of the tokens with digest 0{16}, the scope's are [0-9a-f]{16}"),
    "queries of another checkpoint than the datastore": (
        "exact_search_base_full_ffn_ip_test",
        lambda io, t: _edit_json(_copy(io, t, "queries_manifest"), checkpoint_sha256="0" * 64),
        r"does not match what this run expects[\s\S]*checkpoint_sha256: manifest has '0{64}'"),
    "a scope beyond the split": ("exact_search_base_full_ffn_ip_test",
                                 lambda io, t: np.save(_copy(io, t, "scope"), np.array([0, 10 ** 8])),
                                 r"token 100000000 beyond the \d+ tokens of split test"),
}


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One MLflow store for every case's FAILED run (created once)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_corrupt_input_is_named_and_nothing_is_written(commands, tracking, tmp_path, monkeypatch, case):
    from knnlm.io import ArtifactError

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    prefix, corrupt, message = CASES[case]
    name = _find(commands, prefix)
    seen = {}

    def apply(io, t):
        corrupt(io, t)
        seen.update(io["input"])

    err, outs = _run(commands, name, tmp_path, apply)
    assert isinstance(err, ArtifactError), f"{case}: expected an ArtifactError, got {err!r}"
    assert re.search(message, str(err)), f"{case}: {err}"
    inputs = {p for v in seen.values() for p in (v if isinstance(v, list) else [v])}
    assert any(p in str(err) for p in inputs), f"{case}: the error names none of the job's input files: {err}"
    left = [p for p in outs if os.path.exists(p)] + [str(p) for p in (tmp_path / "out").iterdir()]
    assert not left, f"{case}: outputs left behind: {left}"


SEALED = {  # (job log-name prefix, its input damaged in place: size and mtime kept)
    "index": ("search_base_full_ffn_l2_test", "index"),
    "keys": ("build_index_base_full_ffn_l2", "key_file"),
    "neighbour ids": ("real_score_base_full_ffn_l2_test", "nb_ids"),
    "checkpoint": ("dump_queries_base_test", "checkpoint"),
}


@pytest.mark.parametrize("case", sorted(SEALED))
def test_an_artifact_damaged_in_place_stops_its_reader(commands, tracking, tmp_path, monkeypatch, case):
    """A finished job's output damaged in place (16 4-byte words reversed and bumped, size and mtime put back: what a
    shuffled FAISS centroid region looks like) stops the next job that reads it with an error naming the file and the
    rule that made it, before any output (the file's checksum record, knnlm.io.verify_checksum), never a number."""
    from knnlm.io import ArtifactError, checksum_path, read_json

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    prefix, name = SEALED[case]
    job = _find(commands, prefix)
    assert name in commands[job][2]["input"], f"{job} reads no input {name!r}: {sorted(commands[job][2]['input'])}"
    damaged, makers = [], []

    def damage(io, t):
        v = io["input"][name]
        src = v[0] if isinstance(v, list) else v
        src = src if os.path.isabs(src) else os.path.join(PROJECT_ROOT, src)
        makers.append(read_json(checksum_path(src))["maker"]["rule"])  # every finished job's output has its record
        dst = t / f"in_{os.path.basename(src)}"
        shutil.copy2(src, dst)
        shutil.copy2(checksum_path(src), checksum_path(dst))
        st = dst.stat()
        data = np.fromfile(dst, dtype=np.uint8)
        mid = len(data) // 2 // 4 * 4
        words = data[mid:mid + 64].view(np.uint32).copy()
        data[mid:mid + 64] = np.ascontiguousarray(words[::-1]).view(np.uint8) + np.uint8(1)
        data.tofile(dst)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        io["input"][name] = [str(dst)] + list(v[1:]) if isinstance(v, list) else str(dst)
        damaged.append(str(dst))

    err, outs = _run(commands, job, tmp_path, damage)
    assert isinstance(err, ArtifactError), f"{case}: expected an ArtifactError, got {err!r}"
    assert damaged[0] in str(err) and "changed" in str(err) and f"job {makers[0]}" in str(err), str(err)
    assert not [p for p in outs if os.path.exists(p)]
