"""Temperature (Xu et al. 2023, Sec. 5, Figure 5): the kNN softmax temperature τ swept offline from the cached
neighbours of a store (no new search), for the three mask/score settings, λ tuned on valid for every τ.

Jobs: tau_sweep (one store, key, metric), figures (Figure 5 per store, table 'temperature').
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ..cli import Job
from ..config import temperatures
from ..figures import STYLE, pyplot, save_figure, setting_label
from ..io import read_json, write_json
from ..results import METRIC_NAME
from ..scope import scope_caption
from ..scoring import interpolate, knn_log_prob_from_hits, lambda_grid, nll_grid, summarize, sweep_temperature
from ..tables import write_table
from .retrieval import SETTING_LABEL, SETTINGS, load_settings, settings_result


def temperature_sweep(lp_lm: dict[str, np.ndarray], raw: dict[str, dict[str, tuple]], words: dict[str, int],
                      taus: list[float], lambda_steps: int) -> dict[str, dict]:
    """The τ × λ sweep of Figure 5 from cached neighbours, for each mask/score setting.

    lp_lm: {split: [T_s]}; raw: {setting: {split: (scores [T_s, k], hit, valid)}} (higher score = closer);
    taus: τ grid (τ = 0: the limit); λ grid = linspace(0, 1, lambda_steps). Per τ, λ is tuned on valid
    over the grid (nll_grid); the valid and test interpolated perplexities at that λ are recomputed
    exactly (interpolate). The best τ minimises the valid NLL. Returns per setting: {'tau', 'lambda',
    'valid_interp_ppl_word', 'test_interp_ppl_word', 'test_interp_ppl_token', 'best': {...}}.
    """
    lams = lambda_grid(lambda_steps)
    out = {}
    for setting, by_split in raw.items():
        sweep = {s: sweep_temperature(*by_split[s], taus) for s in ("valid", "test")}
        grid = nll_grid(lp_lm["valid"], sweep["valid"], lams)  # [n_tau, n_lambda]
        best_l = grid.argmin(1)
        res = {"tau": list(taus), "lambda": [float(lams[j]) for j in best_l]}
        for split in ("valid", "test"):
            summ = [summarize(interpolate(lp_lm[split], sweep[split][i], float(lams[j])), words[split])
                    for i, j in enumerate(best_l)]
            res[f"{split}_interp_ppl_word"] = [x["ppl_word"] for x in summ]
            res[f"{split}_interp_ppl_token"] = [x["ppl_token"] for x in summ]
        i = int(np.argmin(res["valid_interp_ppl_word"]))
        res["best"] = {"tau": taus[i], "lambda": res["lambda"][i], "valid_interp_ppl_word": res["valid_interp_ppl_word"][i],
                       "test_interp_ppl_word": res["test_interp_ppl_word"][i],
                       "test_interp_ppl_token": res["test_interp_ppl_token"][i]}
        out[setting] = res
    return out


def tau_sweep(job: Job) -> dict:
    """The settings at the config τ and the τ × λ sweep of one (store, key, metric), from one read of the caches."""
    t0 = time.time()
    lp_lm, words, raw, docs, recall = load_settings(job, raw=True)
    tau = job.cfg["knn"]["temperature"]
    lp_knn = {st: {sp: knn_log_prob_from_hits(*c, tau) for sp, c in by.items()} for st, by in raw.items()}
    out = settings_result(job, lp_lm, words, lp_knn, docs, recall)
    t1 = time.time()
    out["tau_sweep"] = temperature_sweep(lp_lm, raw, words, temperatures(job.cfg), job.cfg["temperature"]["lambda_steps"])
    out["tau_sweep_seconds"] = time.time() - t1
    out["seconds"] = time.time() - t0
    write_json(job.path("out"), out)
    metrics = {}
    for st, v in out["tau_sweep"].items():
        metrics[f"best_tau_{st}"] = v["best"]["tau"]
        metrics[f"test_{st}_best_tau_interp_ppl_word"] = v["best"]["test_interp_ppl_word"]
    step = {f"{st}_test_ppl_vs_tau_x10": [(int(round(t * 10)), p) for t, p in zip(v["tau"], v["test_interp_ppl_word"])
                                          if np.isfinite(p)] for st, v in out["tau_sweep"].items()}
    return {"metrics": metrics, "step_metrics": step, "artifacts": [job.path("out")]}


def figures(job: Job) -> dict:
    """Figure 5 for each swept store (PNG + PDF; 5a = 5 %, 5b = the full datastore) and table 'temperature'."""
    plt = pyplot()
    cfg = job.cfg
    name, tau0, note = cfg["name"], cfg["knn"]["temperature"], cfg.get("profile", {}).get("caption", "")
    sweeps = [read_json(p) for p in job.paths("sweeps")]
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
                    axes[row][col].plot(v["tau"], v[f"{split}_interp_ppl_word"], STYLE[setting], ms=3,
                                        label=setting_label(setting))
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
        written += save_figure(fig, figs[store])
        plt.close(fig)
    t = cfg["temperature"]
    cap = (f"Temperature ({name}; Xu et al. 2023, Sec. 5, Figure 5): best τ per setting, chosen on valid over τ = "
           f"{t['start']:g} … {t['stop']:g} step {t['step']:g} (τ = 0 is the limit τ → 0), λ tuned on valid over "
           f"{t['lambda_steps']} values for every τ; test perplexities at the chosen (τ, λ); scope: {scope_caption(cfg)}. "
           f"{note}")
    write_table(pd.DataFrame(trows), job.path("csv"), job.path("md"), "Temperature: best τ per setting", cap)
    return {"artifacts": written + [str(job.path("csv")), str(job.path("md"))]}
