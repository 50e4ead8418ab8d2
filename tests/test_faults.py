"""Faults and hostile input: artifacts that prove they are whole (checksum records, checked by the job that reads
them), a search that range-checks the ids it writes, a full disk named in the job's log, `--config` values read
as YAML, an own corpus's raw files checksummed, one invocation per run folder, and MLflow records that a killed
invocation leaves behind closed or removed."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import PROJECT_ROOT, run_snakemake
from knnlm.io import (ArtifactError, checksum_path, create_npy, read_json, save_npy, sha256_files, sweep_checksums,
                      verify_checksum, write_checksum)

MAKER = {"rule": "dump_datastore", "job": "spine.dump_datastore", "wildcards": {"lm": "base"}}


def _corrupt_in_place(path: Path, offset: int = 200, n: int = 64) -> None:
    """Swap n bytes of `path` at `offset` for others (size and mtime put back), as a failing disk or a stray
    writer would."""
    time.sleep(0.02)  # file timestamps tick with the kernel's clock: a real damage comes later than its write
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes((b + 1) % 256 for b in old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def _faiss_index(path: Path) -> None:
    import faiss

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 16)).astype(np.float32)
    index = faiss.index_factory(16, "IVF8,PQ4x8")
    index.train(x)
    index.add(x)
    faiss.write_index(index, str(path))


def _checkpoint(path: Path) -> None:
    import torch

    torch.save({"model": {"w": torch.arange(4000, dtype=torch.float32)}}, path)


ARTIFACTS = {  # every kind of binary artifact a later job trusts
    "keys": lambda p: save_npy(p, np.random.default_rng(0).normal(size=(500, 16)).astype(np.float16)),
    "vals": lambda p: save_npy(p, np.arange(5000, dtype=np.int32)),
    "neighbour ids": lambda p: save_npy(p, np.arange(4000, dtype=np.int32).reshape(250, 16)),
    "neighbour distances": lambda p: save_npy(p, np.linspace(0, 1, 4000, dtype=np.float32).reshape(250, 16)),
    "faiss index": _faiss_index,
    "checkpoint": _checkpoint,
}


@pytest.mark.parametrize("kind", sorted(ARTIFACTS))
def test_an_artifact_edited_in_place_is_refused_naming_the_file_and_its_maker(tmp_path, kind):
    path = tmp_path / f"artifact_{kind.replace(' ', '_')}"
    ARTIFACTS[kind](path)
    rec = write_checksum(path, MAKER)
    assert rec == checksum_path(path) and read_json(rec)["maker"] == MAKER
    assert verify_checksum(path, required=True)
    _corrupt_in_place(path)
    with pytest.raises(ArtifactError) as e:
        verify_checksum(path)
    msg = str(e.value)
    assert str(path) in msg and "dump_datastore" in msg and "lm=base" in msg and "changed" in msg, msg


def test_an_untouched_artifact_is_not_read_again_and_a_copy_is(tmp_path, monkeypatch):
    """The check reads a file only when its size, mtime, ctime or inode differ from what the checksum was taken of:
    an untouched file costs a stat; a copy (another inode) is hashed, and passes when its bytes are the same."""
    import shutil

    import knnlm.io as kio

    path = tmp_path / "keys.npy"
    ARTIFACTS["keys"](path)
    write_checksum(path, MAKER)
    reads = []
    real = kio.sha256_file
    monkeypatch.setattr(kio, "sha256_file", lambda p, *a: reads.append(p) or real(p, *a))
    assert verify_checksum(path) and reads == []
    copy = tmp_path / "copy" / "keys.npy"
    copy.parent.mkdir()
    shutil.copy2(path, copy)
    shutil.copy2(checksum_path(path), checksum_path(copy))
    assert verify_checksum(copy) and reads == [copy]


def test_truncated_missing_and_unrecorded_artifacts(tmp_path):
    path = tmp_path / "vals.npy"
    ARTIFACTS["vals"](path)
    write_checksum(path, MAKER)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ArtifactError, match=r"bytes, but \d+ were written by job dump_datastore"):
        verify_checksum(path)
    bare = tmp_path / "bare.npy"
    save_npy(bare, np.zeros(3))
    assert verify_checksum(bare) is False  # a file from elsewhere without a record: not checked
    with pytest.raises(ArtifactError, match="no checksum record"):
        verify_checksum(bare, required=True)
    folder = tmp_path / "data-bin"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"x" * 100)
    write_checksum(folder, MAKER)
    (folder / ".snakemake_timestamp").write_bytes(b"")  # what Snakemake adds to a directory() output afterwards
    assert verify_checksum(folder)
    (folder / "b.bin").write_bytes(b"y")
    with pytest.raises(ArtifactError, match=r"not written by it \['b.bin'\]"):
        verify_checksum(folder)
    (folder / "b.bin").unlink()
    (folder / "a.bin").unlink()
    with pytest.raises(ArtifactError, match=r"missing \['a.bin'\]"):
        verify_checksum(folder)
    checksum_path(path).write_text('{"files": ')
    with pytest.raises(ArtifactError, match=r"checksum record of .* is unreadable \(not valid JSON .*`snakemake -R "
                                            r"\S*vals\.npy <your options>`"):
        verify_checksum(path)
    # the records of artifacts that are gone (a temporary output Snakemake deleted) are swept
    gone = tmp_path / "shards" / "ids.npy"
    gone.parent.mkdir()
    save_npy(gone, np.zeros(2))
    write_checksum(gone, MAKER)
    gone.unlink()
    assert sweep_checksums(tmp_path) == 1 and not checksum_path(gone).exists() and checksum_path(path).exists()
    # and, when an invocation ends, a killed writer's temporaries (a file and a folder), not names merely like them
    (gone.parent / "ids.npy.tmp-4242").write_bytes(b"x")
    (gone.parent / "index.tmp-77").mkdir()
    (gone.parent / "notes.tmp-draft").write_bytes(b"x")
    assert sweep_checksums(tmp_path) == 0 and (gone.parent / "ids.npy.tmp-4242").exists()
    assert sweep_checksums(tmp_path, temporaries=True) == 2
    assert [p.name for p in gone.parent.iterdir()] == ["notes.tmp-draft"]


def test_a_job_checks_its_inputs_and_records_its_outputs(tmp_path, monkeypatch):
    """knnlm.cli.run_job: an input with a checksum record is checked before the job runs; the job's outputs get
    records naming its rule; a damaged input fails the job (a FAILED MLflow run) before it writes anything."""
    from knnlm import cli
    from knnlm.job import Job

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    root = tmp_path / "results" / "t"
    keys = root / "datastore" / "keys.npy"
    keys.parent.mkdir(parents=True)
    ARTIFACTS["keys"](keys)
    out = root / "index" / "out.npy"
    ran = []

    def job(j):
        ran.append(j)
        save_npy(j.path("out"), np.asarray(open_keys(j.path("keys"))).astype(np.float32).sum(1))

    from knnlm.io import open_npy as open_keys

    monkeypatch.setattr(cli, "resolve", lambda name: job)
    make = lambda: Job(cfg={"name": "t", "results_dir": str(tmp_path / "results")}, input={"keys": str(keys)},
                       output={"out": str(out)}, rule="spine.sum", snakemake_rule="sum_keys")
    # a file under the run's folder without a record (copied in by hand, or its record deleted) is refused, naming
    # the commands that work: rerun its maker with -R, or adopt it; a file outside the run's folder is read as it is
    with pytest.raises(ArtifactError, match=r"keys\.npy: no checksum record .* Job sum_keys reads it; .*"
                                            r"`snakemake -R .*keys\.npy <your options>`.*`python -m knnlm.adopt "):
        cli.verify_inputs(make())
    corpus = tmp_path / "corpus.npy"
    ARTIFACTS["keys"](corpus)
    assert cli.verify_inputs(Job(cfg=make().cfg, input={"keys": str(corpus)}, output={}, rule="spine.sum")) == 0
    from knnlm.adopt import adopt

    (root / "broken.faiss").write_bytes(b"not an index")
    with pytest.raises(ArtifactError, match=r"broken\.faiss: does not read as a \.faiss file"):
        adopt(root / "broken.faiss")
    assert not checksum_path(root / "broken.faiss").exists()
    adopt(keys)
    assert read_json(checksum_path(keys))["maker"]["rule"] == "adopted" and cli.verify_inputs(make()) == 1
    write_checksum(keys, MAKER)
    assert cli.verify_inputs(make()) == 1
    cli.run_job("spine.sum", make())
    assert read_json(checksum_path(out))["maker"]["rule"] == "sum_keys" and verify_checksum(out)
    _corrupt_in_place(keys)
    ran.clear()
    with pytest.raises(ArtifactError, match=r"keys\.npy: its content changed .*job dump_datastore"):
        cli.run_job("spine.sum", make())
    assert not ran


def test_search_refuses_ids_outside_the_index():
    from knnlm.search.index import check_neighbours

    ids = np.array([[0, 5, -1], [9, 1, 2]])
    dists = np.array([[0.1, 0.2, np.inf], [0.3, 0.4, 0.5]], dtype=np.float32)
    check_neighbours(ids, dists, 10, "x.index")  # −1 (no neighbour) with any distance is allowed
    with pytest.raises(ArtifactError, match=r"x\.index: the search returned neighbour id 2147071119 for query 11, outside the 10 rows"):
        check_neighbours(np.array([[0, 1], [2, 2147071119]]), np.zeros((2, 2)), 10, "x.index", first_row=10)
    with pytest.raises(ArtifactError, match=r"distance nan for query 1: the index is damaged"):
        check_neighbours(np.array([[0], [1]]), np.array([[0.0], [np.nan]]), 10, "x.index")


def test_a_full_disk_is_named_before_a_memory_map_is_written(tmp_path, monkeypatch):
    """A memmap written on a full disk dies of SIGBUS with nothing in the log; create_npy reserves the file's blocks
    first, so the job fails at once with the file, the bytes needed and the bytes free, and leaves nothing."""
    import knnlm.io as kio

    monkeypatch.setattr(kio, "_fallocate", lambda fd, size: errno.ENOSPC)
    with pytest.raises(ArtifactError, match=r"no space left on the device of .*keys\.npy: it needs \d+ bytes, \d+ are free"):
        with create_npy(tmp_path / "keys.npy", (1000, 64), np.float16) as a:
            a[:] = 1
    assert list(tmp_path.iterdir()) == []
    # a file system without fallocate: the free space decides
    monkeypatch.setattr(kio, "_fallocate", lambda fd, size: errno.EOPNOTSUPP)
    with create_npy(tmp_path / "ok.npy", (10, 4), np.float32) as a:
        a[:] = 2
    assert np.load(tmp_path / "ok.npy").sum() == 80
    # where the file system has fallocate, the real call allocates the blocks before anything is written
    monkeypatch.undo()
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    fd = os.open(probe, os.O_RDWR)
    try:
        supported = kio._fallocate(fd, 4096) == 0
    finally:
        os.close(fd)
    probe.unlink()
    with create_npy(tmp_path / "real.npy", (4096, 256), np.float32) as a:
        if supported:
            assert os.stat(a.filename).st_blocks * 512 >= a.nbytes
        a[:] = 0


def test_a_damaged_json_record_names_its_file(tmp_path):
    p = tmp_path / "settings.json"
    p.write_text('{"table": [1, 2')
    with pytest.raises(ArtifactError, match=r"settings\.json: not valid JSON \(.* at line 1.*15 bytes"):
        read_json(p)
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ArtifactError, match=r"settings\.json: not UTF-8"):
        read_json(p)


def test_config_overrides_are_yaml():
    from knnlm.config import yaml_overrides

    # what snakemake's parser makes of: knn={k: 32} pretrained=null data={archive: null, files: [a, b]} x=[a
    raw = {"knn": {"k": "32", "lambda_steps": "21"}, "pretrained": "null", "data": {"archive": "null", "files": ["a", "b"]},
           "x": "[a", "results_dir": "out dir", "threads": 2}
    assert yaml_overrides(raw) == {"knn": {"k": 32, "lambda_steps": 21}, "pretrained": None,
                                   "data": {"archive": None, "files": ["a", "b"]}, "x": "[a", "results_dir": "out dir",
                                   "threads": 2}
    assert raw["knn"]["k"] == "32"  # the argument is left as it was


def test_raw_checksums_are_cached_by_stat(tmp_path, monkeypatch):
    import knnlm.io as kio

    a = tmp_path / "wiki.train.tokens"
    a.write_text(" the cat \n")
    cache = tmp_path / "run" / "raw_checksums.json"
    first = sha256_files([a], cache)
    reads = []
    real = kio.sha256_file
    monkeypatch.setattr(kio, "sha256_file", lambda p, *x: reads.append(p) or real(p, *x))
    assert sha256_files([a], cache) == first and reads == []
    a.write_text(" the dogs \n")
    second = sha256_files([a], cache)
    assert second != first and reads == [a] and read_json(cache)[str(a)]["sha256"] == second[str(a)]
    with pytest.raises(ArtifactError, match="missing file"):
        sha256_files([tmp_path / "absent"], cache)


def test_one_invocation_per_run_folder(tmp_path):
    """The lock a Snakemake process takes on its run folder (knnlm.io.hold_lock) refuses a second process, from any
    checkout, naming the holder; it goes with the holder's process."""
    lock = tmp_path / "run" / "invocation.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from knnlm.io import hold_lock; "
                               f"hold_lock({str(lock)!r}, 'x'); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
    try:
        assert holder.stdout.readline().strip() == "held"
        probe = ("import sys\nfrom knnlm.io import ArtifactError, hold_lock\ntry:\n"
                 f"    hold_lock({str(lock)!r}, 'the run folder R')\nexcept ArtifactError as e:\n    print(e)\n"
                 "else:\n    print('taken')\n")
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
        assert f"the run folder R is in use by another invocation (pid {holder.pid} on" in r.stdout, r.stdout + r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
    assert r.stdout.strip() == "taken", r.stdout + r.stderr


