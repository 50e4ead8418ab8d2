"""Artifact I/O: atomic writes (temporary name, then rename), .npy memmaps with integrity checks, manifests.

Nothing half-written is ever taken as done: every writer here writes to `<name>.tmp-<pid>` and
renames to `<name>` only after the content is complete and flushed.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np


class ArtifactError(RuntimeError):
    """An artifact on disk is missing, truncated, or inconsistent with its manifest."""


def tmp_name(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it to `path`, on error remove it.

    Works for files and directories (whatever the caller creates at the yielded path). Temporaries of `path` left
    by a killed writer (another pid; a job's outputs have one writer at a time) are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    for stale in path.parent.glob(f"{glob.escape(path.name)}.tmp-*"):
        _remove(stale)
    try:
        yield tmp
        if not tmp.exists():
            raise ArtifactError(f"writer produced nothing at {tmp} for {path}")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
        if tmp.is_file() and tmp.samefile(path):  # a hard link of the file already there: rename does nothing
            tmp.unlink()
    except BaseException:
        _remove(tmp)
        raise


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=_json_default)
            f.write("\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"missing file {path}")
    with open(path) as f:
        return json.load(f)


def save_npy(path: str | Path, arr: np.ndarray) -> None:
    """np.save, atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, arr)


def open_npy(path: str | Path, shape: tuple[int, ...] | None = None, dtype: Any = None, mode: str = "r") -> np.ndarray:
    """Memory-map a .npy file, checking it is complete and (optionally) of the expected shape/dtype.

    Raises ArtifactError naming the file if it is missing, truncated (fewer bytes than its header
    promises), or of another shape/dtype than expected.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"missing array file {path}")
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            hdr_shape, _, hdr_dtype = reader(f)
        except Exception as e:  # corrupt header
            raise ArtifactError(f"{path}: not a valid .npy file ({e})") from e
        offset = f.tell()
    want_bytes = offset + int(np.prod(hdr_shape, dtype=np.int64)) * np.dtype(hdr_dtype).itemsize
    have = path.stat().st_size
    if have < want_bytes:
        raise ArtifactError(f"{path} is truncated: header promises shape {hdr_shape} {np.dtype(hdr_dtype)} "
                            f"= {want_bytes} bytes, file has {have} bytes; delete it and rerun the job that makes it")
    if shape is not None and tuple(hdr_shape) != tuple(shape):
        raise ArtifactError(f"{path}: expected shape {tuple(shape)}, found {tuple(hdr_shape)}")
    if dtype is not None and np.dtype(hdr_dtype) != np.dtype(dtype):
        raise ArtifactError(f"{path}: expected dtype {np.dtype(dtype)}, found {np.dtype(hdr_dtype)}")
    return np.load(path, mmap_mode=mode)


@contextlib.contextmanager
def create_npy(path: str | Path, shape: tuple[int, ...], dtype: Any) -> Iterator[np.ndarray]:
    """Create a writable .npy memmap at a temporary name; flushed and renamed to `path` on success."""
    with atomic_path(path) as tmp:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        yield arr
        arr.flush()
        del arr


def iter_chunks(n: int, chunk: int, *release: np.ndarray) -> Iterator[tuple[int, int]]:
    """(start, stop) of rows 0..n in chunks of `chunk` rows. Once the loop body of a chunk has run, rows start..stop of
    every array in `release` (memmaps of n rows, or anything else: skipped) are written back and leave this
    process's RSS (release_rows), so a loop over [n, ...] memmaps holds one chunk of each, not all of them. A body
    that breaks out of the loop keeps its last chunk's pages. Raises ValueError for chunk < 1."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, found {chunk}")
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        yield s, e
        for arr in release:
            release_rows(arr, s, e)


