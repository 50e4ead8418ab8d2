"""Adopt a file made elsewhere into a run: check that it reads as its kind, then record its checksum, so the jobs that
read it trust it (knnlm.io.write_checksum; a job refuses an input under the run's folder without a record).

    python -m knnlm.adopt results/wikitext2/lms/base/stores/full/index/att_l2.faiss [more files ...]

What is checked before the record is written: a .npy file opens as an array (its header and size agree), a .json file
parses, a .faiss file reads as a FAISS index, a folder's files each so; any other file is only hashed. The record
names the maker 'adopted' (and who ran it), so a later check that fails says the file was adopted, not made by a job.
The records protect against accidents (a damaged, truncated, stale or swapped file), not against forgery: whoever can
write a file can write its record.
"""
from __future__ import annotations

import argparse
import getpass
from pathlib import Path

from .generate import cli_main
from .io import ArtifactError, write_checksum


def check_readable(path: Path) -> None:
    """Raise ArtifactError naming `path` when it does not read as its kind (.npy, .json, .faiss; a folder: each file)."""
    import json

    import numpy as np

    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for f in files:
        try:
            if f.suffix == ".npy":
                np.load(f, mmap_mode="r")
            elif f.suffix == ".json":
                json.loads(f.read_text(encoding="utf-8"))
            elif f.suffix == ".faiss":
                import faiss

                faiss.read_index(str(f), faiss.IO_FLAG_MMAP)
        except Exception as e:  # noqa: BLE001 - any failure to read is the file's
            raise ArtifactError(f"{f}: does not read as a {f.suffix} file ({type(e).__name__}: {e}); not adopted") from None


def adopt(path: str | Path) -> Path:
    """Check `path` (check_readable) and write its checksum record with maker 'adopted'. Returns the record's path.
    Raises ArtifactError naming the file when it is missing or unreadable."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: not found; nothing adopted")
    check_readable(path)
    return write_checksum(path, {"rule": "adopted", "job": "knnlm.adopt", "wildcards": {}, "by": getpass.getuser()})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.adopt", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="files or folders made elsewhere, to be trusted by the run's jobs")
    for p in ap.parse_args(argv).paths:
        print(f"adopted {p} (record {adopt(p)})")


if __name__ == "__main__":
    cli_main(main)