def test_spool_keeps_no_partial_record(tmp_path, monkeypatch):
    """A record that cannot be written whole (a full disk) leaves no temporary; one a killed writer left (its pid
    gone) is removed when the next invocation starts its spool, while a live writer's stays."""
    from knnlm import tracking

    spool = tmp_path / "mlflow_spool"

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tracking.os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        tracking.spool_run(spool, {"name": "t", "results_dir": str(tmp_path)}, "spine.bpe", {})
    assert list(spool.iterdir()) == []
    monkeypatch.undo()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = spool / f".{time.time_ns()}-{int(gone.stdout)}.json.tmp"
    live = spool / f".{time.time_ns()}-{os.getpid()}.json.tmp"
    dead.write_text("")
    live.write_text("{")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracking.start_spool({"name": "t", "results_dir": str(tmp_path)})
    try:
        assert not dead.exists() and live.exists()
    finally:
        tracking.stop_spool()


def test_a_killed_invocations_parent_run_is_closed_by_the_next(tmp_path, monkeypatch):
    import socket

    from mlflow.tracking import MlflowClient

    from knnlm import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = {"name": "t", "results_dir": str(tmp_path)}
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    first = tracking.start_parent_run(cfg, ["all"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    client.set_tag(first, "pid", gone.stdout.strip())  # as if its Snakemake process had been killed
    other = client.create_run(client.get_run(first).info.experiment_id, tags={"rule": "snakemake", "pid": "1",
                                                                             "host": socket.gethostname() + "-other"})
    second = tracking.start_parent_run(cfg, ["all"])
    assert client.get_run(first).info.status == "KILLED"
    assert "gone" in client.get_run(first).data.tags["ended_by"]
    assert client.get_run(other.info.run_id).info.status == "RUNNING"  # another machine's: not judged from here
    assert client.get_run(second).info.status == "RUNNING"
    tracking.end_parent_run(cfg, second, ok=True)
    assert client.get_run(second).info.status == "FINISHED"


@pytest.mark.dag  # runs Snakemake
def test_an_edited_raw_file_reruns_what_rests_on_it_and_commands_name_no_interpreter(tmp_path):
    """An own corpus (no 'data.sha256'): a raw file edited after a run reruns prepare_data (its params carry the raw
    files' sha256), although its mtime alone would not; nested --config values are YAML; no job's command names the
    interpreter's path; the job's output has its checksum record."""
    import yaml

    data = tmp_path / "data"
    data.mkdir()
    for s in ("train", "valid", "test"):
        (data / f"wiki.{s}.tokens").write_text(" = A = \n the cat sat on the mat \n" * 20)
    overlay = tmp_path / "data.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"dir": str(data), "archive": None, "sha256": None}}))
    wordcounts = tmp_path / "results" / "tiny" / "data" / "wordcounts.json"
    conf = ["--configfile", "configs/tiny.yaml", str(overlay)]
    args = [*conf, "--config", f"results_dir={tmp_path / 'results'}", "knn={k: 32, lambda_steps: 11}", "pretrained=null"]
    run_snakemake(str(wordcounts), *args, "--cores", "1")
    before = json.loads(wordcounts.read_text())["test"]["sha256"]
    assert verify_checksum(wordcounts, required=True)
    r = run_snakemake(str(wordcounts), *args, "-n")
    assert "Nothing to be done" in r.stdout, r.stdout[-3000:]
    raw = data / "wiki.test.tokens"
    st = raw.stat()
    raw.write_text(" = A = \n the dog sat on the mat \n" * 20)
    os.utime(raw, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # even an older mtime
    r = run_snakemake(str(wordcounts), *args, "-n", "-p")
    assert "rule prepare_data" in r.stdout and "params" in r.stdout.lower(), r.stdout[-3000:]
    commands = [ln.strip().removeprefix("Shell command:").strip() for ln in r.stdout.splitlines() if " -m knnlm " in ln]
    assert commands and all(ln.startswith("python -m knnlm ") for ln in commands), commands
    assert sys.executable not in r.stdout
    run_snakemake(str(wordcounts), *args, "--cores", "1")
    assert json.loads(wordcounts.read_text())["test"]["sha256"] != before
    # a nested value reaches the schema as the integer it is: knn={k: -3} is refused as -3, not '-3'
    bad = run_snakemake(str(wordcounts), *conf, "--config", f"results_dir={tmp_path / 'results'}", "knn={k: -3}", "-n",
                        check=False)
    assert bad.returncode != 0 and "'knn.k'" in bad.stdout and "found -3" in bad.stdout, bad.stdout[-2000:]
