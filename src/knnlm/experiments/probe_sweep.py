"""Approximation strength as a variable (Xu et al. 2023, Sec. 5): each swept store searched with several nprobe
(stores '<store>-np<n>': the same IVFPQ index and the same exact search, knnlm.datastore.stores), and at each point the
FAISS mask against the real mask, as a function of the FAISS recall@k.

The paper's finding "the FAISS mask beats the real mask" holds at its index's strength (nprobe = 32 of 4,096
lists, 0.78 % of the datastore probed); a store whose probe count is set by 'index.nprobe: auto' (at least
scan_factor × k keys per query) can be probed far more densely than that (a small store), and then its FAISS mask
is nearly the real one. The table marks the point at the paper's probed fraction and whether it probes at least k
keys per query (below that, faiss widens the probe for the queries it could not fill, and the point no longer has
the paper's strength); the figure shows where the comparison flips as the search gets more exact.
"""
from __future__ import annotations

import pandas as pd

from ..job import Job
from ..report.figures import pyplot, save_figure
from ..io import read_checked_json
from ..statistics.captions import fmt_ci
from ..report.tables import write_table
from .common import lm_training_label
from ..scoring.settings import FAISS_REAL, REAL_REAL, TUNED, settings_ci_caption

MASK_PAIR = f"{REAL_REAL} vs {FAISS_REAL}"  # real mask vs FAISS mask, both with real scores (Table 3, Figure 4)


def point(s: dict, split: str, probe_fraction: float, k: int) -> dict:
    """One row of the sweep from a settings JSON `s` (rule settings) on `split`: the store, its probe count and
    lists, the probed fraction, keys scanned per query, FAISS recall@k, whether this is the paper's probed fraction
    (`probe_fraction`, within half a list) and probes ≥ k keys per query, and the real mask vs FAISS mask (real
    score) at τ = 1 and at each side's τ*: relative difference of per-word perplexity with its CI and verdict."""
    scan = s.get("scan", {}).get(split, {})
    nprobe, lists = scan.get("nprobe"), scan.get("lists")
    frac = nprobe / lists if nprobe and lists else None
    keys = scan.get("keys_scanned_per_query")
    c = s["ci"][split]["diff"]
    row = {"split": split, "store": s["store"], "ratio": s["ratio"], "size": s["size"], "nprobe": nprobe,
           "lists": lists, "probed fraction": frac, "keys scanned / query": keys, "recall@k": s["recall"][split],
           "missing neighbours": scan.get("missing_neighbours"),
           "paper's fraction": bool(frac is not None and lists and abs(frac - probe_fraction) * lists <= 0.5),
           "≥ k keys probed": bool(keys is not None and keys >= k), "documents": len(s["doc_ids"][split])}
    for label, suffix in (("τ = 1", ""), ("τ*", TUNED)):
        d = c.get(f"{REAL_REAL}{suffix} vs {FAISS_REAL}{suffix}")
        row[f"real vs FAISS mask, {label}"] = None if d is None else d["value"]
        row[f"real vs FAISS mask, {label} (95% CI)"] = "-" if d is None else fmt_ci(d, pct=True)
        row[f"verdict, {label}"] = "-" if d is None else d["verdict"]
        row[f"_lo {label}"], row[f"_hi {label}"] = (None, None) if d is None else (d["lo"], d["hi"])
    return row


def sweep_rows(jsons: list[dict], probe_fraction: float, k: int) -> pd.DataFrame:
    """point() of every settings JSON on test and valid, ordered by store size, then nprobe."""
    rows = [point(s, split, probe_fraction, k) for s in jsons for split in ("test", "valid")]
    return pd.DataFrame(rows).sort_values(["split", "size", "nprobe"], ascending=[True, False, True], kind="stable")


def figure(df: pd.DataFrame, paths: list[str]) -> list[str]:
    """Real mask vs FAISS mask (real score, test) against FAISS recall@k, one line per store, τ = 1 and τ* panels,
    95 % CIs as bars; the paper's probed fraction ringed."""
    plt = pyplot()
    test = df[df["split"] == "test"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, label in zip(axes, ("τ = 1", "τ*")):
        for (size, store), g in test.groupby(["size", test["store"].str.replace(r"-np\d+", "", regex=True)],
                                             sort=False):
            g = g.dropna(subset=[f"real vs FAISS mask, {label}"]).sort_values("recall@k")
            if g.empty:
                continue
            y = 100 * g[f"real vs FAISS mask, {label}"]
            err = [y - 100 * g[f"_lo {label}"], 100 * g[f"_hi {label}"] - y]
            line = ax.errorbar(g["recall@k"], y, yerr=err, marker="o", capsize=3, label=f"{store} ({size:,} keys)")
            paper = g[g["paper's fraction"]]
            ax.scatter(paper["recall@k"], 100 * paper[f"real vs FAISS mask, {label}"], s=150, facecolors="none",
                       edgecolors=line[0].get_color(), linewidths=1.5)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("FAISS recall@k (share of the exact top-k found)")
        ax.set_title(f"{label}: real mask / FAISS mask − 1 (real score)")
    axes[0].set_ylabel("relative perplexity difference (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Approximate vs exact neighbours as the search gets more exact (ringed: the paper's probed fraction)",
                 fontsize=10)
    out = save_figure(fig, paths)
    plt.close(fig)
    return out


def table(job: Job) -> dict:
    """Table and figure 'probe_sweep': every sweep point's settings (inputs 'settings') as point() rows; above 0 the
    FAISS mask wins (the paper's finding)."""
    cfg = job.cfg
    jsons = [read_checked_json(p, "settings") for p in job.paths("settings")]
    k, frac = cfg["knn"]["k"], cfg["index"]["probe_fraction"]
    df = sweep_rows(jsons, frac, k)
    figure(df, job.paths("fig"))
    out = df[[c for c in df.columns if not c.startswith("_")]]
    s0 = jsons[0]
    cap = (f"Approximation strength ({cfg['name']}; Xu et al. 2023, Sec. 5, Table 3 and Figure 4): each store "
           f"searched with several nprobe (the same IVFPQ index; rows without '-np' use 'index.nprobe'), "
           f"{s0['key_type']}/{s0['metric'].upper()}, k = {k}, on the {s0['scope']}. 'real vs FAISS mask' = perplexity "
           f"of the real (exact) mask / the FAISS mask − 1, both with real scores, at τ = 1 and at each side's τ tuned "
           f"on valid (λ tuned on valid): above 0 the approximate neighbours win, as in the paper. 'paper's fraction': "
           f"nprobe / lists = {frac:g} (the paper's 32 of 4,096); '≥ k keys probed': the probed lists hold at least k "
           f"keys per query on average (else faiss widens the probe for the queries it cannot fill, and the point "
           f"is stronger than it says). FAISS recall@k: the share of the exact top-k the search found. "
           f"{settings_ci_caption(jsons, cfg['stats'])}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(out, job.path("csv"), job.path("md"), "Approximation strength: FAISS mask vs real mask by recall@k",
                cap, note=lm_training_label(job))
    test = df[df["split"] == "test"]
    metrics = {f"recall_{r['store']}": r["recall@k"] for _, r in test.iterrows()}
    return {"metrics": metrics, "artifacts": [job.path("csv"), job.path("md")]}
