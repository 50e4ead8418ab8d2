"""Datastore size (Xu et al. 2023, Sec. 4, Figure 2, and Sec. 5.1, Figure 4): the three mask/score settings on
seeded random subsets of the datastore (stores 'r<ratio>', knnlm.datastore.stores) and the full one, from their settings JSONs.

Figure 2: interpolated perplexity vs datastore size (FAISS mask + FAISS score, the usual kNN-LM), and its paired
change against the base LM.
Figure 4: the three mask/score settings (Table 3) vs datastore size, each panel followed by the paired change of the
exact settings against FAISS mask + FAISS score; test and valid, per word; FAISS recall@k per size.
"""
from __future__ import annotations

import pandas as pd

from ..job import Job
from ..report.figures import STYLE, pyplot, save_figure, setting_label
from ..io import read_checked_json
from ..scoring.results import METRIC_NAME
from ..search.scope import scope_caption
from ..report.tables import write_table
from ..scoring.settings import SETTING_LABEL, SETTINGS, settings_ci_caption, settings_rows
from .common import lm_training_label


def size_table(sweeps: list[dict], stats: dict) -> pd.DataFrame:
    """One row per (split, key, metric, ratio, setting) from settings JSONs, sorted for plotting, with CIs and the
    paired difference to the full datastore."""
    rows = settings_rows(sweeps, lambda s: {"ratio": s["ratio"]}, reference="full", stats=stats)
    return pd.DataFrame(rows).sort_values(["split", "h_ds", "⊗", "mask", "score", "ratio"], ascending=True, kind="stable")


def _err(rows: pd.DataFrame):
    """Error bars [2, n] (below, above) of the 95 % CI of interp PPL (word)."""
    return [rows["interp PPL (word)"] - rows["CI low"], rows["CI high"] - rows["interp PPL (word)"]]


def _of(sweeps: list[dict], key: str, metric: str) -> list[dict]:
    """The settings JSONs of one (key, metric), by datastore fraction."""
    return sorted((s for s in sweeps if (s["key_type"], s["metric"]) == (key, metric)), key=lambda s: s["ratio"])


def _paired(ax, sweeps: list[dict], split: str, comparison: str, label: str, fmt: str,
            color: str | None = None) -> None:
    """Plot the paired relative difference `comparison` ('a vs b' of the settings JSONs' CIs,
    knnlm.statistics.intervals) in % with its 95 % CI as error bars, against the fraction of the datastore, for the
    settings JSONs `sweeps` of one (key, metric), sorted by fraction (_of)."""
    d = [s["ci"][split]["diff"][comparison] for s in sweeps]
    v = [100 * x["value"] for x in d]
    ax.errorbar([s["ratio"] for s in sweeps], v, yerr=[[a - 100 * x["lo"] for a, x in zip(v, d)],
                                                     [100 * x["hi"] - a for a, x in zip(v, d)]],
                fmt=fmt, capsize=3, label=label, color=color)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the datastore")


