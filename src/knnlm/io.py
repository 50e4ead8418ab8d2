"""Artifact I/O: atomic writes (temporary name, then rename), .npy memmaps with integrity checks, manifests.

Nothing half-written is ever taken as done: every writer here writes to `<name>.tmp-<pid>` and
renames to `<name>` only after the content is complete and flushed.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import re
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
    """The JSON value in file `path`. Raises ArtifactError naming the file if it is missing, not UTF-8 or not valid
    JSON (a half-written or damaged record: the error says where it stops)."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"missing file {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}; the file has "
                            f"{path.stat().st_size} bytes): damaged or half-written; {rerun_hint(path)}") from e
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: not UTF-8 text (byte {e.start}): expected a JSON file") from e


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
                            f"= {want_bytes} bytes, file has {have} bytes; {rerun_hint(path)}")
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
        reserve_space(tmp, path)
        yield arr
        arr.flush()
        del arr


def reserve_space(path: str | Path, final: str | Path | None = None) -> None:
    """Allocate the disk blocks of file `path` (as long as it is now, e.g. a memmap just created sparse) before
    anything is written into it: on a full disk, a write through a memory map is a SIGBUS that kills the job with
    no message, while this raises at once.

    Uses fallocate(2); where the file system has none, compares the free space with the file's size instead.
    final: the artifact's final name, for the message (default `path`). Raises ArtifactError naming the file, the
    bytes it needs and the bytes free when the device has too little space.
    """
    import errno

    path = Path(path)
    size = path.stat().st_size
    name = final or path
    if size == 0:
        return
    fd = os.open(path, os.O_RDWR)
    try:
        err = _fallocate(fd, size)
    finally:
        os.close(fd)
    if err == 0:
        return
    free = shutil.disk_usage(path.parent).free
    if err == errno.ENOSPC or (err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL) and free < size):
        raise ArtifactError(f"no space left on the device of {name}: it needs {size} bytes, {free} are free; free "
                            "some space (or point config 'results_dir' elsewhere) and rerun")
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, f"could not allocate {size} bytes for {name}: {os.strerror(err)}")


def _fallocate(fd: int, size: int) -> int:
    """fallocate(2) of bytes 0..size of file descriptor `fd`; returns 0 or the errno (EOPNOTSUPP without it)."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    fallocate = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fallocate is None:
        return errno.EOPNOTSUPP
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return 0 if fallocate(fd, 0, 0, size) == 0 else ctypes.get_errno()


CHECKSUM_SUFFIX = ".sha256.json"


def rerun_hint(path: str | Path) -> str:
    """The command that remakes artifact `path` and what rests on it, for an error naming a bad file: Snakemake's
    -R (--forcerun) with the file as its target (deleting the file alone reruns nothing where the final tables are
    up to date)."""
    return f"rerun the job that makes it, and what rests on it: `snakemake -R {path} <your options>`"


def checksum_path(path: str | Path) -> Path:
    """The checksum record of artifact `path` (a file or a folder): `<path>.sha256.json` beside it."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


# what Snakemake itself writes into a directory() output once its job has ended: not the job's
SNAKEMAKE_MARKERS = {".snakemake_timestamp"}


def _artifact_files(path: Path) -> dict[str, Path]:
    """{name: file} of artifact `path`: the file itself (named '.', so that a copy under another name keeps its
    record), or every file under a folder (by its path relative to the folder, Snakemake's own markers left out), in
    sorted order."""
    if path.is_dir():
        return {str(f.relative_to(path)): f for f in sorted(path.rglob("*"))
                if f.is_file() and f.name not in SNAKEMAKE_MARKERS}
    return {".": path}


