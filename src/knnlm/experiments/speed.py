"""Speed of the kNN-LM's parts on the run's own machine (the axis of He et al. 2021, "Efficient Nearest Neighbor
Language Models", Sec. 2 / Figure 1: perplexity against tokens per second): the base LM's pass, the FAISS search,
the exact search (the real mask) and the real score, per key type and metric of the full store, on the test split.

Every number is read from the timing its job recorded (the queries' manifest, the searches' metas), with the
machine that job ran on (knnlm.io.machine); nothing is re-timed. "kNN-LM tokens/s" is the base LM's pass and the
FAISS search one after the other, 1 / (1/LM + 1/FAISS): what scoring a text costs when the LM's pass and the search
run in sequence (the neighbours' vals and the interpolation are negligible beside them).
"""
from __future__ import annotations

import re

import pandas as pd

from ..job import Job
from ..io import read_checked_json, read_json
from ..scoring.results import METRIC_NAME
from ..report.tables import write_table
from .common import lm_training_label

# He et al. 2021's WikiText-103 figures (Khandelwal et al. 2020's LM and datastore, their machine): the anchor of
# the speed table, not a target.
ANCHOR = {"base LM": 5559.0, "kNN-LM, faiss-cpu": 281.0, "kNN-LM, faiss-gpu": 3204.0}
_NAME = re.compile(r"(?P<key>att|ffn)_(?P<metric>l2|ip)_test\.json$")


def machine_label(m: dict | None) -> str:
    """'AMD EPYC 7B13, 2 of 2 cores' (or '…, GPU NVIDIA H100' when the job ran on one); 'not recorded' for None."""
    if not m:
        return "not recorded"
    threads = f"{m['threads']} of {m['cores']} cores" if m.get("threads") else f"{m['cores']} cores"
    return f"{m['cpu']}, {threads}" + (f", GPU {m['gpu']}" if m.get("device") == "gpu" and m.get("gpu") else "")


def _by_key(paths: list[str]) -> dict[tuple[str, str], dict]:
    out = {}
    for p in paths:
        m = _NAME.search(str(p))
        if m is None:
            raise ValueError(f"{p}: not a test-split meta of the form <key>_<metric>_test.json")
        out[(m["key"], m["metric"])] = read_json(p)
    return out


def speed_rows(queries: dict, nb: dict, exact: dict, real: dict) -> pd.DataFrame:
    """One row per (key, metric) searched in the full store: the base LM's tokens/s, FAISS search tokens/s and keys
    scanned per query, the kNN-LM's tokens/s (LM then FAISS), the exact search's and the real score's milliseconds
    per query (where Table 3 ran them), and the machines. queries: the test split's queries manifest; nb, exact,
    real: {(key, metric): meta} of the test split."""
    lm_tps = queries["T"] / queries["seconds"] if queries.get("seconds") else None
    rows = []
    for (key, metric), s in sorted(nb.items()):
        f_tps = s["T"] / s["search_seconds"] if s.get("search_seconds") else None
        e, r = exact.get((key, metric)), real.get((key, metric))
        rows.append({
            "split": "test", "h_ds": key, "⊗": METRIC_NAME[metric], "keys N": s["N"], "base LM tokens/s": lm_tps,
            "FAISS search tokens/s": f_tps, "nprobe / lists": f"{s['nprobe']} / {s.get('lists', '?')}",
            "keys scanned / query (FAISS)": s.get("keys_scanned_per_query"),
            "kNN-LM tokens/s (LM + FAISS)": 1 / (1 / lm_tps + 1 / f_tps) if lm_tps and f_tps else None,
            "exact search ms / query": 1e3 * e["seconds"] / e["T"] if e and e["T"] else None,
            "exact GFLOP/s": e.get("gflops") if e else None,
            "real score ms / query": 1e3 * r["seconds"] / r["T"] if r and r["T"] else None,
            "queries timed": s["T"], "FAISS on": machine_label(s.get("machine")),
            "LM on": machine_label(queries.get("machine")),
            "exact on": machine_label(e.get("machine")) if e else "-"})
    return pd.DataFrame(rows)


def table(job: Job) -> dict:
    """Table 'speed' of the primary LM (CSV + Markdown) with He et al. 2021's WikiText-103 figures as its anchor."""
    df = speed_rows(read_checked_json(job.path("queries_manifest"), "queries_manifest"), _by_key(job.paths("nb_meta")),
                    _by_key(job.paths("exact_meta")), _by_key(job.paths("real_meta")))
    anchor = ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in ANCHOR.items())
    cap = (f"Speed ({job.cfg['name']}; He et al. 2021, Sec. 2 / Figure 1): the base LM's pass over the test split "
           f"(its keys, queries and log-probs) and each full-store search over the same queries, from the seconds "
           f"each job recorded, on the machine named in each row. 'kNN-LM tokens/s' = the LM's pass then the FAISS "
           f"search, 1 / (1/LM + 1/FAISS). The exact search (the real mask) and the real score ran over the retrieval "
           f"scope ('-' where Table 3 did not run that key type and metric). Anchor, He et al. 2021 on "
           f"WikiText-103 (Khandelwal et al. 2020's LM and datastore, their machine): {anchor}; a smaller LM and datastore are "
           f"faster, so compare ratios (kNN-LM / base LM), not tokens/s. "
           f"{job.cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Speed: tokens per second of the LM and of retrieval", cap,
                note=lm_training_label(job))
    m = {}
    for _, r in df.iterrows():
        tag = f"{r['h_ds']}_{r['⊗']}"
        for col, name in (("FAISS search tokens/s", "faiss_tps"), ("kNN-LM tokens/s (LM + FAISS)", "knnlm_tps"),
                          ("exact search ms / query", "exact_ms_per_query")):
            if pd.notna(r[col]):
                m[f"{tag}_{name}"] = float(r[col])
    if len(df) and pd.notna(df["base LM tokens/s"].iloc[0]):
        m["lm_tps"] = float(df["base LM tokens/s"].iloc[0])
    return {"metrics": m, "artifacts": [job.path("csv"), job.path("md")]}