def figures(job: Job) -> dict:
    """Table datastore_size (CSV + Markdown), Figures 2 and 4 (PNG + PDF)."""
    plt = pyplot()
    cfg = job.cfg
    name, note = cfg["name"], cfg.get("profile", {}).get("caption", "")
    sweeps = [read_checked_json(p, "settings") for p in job.paths("settings")]
    size = size_table(sweeps, cfg["stats"])
    cap = (f"Datastore size ({name}; Xu et al. 2023, Sec. 5, Figures 2 and 4): seeded random subsets of the datastore "
           f"(nested, one IVFPQ per ratio), τ = {cfg['knn']['temperature']}, k = {cfg['knn']['k']}, λ tuned on valid; "
           f"scope: {scope_caption(cfg)}. CI low/high: 95% CI of interp PPL (word); 'vs full': paired relative "
           f"difference to the same setting on the full datastore ({settings_ci_caption(sweeps, cfg['stats'])}). {note}")
    write_table(size, job.path("csv"), job.path("md"), "Datastore size: interpolated perplexity vs fraction of the datastore",
                cap, note=lm_training_label(job))
    written = [str(job.path("csv")), str(job.path("md"))]

    pairs = sorted({(s["key_type"], s["metric"]) for s in sweeps})
    splits = ("test", "valid")
    fig, axes = plt.subplots(2, 2, figsize=(9.2, 7.0), squeeze=False, layout="constrained")
    for ax, split in zip(axes[1], splits):  # the paired view: the same documents with and without retrieval
        for key, metric in pairs:
            _paired(ax, _of(sweeps, key, metric), split,
                    f"{SETTINGS[0]} vs base", f"kNN-LM {key}/{METRIC_NAME[metric]}", "-o")
        ax.set_ylabel(f"{split}: change vs base LM (%, paired 95% CI)")
    axes[1][0].legend(fontsize=8)
    for ax, split in zip(axes[0], splits):
        part = size[size["split"] == split]
        for key, metric in pairs:
            sub = part[(part["h_ds"] == key) & (part["⊗"] == METRIC_NAME[metric]) & (part["mask"] == "FAISS")
                       & (part["score"] == "FAISS")]
            ax.errorbar(sub["ratio"], sub["interp PPL (word)"], yerr=_err(sub), fmt="-o", capsize=3,
                        label=f"kNN-LM {key}/{METRIC_NAME[metric]}")
        ax.axhline(part["base PPL (word)"].iloc[0], color="k", ls="--", label="base LM")
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the datastore")
        ax.set_ylabel(f"{split} perplexity (per word)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Fig. 2 ({name}): datastore size (FAISS mask + FAISS score)", fontsize=10)
    written += save_figure(fig, job.paths("fig2"))
    plt.close(fig)

    fig, axes = plt.subplots(5, len(pairs), figsize=(4.6 * len(pairs), 16.5), squeeze=False, layout="constrained")
    for row, split in zip((1, 3), splits):  # paired: each setting against FAISS mask + FAISS score, same documents
        for ax, (key, metric) in zip(axes[row], pairs):
            here = _of(sweeps, key, metric)
            for setting in SETTINGS[1:]:
                _paired(ax, here, split, f"{setting} vs {SETTINGS[0]}", setting_label(setting), STYLE[setting],
                        color=f"C{SETTINGS.index(setting)}")  # each setting's colour in the panel above
            ax.set_title(f"{key}/{METRIC_NAME[metric]}, {split}: vs {setting_label(SETTINGS[0])}", fontsize=10)
        axes[row][0].set_ylabel(f"{split}: change (%, paired 95% CI)")
        axes[row][0].legend(fontsize=7)
    for row, split in zip((0, 2), splits):
        part = size[size["split"] == split]
        for ax, (key, metric) in zip(axes[row], pairs):
            sub = part[(part["h_ds"] == key) & (part["⊗"] == METRIC_NAME[metric])]
            for setting in SETTINGS:
                mask, score = SETTING_LABEL[setting]
                ss = sub[(sub["mask"] == mask) & (sub["score"] == score)]
                ax.errorbar(ss["ratio"], ss["interp PPL (word)"], yerr=_err(ss), fmt=STYLE[setting], capsize=3,
                            label=setting_label(setting))
            ax.axhline(sub["base PPL (word)"].iloc[0], color="k", ls="--", label="base LM")
            ax.set_xscale("log")
            ax.set_xlabel("fraction of the datastore")
            ax.set_title(f"{key}/{METRIC_NAME[metric]}, {split}", fontsize=10)
        axes[row][0].set_ylabel(f"{split} perplexity (per word)")
    for ax, (key, metric) in zip(axes[4], pairs):  # how approximate the approximation was, per size
        here = _of(sweeps, key, metric)
        for split in splits:
            ax.plot([s["ratio"] for s in here], [s["recall"][split] for s in here], "-o", label=split)
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the datastore")
        ax.set_title(f"{key}/{METRIC_NAME[metric]}: FAISS recall@{cfg['knn']['k']} of the exact top-k", fontsize=10)
        ax.legend(fontsize=7)
    axes[4][0].set_ylabel("recall")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Fig. 4 ({name}): approximate vs exact retrieval by datastore size", fontsize=10)
    written += save_figure(fig, job.paths("fig4"))
    plt.close(fig)
    return {"artifacts": written}
