"""One-off migration of a run made before per-LM documents (commit c229a8b): the documents and the retrieval
scope of each split moved from <run>/data/ to <run>/lms/<lm>/queries/<split>/, and every target now carries the
words it starts (token_lines.npz, documents.npz 'words').

    python scripts/migrate_lm_documents.py results/<name> [lm]      (lm: the run's trained LM, default 'base')

Writes token_lines.npz and the new documents.npz from the run's BPE splits with the old files' mtimes, moves the
scope (mtime kept) and deletes the old files, so nothing downstream looks out of date. Snakemake's metadata of
the jobs whose inputs changed names still differs: run the first snakemake after it with `--rerun-triggers mtime`,
or `snakemake --cleanup-metadata <files>` once. Idempotent: a split already migrated is skipped.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.io import atomic_path  # noqa: E402
from knnlm.paths import Layout  # noqa: E402
from knnlm.stats import bpe_token_lines, save_token_lines  # noqa: E402


def migrate(run: Path, lm: str = "base") -> None:
    layout = Layout(run.parent, run.name)
    for split in ("valid", "test"):
        old_doc, old_scope = run / "data" / f"{split}.documents.npz", run / "data" / f"{split}.scope.npy"
        if not old_doc.exists():
            print(f"{split}: nothing to migrate ({old_doc} absent)")
            continue
        t = os.stat(old_doc)
        tl = bpe_token_lines(layout.path("bpe_split", split=split))
        old = np.load(old_doc)
        if len(old["doc"]) != len(tl["line"]):
            raise SystemExit(f"{old_doc}: {len(old['doc'])} targets, the BPE split has {len(tl['line'])}")
        new_tl, new_doc = layout.path("token_lines", lm=lm, split=split), layout.path("documents", lm=lm, split=split)
        new_tl.parent.mkdir(parents=True, exist_ok=True)
        save_token_lines(new_tl, tl)
        with atomic_path(new_doc) as tmp, open(tmp, "wb") as f:
            np.savez(f, doc=old["doc"], words=tl["words"], tokens=old["tokens"])
        os.utime(new_tl, ns=(t.st_atime_ns, t.st_mtime_ns - 10**9))  # older than the documents made from it
        os.utime(new_doc, ns=(t.st_atime_ns, t.st_mtime_ns))
        if old_scope.exists():
            old_scope.replace(layout.path("scope", lm=lm, split=split))
        old_doc.unlink()
        print(f"{split}: token_lines, documents and scope now under {new_doc.parent}")


if __name__ == "__main__":
    migrate(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "base")
