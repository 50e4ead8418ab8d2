"""Temperature (Xu et al. 2023, Sec. 5.2, Figure 5): the kNN softmax temperature τ swept offline from the cached
neighbours of a store (no new search), for the three mask/score settings, λ tuned on valid for every τ.

The sweep itself is part of every store's settings (knnlm.experiments.retrieval.settings, which also reports each
setting at its tuned τ); this module draws Figure 5 and the table 'temperature' from those settings.
"""
from __future__ import annotations

import pandas as pd

from ..job import Job
from ..report.figures import STYLE, pyplot, save_figure, setting_label
from ..io import read_checked_json
from ..scoring.results import METRIC_NAME
from ..search.scope import scope_caption
from ..statistics.captions import fmt_ci
from ..report.tables import write_table
from ..scoring.settings import SETTING_LABEL, SETTINGS, TUNED, settings_ci_caption
from .common import lm_training_label


def figures(job: Job) -> dict:
    """Figure 5 for each swept store (PNG + PDF; 5a = 5 %, 5b = the full datastore), one column per (h_ds, ⊗), with
    95 % bands over documents (config 'stats.interval'), and table 'temperature' (best τ per setting, tuned vs τ = 1 with its CI)."""
    plt = pyplot()
    cfg = job.cfg
    name, tau0, note = cfg["name"], cfg["knn"]["temperature"], cfg.get("profile", {}).get("caption", "")
    sweeps = [read_checked_json(p, "settings") for p in job.paths("settings")]
    figs = {}
    for p in job.paths("fig5"):  # fig5_temperature_<store>.<ext>
        figs.setdefault(p.name.rsplit(".", 1)[0].removeprefix("fig5_temperature_"), []).append(p)
    splits = ("test", "valid")
    trows, written = [], []
    for store in sorted({s["store"] for s in sweeps}, key=lambda st: min(s["ratio"] for s in sweeps if s["store"] == st)):
        here = sorted((s for s in sweeps if s["store"] == store), key=lambda s: (s["key_type"], s["metric"]))
        ratio = here[0]["ratio"]
        fig, axes = plt.subplots(2, len(here), figsize=(4.6 * len(here), 7.2), squeeze=False, layout="constrained")
        for col, s in enumerate(here):
            for setting in SETTINGS:
                v = s["tau_sweep"][setting]
                for row, split in enumerate(splits):
                    line, = axes[row][col].plot(v["tau"], v[f"{split}_interp_ppl_word"], STYLE[setting], ms=3,
                                                label=setting_label(setting))
                    if f"{split}_lo" in v:
                        axes[row][col].fill_between(v["tau"], v[f"{split}_lo"], v[f"{split}_hi"], alpha=0.15,
                                                    color=line.get_color(), lw=0)
                b = v["best"]
                vs = s["ci"]["test"]["diff"].get(f"{setting}{TUNED} vs {setting}")
                trows.append({"split": "test", "ratio": ratio, "h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]],
                              "mask": SETTING_LABEL[setting][0], "score": SETTING_LABEL[setting][1],
                              "best τ": b["tau"], "τ* on grid edge": b.get("tau_edge", ""),
                              "grid stop": v["tau"][-1], "λ": b["lambda"], "valid interp PPL (word)": b["valid_interp_ppl_word"],
                              "interp PPL (word)": b["test_interp_ppl_word"],
                              "interp PPL (token)": b["test_interp_ppl_token"],
                              f"interp PPL (word) at τ={tau0:g}": s["settings"][setting]["test"]["interp"]["ppl_word"],
                              f"best τ vs τ={tau0:g} (95% CI)": fmt_ci(vs, pct=True) if vs else "-",
                              "verdict": vs["verdict"] if vs else "-"})
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
        written += save_figure(fig, figs[store])
        plt.close(fig)
    t = cfg["temperature"]
    cap = (f"Temperature ({name}; Xu et al. 2023, Sec. 5, Figure 5): best τ per setting, chosen on valid over τ = "
           f"{t['start']:g} … {t['stop']:g} step {t['step']:g} (τ = 0 is the limit τ → 0), the grid extended by its "
           f"span while a best τ is its last value (at most {t['max_extensions']} times; 'grid stop' is where it ended, "
           f"'τ* on grid edge' marks a best τ still on an edge), λ tuned on valid over "
           f"{t['lambda_steps']} values for every τ; test perplexities at the chosen (τ, λ); scope: {scope_caption(cfg)}. "
           f"Bands in Figure 5 and the CI of 'best τ vs τ = {tau0:g}': {settings_ci_caption(sweeps, cfg['stats'])}; the "
           f"band at each τ is that of its own λ. {note}")
    write_table(pd.DataFrame(trows), job.path("csv"), job.path("md"), "Temperature: best τ per setting", cap, note=lm_training_label(job))
    return {"artifacts": written + [str(job.path("csv")), str(job.path("md"))]}
