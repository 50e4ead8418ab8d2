"""Where the randomness is ours: how much the FAISS settings of Xu et al. (2023, Sec. 5) move with the
IVFPQ training seed (stores full-ivf<k>, the same keys and exact search as 'full') and with the subset draw
(stores r<ratio>-draw<k>), next to the paired CI of each comparison within one seed.

If the spread over seeds is as large as a claimed difference, a single-seed verdict on "FAISS beats exact" is
not robust even when its CI over documents (which holds the index fixed) excludes 0.
"""
from __future__ import annotations

import pandas as pd

from ..job import Job
from ..io import read_checked_json
from ..search.scope import scope_caption
from ..statistics.captions import ci_caption, fmt_ci
from ..report.tables import write_table
from ..scoring.settings import SETTING_LABEL, SETTINGS
from .common import lm_training_label


def _group(s: dict, default_index_seed: int) -> tuple[str, int]:
    """('IVFPQ seed' | 'subset draw', seed) of a settings JSON: subsets vary by their draw, the full store by its
    index seed."""
    meta = s["store_meta"]
    if "ratio" in meta:
        return "subset draw", int(meta["seed"])
    return "IVFPQ seed", int(meta.get("index_seed", default_index_seed))


def table(job: Job) -> dict:
    """Table 'variance': per store (seed) the test interp PPL of each setting with its CI, FAISS recall, and the
    exact-vs-approximate difference with its CI; then per group and setting the mean, standard deviation and range
    over seeds."""
    cfg = job.cfg
    rows = []
    for s in (read_checked_json(p, "settings") for p in job.paths("settings")):
        group, seed = _group(s, cfg["index"]["seed"])
        c = s["ci"]["test"]
        for st in SETTINGS:
            mask, score = SETTING_LABEL[st]
            rows.append({"randomness": group, "store": s["store"], "seed": seed, "mask": mask, "score": score,
                         "interp PPL (word)": s["settings"][st]["test"]["interp"]["ppl_word"],
                         "95% CI (word)": fmt_ci(c["ppl"][st]), "vs base (95% CI)": fmt_ci(c["diff"][f"{st} vs base"], pct=True),
                         "FAISS recall@k": s["recall"]["test"],
                         "exact vs approximate (95% CI)": fmt_ci(c["diff"]["real_mask_real_score vs faiss_mask_faiss_score"],
                                                                 pct=True)})
    df = pd.DataFrame(rows).sort_values(["randomness", "mask", "score", "seed"], kind="stable")
    summary = []
    for (group, mask, score), g in df.groupby(["randomness", "mask", "score"], sort=False):
        v = g["interp PPL (word)"].to_numpy()
        summary.append({"randomness": group, "store": "over seeds", "seed": len(v), "mask": mask, "score": score,
                        "interp PPL (word)": float(v.mean()), "95% CI (word)": f"sd {v.std(ddof=1) if len(v) > 1 else 0:.3f}",
                        "vs base (95% CI)": f"range {v.min():.2f} … {v.max():.2f}",
                        "FAISS recall@k": float(g["FAISS recall@k"].mean()),
                        "exact vs approximate (95% CI)": f"spread {100 * (v.max() / v.min() - 1):.2f} %"})
    out = pd.concat([df, pd.DataFrame(summary)], ignore_index=True)
    out.insert(0, "split", "test")
    v = cfg["variance"]
    cap = (f"Variance over our own randomness ({cfg['name']}; Xu et al. 2023, Sec. 5 settings), {v['key_type']}/"
           f"{v['metric'].upper()}, τ = {cfg['knn']['temperature']:g}, λ tuned on valid per store: the IVFPQ "
           f"training seed (full datastore; seeds {[cfg['index']['seed']] + v['index_seeds']}) and the draw of the "
           f"{v['ratio']:.0%} subset (seeds {[cfg['datastore_size']['seed']] + v['draw_seeds']}); the exact search "
           f"depends on the draw only. Rows 'over seeds': mean, sample sd and range of the interp PPL, mean recall, "
           f"and the spread max/min − 1. CIs: paired over the scope's documents "
           f"({ci_caption(cfg['stats'])}), index and draw fixed. "
           f"Scope: {scope_caption(cfg)}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(out, job.path("csv"), job.path("md"), "Variance over IVFPQ seeds and subset draws", cap, note=lm_training_label(job))
    spread = {f"{r['randomness'].replace(' ', '_')}_{r['mask']}_{r['score']}_sd": float(str(r["95% CI (word)"])[3:])
              for r in summary}
    return {"metrics": spread, "artifacts": [job.path("csv"), job.path("md")]}
