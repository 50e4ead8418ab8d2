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
