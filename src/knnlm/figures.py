"""Figures 2, 4 and 5 of Xu et al. (2023), and the tables behind them, from the `knnlm sweep` JSONs.

Figure 2: interpolated perplexity vs datastore size (FAISS mask + FAISS score, the usual kNN-LM).
Figure 4: the three mask/score settings (Table 3) vs datastore size.
Figure 5: interpolated perplexity vs the kNN softmax temperature τ (λ tuned on valid per τ), for each
datastore size in config 'temperature.ratios' (paper: 5a = 5 % of the datastore, 5b = all of it).
Every figure is written as PNG and PDF, atomically; numbers are test-split perplexities per word.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .ablations import SETTING_LABEL, SETTINGS
from .config import store_name
from .io import atomic_path, read_json
from .tables import METRIC_NAME, write_table

STYLE = {"faiss_mask_faiss_score": "-o", "faiss_mask_real_score": "--s", "real_mask_real_score": ":^"}


def _label(setting: str) -> str:
    mask, score = SETTING_LABEL[setting]
    return f"{mask} mask + {score} score"


def _save(fig, stem: Path) -> list[str]:
    out = []
    for ext in ("png", "pdf"):
        path = Path(f"{stem}.{ext}")  # not with_suffix: stems like fig5_temperature_r0.05 have dots
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight")
        out.append(str(path))
    return out


def write_size_temperature(sweep_paths: list[str], cfg: dict, fig_dir: str | Path, tables_dir: str | Path,
                           scope_caption: str) -> list[str]:
    """Write Figures 2, 4, 5 (PNG + PDF) and tables datastore_size / temperature (CSV + Markdown).

    sweep_paths: JSONs of `knnlm sweep`, one per (datastore size, key type, metric). Returns the paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [read_json(p) for p in sweep_paths]
    fig_dir, tables_dir = Path(fig_dir), Path(tables_dir)
    name, tau0 = cfg["name"], cfg["knn"]["temperature"]
    note = cfg.get("profile", {}).get("caption", "")
    written = []

    rows = []
    for s in sweeps:
        for split in ("test", "valid"):
            for setting in SETTINGS:
                v = s["settings"][setting]
                mask, score = SETTING_LABEL[setting]
                rows.append({"split": split, "h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]], "ratio": s["ratio"],
                             "mask": mask, "score": score, "λ": v["lambda"],
                             "interp PPL (word)": v[split]["interp"]["ppl_word"],
                             "interp PPL (token)": v[split]["interp"]["ppl_token"],
                             "oracle PPL (word)": v[split]["oracle"]["ppl_word"],
                             "base PPL (word)": s["base"][split]["ppl_word"]})
    size = pd.DataFrame(rows).sort_values(["split", "h_ds", "⊗", "mask", "score", "ratio"], ascending=True,
                                          kind="stable")
    cap = (f"Datastore size ({name}; Figures 2 and 4): seeded random subsets of the datastore (one IVFPQ per ratio), "
           f"τ = {tau0}, k = {cfg['knn']['k']}, λ tuned on valid; scope: {scope_caption}. {note}")
    write_table(size, tables_dir / "datastore_size.csv", tables_dir / "datastore_size.md",
                "Datastore size: interpolated perplexity vs fraction of the datastore", cap)
    written += [str(tables_dir / "datastore_size.csv"), str(tables_dir / "datastore_size.md")]

    pairs = sorted({(s["key_type"], s["metric"]) for s in sweeps})
    splits = ("test", "valid")
    fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.6), squeeze=False, layout="constrained")
    for ax, split in zip(axes[0], splits):
        part = size[size["split"] == split]
        for key, metric in pairs:
            sub = part[(part["h_ds"] == key) & (part["⊗"] == METRIC_NAME[metric]) & (part["mask"] == "FAISS")
                       & (part["score"] == "FAISS")]
            ax.plot(sub["ratio"], sub["interp PPL (word)"], "-o", label=f"kNN-LM {key}/{METRIC_NAME[metric]}")
        ax.axhline(part["base PPL (word)"].iloc[0], color="k", ls="--", label="base LM")
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the datastore")
        ax.set_ylabel(f"{split} perplexity (per word)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Fig. 2 ({name}): datastore size (FAISS mask + FAISS score)", fontsize=10)
    written += _save(fig, fig_dir / "fig2_datastore_size")
    plt.close(fig)

    fig, axes = plt.subplots(2, len(pairs), figsize=(4.6 * len(pairs), 7.2), squeeze=False, layout="constrained")
    for row, split in enumerate(splits):
        part = size[size["split"] == split]
        for ax, (key, metric) in zip(axes[row], pairs):
            sub = part[(part["h_ds"] == key) & (part["⊗"] == METRIC_NAME[metric])]
            for setting in SETTINGS:
                mask, score = SETTING_LABEL[setting]
                ss = sub[(sub["mask"] == mask) & (sub["score"] == score)]
                ax.plot(ss["ratio"], ss["interp PPL (word)"], STYLE[setting], label=_label(setting))
            ax.axhline(sub["base PPL (word)"].iloc[0], color="k", ls="--", label="base LM")
            ax.set_xscale("log")
            ax.set_xlabel("fraction of the datastore")
            ax.set_title(f"{key}/{METRIC_NAME[metric]}, {split}", fontsize=10)
        axes[row][0].set_ylabel(f"{split} perplexity (per word)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Fig. 4 ({name}): approximate vs exact retrieval by datastore size", fontsize=10)
    written += _save(fig, fig_dir / "fig4_mask_score_by_size")
    plt.close(fig)

    trows = []
    for ratio in cfg["temperature"]["ratios"]:
        store = store_name(ratio)
        here = [s for s in sweeps if s["store"] == store and "tau_sweep" in s]
        if not here:
            continue
        fig, axes = plt.subplots(2, len(here), figsize=(4.6 * len(here), 7.2), squeeze=False, layout="constrained")
        for col, s in enumerate(sorted(here, key=lambda s: (s["key_type"], s["metric"]))):
            for setting in SETTINGS:
                v = s["tau_sweep"][setting]
                for row, split in enumerate(splits):
                    axes[row][col].plot(v["tau"], v[f"{split}_interp_ppl_word"], STYLE[setting], ms=3,
                                        label=_label(setting))
                b = v["best"]
                trows.append({"split": "test", "ratio": ratio, "h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]],
                              "mask": SETTING_LABEL[setting][0], "score": SETTING_LABEL[setting][1],
                              "best τ": b["tau"], "λ": b["lambda"], "valid interp PPL (word)": b["valid_interp_ppl_word"],
                              "interp PPL (word)": b["test_interp_ppl_word"],
                              "interp PPL (token)": b["test_interp_ppl_token"],
                              f"interp PPL (word) at τ={tau0:g}": s["settings"][setting]["test"]["interp"]["ppl_word"]})
            for row, split in enumerate(splits):
                ax = axes[row][col]
                ax.axhline(s["base"][split]["ppl_word"], color="k", ls="--", label="base LM")
                ax.set_xlabel("temperature τ")
                ax.set_title(f"{s['key_type']}/{METRIC_NAME[s['metric']]}, {ratio:.0%} of the datastore, {split}",
                             fontsize=9)
        for row, split in enumerate(splits):
            axes[row][0].set_ylabel(f"{split} perplexity (per word)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"Fig. 5 ({name}): temperature, {ratio:.0%} of the datastore (λ tuned on valid per τ)", fontsize=10)
        written += _save(fig, fig_dir / f"fig5_temperature_{store}")
        plt.close(fig)
    if trows:
        t = cfg["temperature"]
        cap = (f"Temperature ({name}; Figure 5): best τ per setting, chosen on valid over τ = {t['start']:g} … "
               f"{t['stop']:g} step {t['step']:g} (τ = 0 is the limit τ → 0), λ tuned on valid over {t['lambda_steps']} "
               f"values for every τ; test perplexities at the chosen (τ, λ); scope: {scope_caption}. {note}")
        write_table(pd.DataFrame(trows), tables_dir / "temperature.csv", tables_dir / "temperature.md",
                    "Temperature: best τ per setting", cap)
        written += [str(tables_dir / "temperature.csv"), str(tables_dir / "temperature.md")]
    return written
