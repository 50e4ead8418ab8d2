"""Figure helpers shared by the experiments: PNG + PDF output (atomic) and the mask/score setting styles."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import atomic_path

STYLE = {"faiss_mask_faiss_score": "-o", "faiss_mask_real_score": "--s", "real_mask_real_score": ":^"}


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def setting_label(setting: str) -> str:
    """'FAISS mask + real score' etc. for a setting of knnlm.experiments.retrieval.SETTINGS."""
    from ..scoring.settings import SETTING_LABEL

    mask, score = SETTING_LABEL[setting]
    return f"{mask} mask + {score} score"


def save_figure(fig, paths: list[str | Path]) -> list[str]:
    """Save `fig` to each path (format from its extension: png, pdf), atomically; returns the paths."""
    out = []
    for path in map(Path, paths):
        ext = path.name.rsplit(".", 1)[1]  # not Path.suffix logic on stems like fig5_temperature_r0.05
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight")
        out.append(str(path))
    return out


def interval_bars(cis: list[dict]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(values [n], [below [n], above [n]]) of intervals {'value', 'lo', 'hi'} (compare()'s 'ppl' entries): the points
    and the asymmetric error bars of matplotlib's errorbar(yerr=...)."""
    v = np.array([c["value"] for c in cis], dtype=np.float64)
    return v, [v - np.array([c["lo"] for c in cis]), np.array([c["hi"] for c in cis]) - v]


# The verdict kinds of a findings row (its verdict up to the first ' (': the legend is docs/verdicts.md), in the
# order and colours the summary figure stacks them
VERDICT_KINDS = {"reproduced": "#2e7d32", "contradicted": "#c62828", "inconclusive": "#9e9e9e",
                 "reported": "#90caf9", "not tested": "#fff59d", "not run": "#eeeeee"}


def section_part(section: str) -> str:
    """The part of the paper (or the follow-up) a findings row's section belongs to, as the summary figure groups rows:
    'Sec. 5.1' and 'Sec. 5.2' (Findings 2 and 3) apart, every other 'Sec. N.M' under 'Sec. N', every 'App. X.N'
    under 'App. X', a follow-up by its authors ('He et al. 2021')."""
    import re

    head = section.split(",")[0].strip()
    m = re.match(r"^(Sec\. 5\.\d|Sec\. \d+|App\. [A-Z])", head)
    return m.group(1) if m else head


def _part_order(part: str) -> tuple:
    """The sort key of a section_part: the paper's sections by number, its appendices by letter, then the follow-ups
    by year."""
    import re

    m = re.match(r"^Sec\. ([\d.]+)$", part)
    if m:
        return (0, tuple(int(x) for x in m.group(1).split(".")), "")
    m = re.match(r"^App\. ([A-Z])$", part)
    if m:
        return (1, (), m.group(1))
    year = re.search(r"(\d{4})", part)
    return (2, (int(year.group(1)) if year else 9999,), part)


def findings_summary_figure(rows: list[dict], title: str, paths: list[str | Path]) -> list[str]:
    """One horizontal bar per part of the paper (section_part of each row's 'section'), stacked by verdict kind
    (VERDICT_KINDS, the verdict up to its first ' ('), each segment labelled with its count: the findings report at a
    glance. rows: findings rows with 'section' and 'verdict' (findings.json, or the Markdown table of a findings
    report). Raises ValueError for a verdict of no known kind (the legend must name every verdict the engine gives).
    Returns the paths written (save_figure)."""
    parts: dict[str, dict[str, int]] = {}
    for r in rows:
        kind = r["verdict"].split(" (")[0].strip()
        if kind not in VERDICT_KINDS:
            raise ValueError(f"findings row {r.get('claim', '')!r}: verdict {r['verdict']!r} is of no kind of "
                             f"{list(VERDICT_KINDS)}")
        part = parts.setdefault(section_part(r["section"]), dict.fromkeys(VERDICT_KINDS, 0))
        part[kind] += 1
    plt = pyplot()
    names = sorted(parts, key=_part_order)[::-1]  # the paper's order, top to bottom
    fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(names) + 1.6))
    left = np.zeros(len(names))
    for kind, colour in VERDICT_KINDS.items():
        n = np.array([parts[p][kind] for p in names])
        bars = ax.barh(names, n, left=left, color=colour, edgecolor="#616161", linewidth=0.4,
                       label=f"{kind} ({n.sum()})")
        ax.bar_label(bars, labels=[str(v) if v else "" for v in n], label_type="center", fontsize=7)
        left += n
    ax.set_xlabel("findings rows (one measurement each)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    ax.set_xlim(0, left.max() * 1.03)
    ax.tick_params(axis="y", labelsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    try:
        return save_figure(fig, paths)
    finally:
        plt.close(fig)
