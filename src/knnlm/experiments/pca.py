"""PCA-reduced keys (He et al. 2021, "Efficient Nearest Neighbor Language Models", Sec. 4.1): the stores pca<d>
(knnlm.datastore.stores) against the full datastore, with the three mask/score settings of Xu et al. 2023, Sec. 5."""
from __future__ import annotations

import pandas as pd

from ..job import Job
from ..io import read_checked_json
from ..search.scope import scope_caption
from ..report.tables import write_table
from ..scoring.settings import settings_rows
from .common import lm_training_label


def table(job: Job) -> dict:
    """Table 'pca': interpolated perplexity vs key dimension (CSV + Markdown)."""
    cfg, sweeps = job.cfg, [read_checked_json(p, "settings") for p in job.paths("settings")]
    rows = settings_rows(sweeps, lambda s: {"store": s["store"], "dim": s["dim"],
                                            "explained variance": s["store_meta"].get("explained_variance", 1.0)},
                         reference="full", stats=cfg["stats"])
    df = pd.DataFrame(rows).sort_values(["split", "h_ds", "⊗", "mask", "score", "dim"], kind="stable")
    cap = (f"PCA-reduced keys ({cfg['name']}; He et al. 2021): keys and queries projected to d dims by a PCA trained on "
           f"a seeded sample of keys, then IVFPQ with the full keys' code size (D/16 bytes when 'index.code_size' is auto, the same for every PCA dimension, so dimension and code size are not confounded), exact search and "
           f"real score in the reduced space; τ = {cfg['knn']['temperature']}, λ tuned on valid; 'vs full': the paired "
           f"relative difference to the full store's same setting, 'verdict' 'lower' / 'higher' when its CI lies below "
           f"/ above 0 (the full store's own rows: '-'); scope: "
           f"{scope_caption(cfg)}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "PCA: interpolated perplexity vs key dimension", cap, note=lm_training_label(job))
    return {"artifacts": [job.path("csv"), job.path("md")]}
