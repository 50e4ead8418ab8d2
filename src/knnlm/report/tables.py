"""Paper tables as CSV + Markdown (pandas)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import atomic_path

METRIC_NAME = {"l2": "L2", "ip": "IP"}


def table1(base: dict, scores: list[dict]) -> pd.DataFrame:
    """Table 1 (Xu et al. 2023): base LM and kNN-LM per (h_ds, ⊗), on each split.

    base: {split: {'ppl_word', 'ppl_token'}}; scores: the JSONs written by `knnlm score`.
    Columns: split, model, h_ds, ⊗, PPL, λ, interp PPL, oracle PPL — per word and per token.
    'PPL' of a kNN-LM row is kNN-only perplexity (inf when some target is absent from its k neighbours).
    """
    rows = []
    for split in ("test", "valid"):
        b = base[split]
        rows.append({"split": split, "model": "Base LM", "h_ds": "-", "⊗": "-",
                     "PPL (word)": b["ppl_word"], "λ": None, "interp PPL (word)": None, "oracle PPL (word)": None,
                     "PPL (token)": b["ppl_token"], "interp PPL (token)": None, "oracle PPL (token)": None})
        for s in scores:
            r = s[split]
            rows.append({"split": split, "model": "kNN-LM", "h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]],
                         "PPL (word)": r["knn"]["ppl_word"], "λ": s["lambda"],
                         "interp PPL (word)": r["interp"]["ppl_word"], "oracle PPL (word)": r["oracle"]["ppl_word"],
                         "PPL (token)": r["knn"]["ppl_token"], "interp PPL (token)": r["interp"]["ppl_token"],
                         "oracle PPL (token)": r["oracle"]["ppl_token"]})
    return pd.DataFrame(rows)


def write_table(df: pd.DataFrame, csv_path: str | Path, md_path: str | Path, title: str, caption: str,
                note: str = "") -> None:
    """Write df as CSV and as Markdown (one section per split, with a caption and `note` after it, e.g. the base
    LM's convergence), atomically."""
    with atomic_path(csv_path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.4f")
    parts = [f"# {title}\n", caption.strip() + (" " + note.strip() if note.strip() else "") + "\n"]
    for split, sub in df.groupby("split", sort=False):
        parts.append(f"\n## {split}\n")
        shown = sub.drop(columns=["split"]).apply(
            lambda col: col.map(lambda v: _fmt("tokens" if pd.api.types.is_integer_dtype(col) else col.name, v)))
        parts.append(shown.to_markdown(index=False, disable_numparse=True) + "\n")
    with atomic_path(md_path) as tmp:
        Path(tmp).write_text("".join(parts))


def _fmt(column: str, v) -> str:
    """Markdown cell: '-' for missing, integers (columns tokens, words or of integer dtype) as such, λ with 2
    decimals, other numbers (perplexities) with 3."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if column in ("tokens", "words"):
        return f"{int(v)}"
    if isinstance(v, (int, float)):
        return f"{v:.2f}" if column == "λ" else f"{v:.3f}"
    return str(v)


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """df as CSV at `path`, atomically (a comparisons CSV that the findings read; no Markdown twin)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def write_comparisons(rows: list[dict], csv_path: str | Path, md_path: str | Path, title: str, what: str,
                      method: str, note: str = "") -> None:
    """A table of paired comparisons (knnlm.statistics.captions.comparison_rows), one section per split, with a caption
    that says what is compared (`what`) and how the CIs were made (`method`)."""
    cap = (f"{what}: relative difference a / b − 1 of per-word perplexity on the same tokens. {method} Verdict: "
           f"'lower' / 'higher' when the CI excludes 0, else 'inconclusive'.")
    write_table(pd.DataFrame(rows).sort_values("split", kind="stable"), csv_path, md_path, title, cap, note)