def file_stat(f: Path) -> dict[str, int]:
    """What identifies a file's contents without reading it: {'size', 'mtime_ns', 'ctime_ns', 'inode'} (a checksum
    taken when they were these need not be taken again)."""
    st = f.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def write_checksum(path: str | Path, maker: dict) -> Path:
    """Record the sha256 of artifact `path` (a file, or every file of a folder) with each file's size, mtime,
    ctime and inode, in `<path>.sha256.json` (checksum_path; written atomically), for verify_checksum.

    maker: who wrote it, {'rule': the Snakemake rule, 'job': the knnlm job, 'wildcards': {...}}, named by a failed
    check. Returns the record's path. Raises ArtifactError if `path` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"cannot record the checksum of {path}: it does not exist")
    files = {}
    for name, f in _artifact_files(path).items():
        digest = sha256_file(f)
        files[name] = {"sha256": digest, **file_stat(f)}  # the stat after the read: what the checksum was taken of
    out = checksum_path(path)
    write_json(out, {"maker": maker, "files": files})
    return out


def _maker_hint(maker: dict) -> str:
    rule = maker.get("rule") or maker.get("job") or "?"
    wc = ", ".join(f"{k}={v}" for k, v in sorted((maker.get("wildcards") or {}).items()))
    return f"job {rule}" + (f" ({wc})" if wc else "") + f"; rerun it: snakemake -R {rule} …"


def verify_checksum(path: str | Path, required: bool = False, reader: str | None = None) -> bool:
    """Check artifact `path` against its checksum record (write_checksum) before it is trusted.

    A file whose size, mtime, ctime and inode are those the checksum was taken of is not read again (an edit in
    place changes its ctime even when its mtime is put back); any other is hashed and compared. Returns True when
    checked, False when there is no record and `required` is false.
    Raises ArtifactError naming the file and the job that made it if its content differs from the record, a file
    of the record is missing or new, the record is unreadable, or (required) there is no record (naming the job
    `reader` that reads it, and the commands that remake or adopt it).
    """
    path = Path(path)
    rec_path = checksum_path(path)
    if not rec_path.is_file():
        if required:
            raise ArtifactError(f"{path}: no checksum record ({rec_path.name} beside it), so nothing vouches for it: "
                                "it was not written by a finished job of this pipeline (copied in by hand, its record "
                                "deleted, or an older version)." + (f" Job {reader} reads it;" if reader else "")
                                + f" {rerun_hint(path)}, or adopt it as it is: `python -m knnlm.adopt {path}` (checked, "
                                "then recorded)")
        return False
    try:
        rec = read_json(rec_path)
    except ArtifactError as e:
        why = str(e).split(": ", 1)[-1].split("; rerun the job")[0]  # read_json's reason, without its hint
        raise ArtifactError(f"{rec_path}: the checksum record of {path} is unreadable ({why}); {rerun_hint(path)}") \
            from None
    try:
        files, maker = rec["files"], rec.get("maker") or {}
    except (KeyError, TypeError) as e:
        raise ArtifactError(f"{rec_path}: not a checksum record (no 'files') of {path}; {rerun_hint(path)}") from e
    have = _artifact_files(path) if path.exists() else {}
    if set(have) != set(files):
        gone, new = sorted(set(files) - set(have)), sorted(set(have) - set(files))
        raise ArtifactError(f"{path}: its files differ from what {_maker_hint(maker)} wrote (missing {gone[:5]}, "
                            f"not written by it {new[:5]})")
    for name, f in have.items():
        want = files[name]
        st = file_stat(f)
        if all(want.get(k) == v for k, v in st.items()):
            continue  # untouched since its checksum was taken
        if st["size"] != want["size"]:
            raise ArtifactError(f"{f}: {st['size']} bytes, but {want['size']} were written by {_maker_hint(maker)}: "
                                "the file was truncated or replaced")
        got = sha256_file(f)
        if got != want["sha256"]:
            raise ArtifactError(f"{f}: its content changed after it was written (sha256 {got[:16]}…, written as "
                                f"{want['sha256'][:16]}…): damaged or edited in place; made by {_maker_hint(maker)}")
    return True


def sweep_checksums(root: str | Path, temporaries: bool = False) -> int:
    """Remove every checksum record under folder `root` whose artifact is gone (a temporary output Snakemake deleted
    once its readers had run, a failed job's output); with `temporaries`, also every writer's temporary
    `<name>.tmp-<pid>` (tmp_name) left by a killed job whose output no rerun wrote again (e.g. a shard that a merge
    has consumed). Only for a run folder no job is writing into: the workflow calls it when an invocation ends,
    holding the run folder's lock. Returns how many were removed."""
    n = 0
    for p in list(Path(root).rglob("*")):  # one walk of the folder (listed first: temporaries are removed as we go)
        if p.name.endswith(CHECKSUM_SUFFIX):
            if not p.with_name(p.name[: -len(CHECKSUM_SUFFIX)]).exists():
                p.unlink(missing_ok=True)
                n += 1
        elif temporaries and re.fullmatch(r".+\.tmp-\d+", p.name) and (p.exists() or p.is_symlink()):
            _remove(p)
            n += 1
    return n


def sha256_files(paths: list[str | Path], cache: str | Path | None = None) -> dict[str, str]:
    """{str(path): sha256} of files `paths`. With `cache` (a JSON file, rewritten atomically), a file whose size,
    mtime, ctime and inode match its cached entry is not read again. Raises ArtifactError naming a missing file."""
    old = {}
    if cache is not None and Path(cache).is_file():
        try:
            old = read_json(cache)
        except ArtifactError:
            old = {}  # a damaged cache is rebuilt
    out, entries = {}, {}
    for p in map(Path, paths):
        if not p.is_file():
            raise ArtifactError(f"missing file {p}")
        st = file_stat(p)
        entry = old.get(str(p)) if isinstance(old, dict) else None
        if not (isinstance(entry, dict) and all(entry.get(k) == v for k, v in st.items()) and entry.get("sha256")):
            entry = {"sha256": sha256_file(p), **file_stat(p)}
        out[str(p)], entries[str(p)] = entry["sha256"], entry
    if cache is not None and entries != old:
        write_json(cache, entries)
    return out


_LOCKS: dict[str, int] = {}  # the lock files this process holds (hold_lock), by path


def hold_lock(path: str | Path, what: str) -> None:
    """Take an exclusive lock on file `path` (flock; created if missing) for the rest of this process's life, so that
    no other process (in any checkout, on this machine or through a file system that supports flock) takes it at the
    same time. The file records this process's pid and host. Raises ArtifactError naming `what`, the file and the
    holder's pid and host when another process holds it. Taking a lock this process holds does nothing."""
    import fcntl
    import socket

    path = Path(path)
    if str(path) in _LOCKS:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the jobs (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
        os.close(fd)
        raise ArtifactError(f"{what} is in use by another invocation ({holder}; lock file {path}): wait for it to "
                            "end, or give this one another config 'results_dir'") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, cwd {os.getcwd()}\n".encode(), 0)
    _LOCKS[str(path)] = fd


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
                            + "\n  ".join(lines) + f"\n{rerun_hint(source)[0].upper()}{rerun_hint(source)[1:]}.")


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


# the schema words _describe names when a value fails (the key's description says the rest)
EXPECTATION_WORDS = ("type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems",
                     "maxItems", "minLength", "maxLength", "uniqueItems", "multipleOf")


def schema_error(err, noun: str = "key") -> str:
    """A jsonschema ValidationError `err` in words: "<noun> '<dotted key>': expected <the schema's constraint>
    (<its description>), found <the value>" (or the schema's message for an unknown or missing key)."""
    key = ".".join(str(p) for p in err.absolute_path) or "<top level>"
    sch = err.schema if isinstance(err.schema, dict) else {}
    if err.validator == "additionalProperties":
        return f"{noun} '{key}': {err.message} (allowed: {sorted(sch.get('properties', {}))})"
    if err.validator == "required":
        return f"{noun} '{key}': {err.message}"
    # what the key must be, in the schema's own words: its description, and the constraint that failed; a pattern
    # only where no description says it in words; never the sub-schema of a whole section
    expected = {k: sch[k] for k in EXPECTATION_WORDS if k in sch}
    if "pattern" in sch and not sch.get("description"):
        expected["pattern"] = sch["pattern"]
    want = ", ".join(f"{k} {v!r}" if k != "type" else f"{v}" for k, v in expected.items()) or err.message
    found = repr(err.instance)
    found = found if len(found) <= 120 else found[:117] + "..."
    hint = ""
    if sch.get("type") == "object" and isinstance(err.instance, str):
        hint = f" (a mapping: on the command line, --config values are YAML, e.g. {key.split('.')[-1]}={{k: 32}})"
    desc = f" ({sch['description'].strip()})" if sch.get("description") else ""
    return f"{noun} '{key}': expected {want}{desc}, found {found}{hint}"


def read_checked_json(path: str | Path, schema: str, remake: str | None = None) -> dict:
    """The JSON file at `path`, checked against the package's schema `schema` (src/knnlm/schemas/<schema>.schema.yaml,
    e.g. 'datastore_manifest'). Raises ArtifactError naming the file, each key that fails, what was expected and what
    was found, and how to remake it (`remake`; default: rerun_hint, the pipeline job that makes it)."""
    obj = read_json(path)
    title, errors = schema_errors(obj, schema)
    if errors:
        raise ArtifactError(f"{path}: not a valid {title}: {errors_text(errors)} (written by another version, or "
                            f"damaged; {remake or rerun_hint(path)})")
    return obj


def errors_text(errors: list[str], most: int = 10) -> str:
    """Schema errors (schema_errors) joined by '; ', the first `most` of them, then '(and N more)'."""
    return "; ".join(errors[:most]) + (f" (and {len(errors) - most} more)" if len(errors) > most else "")


def schema_errors(obj, schema: str) -> tuple[str, list[str]]:
    """(the schema's title, each error of `obj` against the package's schema `schema` in words, schema_error, ordered
    by key). Raises FileNotFoundError for a schema the package does not have."""
    title, validator = _schema_validator(schema)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    return title, [schema_error(e) for e in errors]


@functools.lru_cache(maxsize=None)
def _schema_validator(schema: str):
    """(title, jsonschema validator) of the package's schema `schema`, read and parsed once per process (a job reads
    many files of one format; the Snakemake process replays every spool record)."""
    import importlib.resources

    import jsonschema
    import yaml

    spec = yaml.safe_load((importlib.resources.files("knnlm") / "schemas" / f"{schema}.schema.yaml").read_text("utf-8"))
    return spec.get("title", schema), jsonschema.Draft202012Validator(spec)
