"""Summarise a finished run: per-stage wall time and peak memory (Snakemake benchmark files), artifact
sizes, MLflow run count.  Usage: python -m knnlm.report results/<config name>
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from .paths import Layout


def stage_table(root: str | Path) -> pd.DataFrame:
    """One row per job: job, wall seconds (`s`), peak RSS in MB (`max_rss`), from root/benchmarks/*.tsv."""
    rows = []
    for p in sorted(Path(root, "benchmarks").glob("*.tsv")):
        b = pd.read_csv(p, sep="\t")
        rows.append({"job": p.stem, "wall_s": float(b["s"].iloc[-1]), "peak_rss_mb": float(b["max_rss"].iloc[-1])})
    return pd.DataFrame(rows)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0])
    layout = Layout(root.parent, root.name)
    df = stage_table(root)
    print(df.to_markdown(index=False, floatfmt=".1f"))
    print(f"\ntotal wall time of all jobs: {df['wall_s'].sum() / 60:.1f} min; max peak RSS {df['peak_rss_mb'].max():.0f} MB")
    for lm_dir in sorted((layout.root / "lms").glob("*")):
        for sub in sorted(p for p in lm_dir.iterdir() if p.is_dir()):
            print(f"{sub.relative_to(layout.root)}: {dir_size(sub) / 2**20:.1f} MiB on disk")
        for store in sorted((lm_dir / "stores").glob("*")):
            print(f"  {store.relative_to(layout.root)}: {dir_size(store) / 2**20:.1f} MiB")
    try:
        from .tracking import count_runs

        print(f"MLflow runs in experiment {root.name!r}: {count_runs(root.parent, root.name)}")
    except Exception as e:  # noqa: BLE001
        print(f"MLflow: {e}")


if __name__ == "__main__":
    main()