def release_rows(arr: np.ndarray, start: int, stop: int) -> None:
    """Write rows start..stop of a memmap (from create_npy or open_npy, or a row slice of one) to its file (when
    writable) and drop their pages from this process (msync + madvise MADV_DONTNEED on the whole pages inside those
    rows): a job that writes or reads a [T, ...] array in row chunks then holds one chunk, not the whole array, in
    its RSS (no job over 4 GB; Snakemake's benchmark counts mapped file pages). The data stays in the file
    and the page cache; a later access to those rows faults them back in. No-op for an array that is not a memmap
    or a range of no whole page."""
    import mmap

    mm = getattr(arr, "_mmap", None)
    if mm is None or stop <= start or not arr.flags.c_contiguous:
        return
    view = np.frombuffer(mm, dtype=np.uint8)
    try:
        row = arr.strides[0] if arr.ndim else arr.itemsize
        lo = arr.ctypes.data - view.ctypes.data + start * row
        hi = lo + (stop - start) * row
    finally:
        del view  # the buffer export would keep the mmap from closing
    page = mmap.PAGESIZE
    lo, hi = -(-lo // page) * page, hi // page * page
    if hi > lo:
        mm.flush(lo, hi - lo)
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def _checkpoint_globals() -> list:
    """What a checkpoint may hold beyond tensors and plain types (torch.load(weights_only=True)'s allowlist): the
    argparse.Namespace of fairseq checkpoints saved before its dataclass configs (published LMs), and numpy arrays of
    numeric dtypes (the parametric jobs' caches)."""
    import argparse

    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "bool")]
    return [argparse.Namespace, core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


@contextlib.contextmanager
def checkpoint_globals():
    """A context in which torch.load(weights_only=True), also inside fairseq's own loader, accepts _checkpoint_globals
    and nothing else that could run code while unpickling."""
    import torch

    with torch.serialization.safe_globals(_checkpoint_globals()):
        yield


def load_checkpoint(path: str | Path, trusted_sha256: str | None = None, mmap: bool = False) -> Any:
    """torch.load of a checkpoint on the CPU without running code from it: weights_only=True with the allowlist of
    checkpoint_globals. A checkpoint that needs any other object is refused (ArtifactError naming the file and the
    object) unless its sha256 equals `trusted_sha256` (config 'lms.<lm>.sha256' pins a downloaded LM): then it is
    unpickled in full, with a warning. mmap: map the tensors from the file instead of reading them."""
    import logging
    import pickle

    import torch

    try:
        with checkpoint_globals():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if trusted_sha256 and sha256_file(path) == trusted_sha256:
            logging.getLogger(__name__).warning("%s: unpickling in full (its sha256 is pinned): %s", path,
                                                str(e).splitlines()[0])
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        first = next((ln for ln in str(e).splitlines() if "GLOBAL" in ln or "Unsupported" in ln), str(e)[:200])
        raise ArtifactError(f"{path}: refused to load: it holds objects beyond tensors and plain types, whose "
                            f"unpickling could run code ({first.strip()}). If you trust the file, pin its sha256 in "
                            f"the config (lms.<lm>.sha256) to load it in full.") from None


def check_manifest(manifest: dict, expected: dict, source: str) -> None:
    """Raise ArtifactError if any key of `expected` differs in `manifest` (e.g. another checkpoint's datastore)."""
    bad = {k: (manifest.get(k), v) for k, v in expected.items() if manifest.get(k) != v}
    if bad:
        lines = [f"{k}: manifest has {have!r}, expected {want!r}" for k, (have, want) in bad.items()]
        raise ArtifactError(f"{source} does not match what this run expects (made from another checkpoint or data?):\n  "
                            + "\n  ".join(lines) + "\nDelete it and rerun the job that makes it.")


def machine(threads: int | None = None, device: str | None = None) -> dict:
    """What ran a timed job, recorded beside its seconds: {'cpu' (model name from /proc/cpuinfo, or the platform's),
    'cores' (os.cpu_count()), 'threads' (the job's), 'device' ('cpu' or 'gpu'), 'gpu' (CUDA device name or None)}."""
    import os
    import platform
    import sys

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = None
    torch = sys.modules.get("torch")  # only when the job already imported it: no torch import for a timing label
    if torch is not None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "device": device or ("gpu" if gpu else "cpu"),
            "gpu": gpu}
