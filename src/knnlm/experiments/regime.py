"""The regime map: how each finding of Xu et al. (2023) moves as this run approaches the paper's regime.

The paper's numbers come from a 268M-parameter LM (per-word test perplexity 21.75), a datastore of ≈ 5,000 rows per
vocabulary entry and a FAISS search that scans ≈ 1,170·k keys per query (claims.yaml 'regime'). A small run is far
from that on every axis, so its verdicts alone cannot tell "the paper is wrong" from "our scale differs". The map
measures each effect (claims.yaml 'regime_effects': the kNN-LM's gain, att vs ffn keys and ffn's share of att's gain,
FAISS vs real score and mask, the gain of tuning τ, IP vs L2) at several points of each axis of one run:

  lm     the base LMs of config 'regime.lms' (each its own datastore of the same training text; every LM scores the
         same test tokens), axis = the base LM's per-word perplexity on the test scope;
  store  the datastore subsets of config 'regime.ratios' (Figure 2's stores, each at its own probe count), axis =
         rows per vocabulary entry;
  scan   the full store searched with each nprobe of config 'regime.nprobe' (and 'index.nprobe'), axis = the keys
         the FAISS search scans per query as a multiple of k, with its recall@k.

Every point of an axis is scored on the same test (and valid) documents and tokens, each side of every effect tuned
alike (λ, and τ for the τ* rows, on valid; knnlm.experiments.retrieval.settings), so points are paired; the trend of
an effect is its least-squares slope against the log of the axis, oriented toward the paper's regime, with the
delete-one-document jackknife interval (knnlm.statistics.trend), and its verdict says 'toward' / 'away' / 'flat' and
whether the point nearest the paper's regime 'reaches' the paper's value. No extrapolation is claimed.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import ArtifactError, atomic_path, read_checked_json, write_json
from ..job import Job
from ..report.figures import pyplot, save_figure
from ..report.tables import write_table
from ..scoring.settings import TUNED, check_same_scope
from ..statistics.captions import fmt_ci
from ..statistics.intervals import options
from ..statistics.trend import nearest_point, oriented_log, trend, trend_verdict
from .common import lm_training_label
from .findings import CLAIMS_FILE, REGIME, claims_document, vocabulary_size

AXES = ("lm", "store", "scan")
AXIS_POINT = {"lm": "base LM", "store": "store", "scan": "store"}  # what names a point of each axis
TEMPERATURES = {"1": "τ = 1", "tuned": "τ*", "own": "τ* vs τ = 1"}


def load_effects(path: str | Path = CLAIMS_FILE) -> list[dict]:
    """The effects of the claims table's 'regime_effects' (claims.yaml documents the fields), each with its
    'paper_value' (a / b − 1 of the paper's perplexities [a, b], or the number given), 'kind' ('ratio' / 'share') and
    'temperatures' filled in. Raises ValueError naming the file and the effect for an unknown or missing field, a
    duplicate id, a kind or temperature the map does not know, or an effect without the paper's value."""
    out, seen = [], set()
    for n, entry in enumerate(claims_document(Path(path)).get("regime_effects") or []):
        where = f"{path}: regime effect {entry.get('id', n)!r}"
        if entry["id"] in seen:
            raise ValueError(f"{where}: expected a unique 'id', found {entry['id']!r} twice")
        seen.add(entry["id"])
        e = {"kind": "ratio", "temperatures": ["1", "tuned"], "stand_in": "", "claims": [], **entry}
        e["temperatures"] = [str(t) for t in e["temperatures"]]
        if "paper_value" not in e:  # the schema requires one of the two
            e["paper_value"] = e["paper"][0] / e["paper"][1] - 1
        out.append(e)
    return out


EFFECTS = load_effects()


def variant_label(key: str, metric: str) -> str:
    """'<key>/<metric>': how an effect names a (key, metric) variant of the map's stores."""
    return f"{key}/{metric}"


def setting_names(effect: dict, temperature: str, main: str) -> tuple[str, str]:
    """The two sides of `effect` at `temperature` as '<variant>:<setting>' (the main variant `main` where the effect
    names none): τ* appended to every kNN-LM side for 'tuned'; 'own' and '1' keep the names as written."""
    def full(s: str) -> str:
        v, _, name = s.rpartition(":")
        name = name.strip()
        if temperature == "tuned" and name != "base":
            name += TUNED
        return f"{v or main}:{name}"

    return full(effect["a"]), full(effect["b"])


def point_settings(paths: list[str], points: list[str], variants: list[str]) -> list[dict[str, dict]]:
    """The settings JSONs of an axis' inputs `paths`, ordered point-major (every variant of point 0, then of point
    1, ...), as one {variant: JSON} per point. Raises ArtifactError when their number does not match."""
    if len(paths) != len(points) * len(variants):
        raise ArtifactError(f"expected {len(points)} points × {len(variants)} variants of settings JSONs, found "
                            f"{len(paths)}")
    it = iter(paths)
    return [{v: read_checked_json(next(it), "settings") for v in variants} for _ in points]


def axis_value(axis: str, s: dict, k: int, vocab: int) -> float:
    """A point's value on `axis` from its (main variant's) settings JSON `s`: 'lm' the base LM's per-word perplexity on
    the test scope, 'store' the store's rows per vocabulary entry (vocab entries), 'scan' the keys its test search
    scanned per query over k."""
    if axis == "lm":
        return float(math.exp(sum(s["doc_nll"]["test"]["base"]) / sum(s["doc_words"]["test"])))
    if axis == "store":
        return float(s["size"]) / vocab
    keys = ((s.get("scan") or {}).get("test") or {}).get("keys_scanned_per_query")
    if not keys:
        raise ArtifactError(f"store {s['store']}: its settings JSON records no keys scanned per query (its FAISS "
                            f"search's meta): rerun its settings job")
    return float(keys) / k


def stacked(points: list[dict[str, dict]], split: str, names: list[str]) -> tuple[np.ndarray, np.ndarray, list]:
    """(doc_nll [J * len(names), D], doc_words [D], document ids) of every point's settings `names`
    ('<variant>:<setting>') on `split`, point-major. Raises ArtifactError when two JSONs were scored on different
    documents or tokens (knnlm.scoring.settings.check_same_scope) or a JSON lacks a setting."""
    first = points[0][next(iter(points[0]))]
    rows = []
    for p in points:
        for name in names:
            v, _, setting = name.partition(":")
            s = p[v]
            check_same_scope(first, s, split)
            if setting not in s["doc_nll"][split]:
                raise ArtifactError(f"store {s['store']} ({s['key_type']}/{s['metric']}): its settings JSON has no "
                                    f"setting {setting!r} on {split} (has {sorted(s['doc_nll'][split])})")
            rows.append(s["doc_nll"][split][setting])
    return np.asarray(rows, dtype=np.float64), np.asarray(first["doc_words"][split], dtype=np.float64), \
        first["doc_ids"][split]


def effect_statistic(kind: str, n_points: int, names: list[str], a: str, b: str):
    """(statistic, scale) for knnlm.statistics.trend.trend: perplexities [..., J * len(names)] (stacked's order) to
    the effect at every point [..., J]: ppl_a / ppl_b − 1 ('ratio', log-scale intervals) or (ppl_base − ppl_a) /
    (ppl_base − ppl_b) ('share', linear), base = the main variant's 'base' (the same base LM for every variant)."""
    m = len(names)
    ia = np.array([j * m + names.index(a) for j in range(n_points)])
    ib = np.array([j * m + names.index(b) for j in range(n_points)])
    if kind == "ratio":
        return (lambda p: p[..., ia] / p[..., ib]), "log"
    iz = np.array([j * m + names.index(next(n for n in names if n.endswith(":base"))) for j in range(n_points)])
    return (lambda p: (p[..., iz] - p[..., ia]) / (p[..., iz] - p[..., ib])), "linear"


def axis_trends(axis: str, points: list[dict[str, dict]], labels: list[str], main: str, cfg: dict,
                vocab: int, regime: dict, effects: list[dict] = EFFECTS) -> tuple[list[dict], list[dict]]:
    """(point rows, trend rows) of one axis: every effect of `effects` whose variants the points have, at each of
    its temperatures, on test (its verdicts) and valid; points labelled `labels` (LM or store names)."""
    st = options(cfg["stats"])
    k = cfg["knn"]["k"]
    mains = [p[main] for p in points]
    x_axis = np.array([axis_value(axis, s, k, vocab) for s in mains])
    paper_axis = float(regime[axis]["paper"])
    x, direction = oriented_log(x_axis, paper_axis)
    near, factor = nearest_point(x_axis, paper_axis)
    scheme = mains[0].get("documents_scheme", {}).get("scheme", "")
    have = set(points[0])
    point_rows, trend_rows = [], []
    for e in effects:
        for temp in e["temperatures"]:
            a, b = setting_names(e, temp, main)
            need = {a.partition(":")[0], b.partition(":")[0]}
            base_row = {"axis": axis, "effect": e["id"], "temperature": TEMPERATURES[temp],
                        "paper's value (%)": 100 * e["paper_value"]}
            if not need <= have:
                trend_rows.append({**base_row, "split": "test", "trend": f"not run (variants {sorted(need - have)} "
                                   f"not in config 'regime.variants')"})
                continue
            names = sorted({a, b, f"{main}:base"})
            for split in ("test", "valid"):
                doc_nll, words, _ = stacked(points, split, names)
                fn, scale = effect_statistic(e["kind"], len(points), names, a, b)
                r = trend(fn, doc_nll, words, x, st, scale)
                shift = 1.0 if e["kind"] == "ratio" else 0.0  # a ratio's points shown as a / b − 1
                pts = [{k_: v - shift for k_, v in q.items()} for q in r["points"]]
                for j, q in enumerate(pts):
                    s = mains[j]
                    scan = (s.get("scan") or {}).get(split) or {}
                    point_rows.append({**base_row, "split": split, "point": labels[j], "axis value": x_axis[j],
                                       "effect (%)": 100 * q["value"], "95% CI": fmt_ci(q, pct=True),
                                       "_lo": q["lo"], "_hi": q["hi"],
                                       "recall@k": (s.get("recall") or {}).get(split),
                                       "keys scanned / k": (scan.get("keys_scanned_per_query") or float("nan")) / k,
                                       "documents": str(r["documents"]), "n_eff": f"{r['effective']:.1f}"})
                v = trend_verdict(r["slope"], pts[near], e["paper_value"], r["documents"], st["min_documents"],
                                  r["effective"], scheme)
                trend_rows.append({**base_row, "split": split,
                                   "slope (pp per e-fold toward the paper)": 100 * r["slope"]["value"],
                                   "slope 95% CI": f"[{100 * r['slope']['lo']:+.2f}, {100 * r['slope']['hi']:+.2f}]",
                                   "_slope": r["slope"], "trend": v["trend"], "reaches": "yes" if v["reaches"] else "no",
                                   "withheld": v["withheld"], "nearest point": labels[near],
                                   "its effect (95% CI)": fmt_ci(pts[near], pct=True),
                                   "factor to the paper's regime": f"×{factor:,.3g}",
                                   "points": str(len(points)), "axis range": f"{x_axis.min():,.4g} to {x_axis.max():,.4g}",
                                   "orientation": "axis grows" if direction > 0 else "axis falls",
                                   "documents": str(r["documents"]), "n_eff": f"{r['effective']:.1f}",
                                   "stand-in": e["stand_in"], "paper's words": e["words"]})
    return point_rows, trend_rows


def figure(effect: dict, points: pd.DataFrame, regime: dict, paths: list[str]) -> list[str]:
    """One figure per effect: the effect (test, %) against each axis (log scale), 95 % CIs as bands, one line per
    temperature; the paper's value of the effect as a dashed line, the paper's value of the axis as a dotted one."""
    plt = pyplot()
    test = points[(points["effect"] == effect["id"]) & (points["split"] == "test")]
    axes_here = [a for a in AXES if a in set(test["axis"])]
    fig, axs = plt.subplots(1, max(1, len(axes_here)), figsize=(4.6 * max(1, len(axes_here)), 3.8), squeeze=False)
    for ax, axis in zip(axs[0], axes_here):
        for temp, g in test[test["axis"] == axis].groupby("temperature", sort=False):
            g = g.sort_values("axis value")
            line = ax.plot(g["axis value"], g["effect (%)"], "-o", label=temp)
            ax.fill_between(g["axis value"], 100 * g["_lo"], 100 * g["_hi"], alpha=0.2, color=line[0].get_color())
        ax.axhline(100 * effect["paper_value"], color="k", ls="--", lw=1, label="the paper's value")
        ax.axvline(regime[axis]["paper"], color="k", ls=":", lw=1, label="the paper's regime")
        ax.set_xscale("log")
        if axis == "lm":  # the paper's regime to the right on every axis: the perplexity falls toward it
            ax.invert_xaxis()
        ax.set_xlabel(regime[axis]["name"], fontsize=8)
        ax.axhline(0, color="grey", lw=0.5)
    axs[0][0].set_ylabel("effect on test (%, paired 95% CI)")
    axs[0][0].legend(fontsize=7)
    fig.suptitle(f"Regime map: {effect['name']}", fontsize=10)
    out = save_figure(fig, paths)
    plt.close(fig)
    return out


def regime_map(job: Job) -> dict:
    """Tables 'regime_<axis>' (each effect at each point with its CI), 'regime_trends' (every effect's slope on
    every axis with its interval and verdict) and one figure per effect (outputs 'fig_<effect id>'), from the
    settings JSONs of inputs 'lm_points', 'store_points', 'scan_points' (point-major, the variants of config
    'regime' in order: its (key_type, metric) first, then 'regime.variants') and the run's dictionary (input
    'vocabulary', for rows per vocabulary entry). An axis with fewer than 2 points is left out (its table says so)."""

    cfg, rg = job.cfg, job.cfg["regime"]
    main = variant_label(rg["key_type"], rg["metric"])
    variants = [main] + [variant_label(k, m) for k, m in rg["variants"]]
    vocab = vocabulary_size(job)
    labels = {"lm": rg["lms"], "store": rg["stores"], "scan": rg["scan_stores"]}
    all_points, all_trends, written, metrics = [], [], [], {}
    for axis in AXES:
        if len(labels[axis]) < 2:
            all_trends.append({"axis": axis, "split": "test", "trend": f"not run ({len(labels[axis])} point(s) of "
                               f"config 'regime'; a trend needs 2)"})
            continue
        pts = point_settings(job.paths(f"{axis}_points"), labels[axis], variants)
        p, t = axis_trends(axis, pts, labels[axis], main, cfg, vocab, REGIME)
        all_points += p
        all_trends += t
    points = pd.DataFrame(all_points)
    trends = pd.DataFrame(all_trends)
    note = lm_training_label(job)
    common = (f"{cfg['name']}; each point scored on the same documents and tokens, each side tuned alike (λ on valid; "
              f"τ* on valid), k = {cfg['knn']['k']}, {main} unless the effect names another (key, metric). Effect = "
              f"per-word perplexity a / b − 1 (a share: (base − a) / (base − b)), 95% CI paired over documents "
              f"(delete-one-document jackknife).")
    for axis in AXES:
        sub = points[points["axis"] == axis] if len(points) else points
        if sub.empty:
            continue
        write_table(sub[[c for c in sub.columns if not c.startswith("_")]].drop(columns=["axis"]),
                    job.path(f"{axis}_csv"), job.path(f"{axis}_md"),
                    f"Regime map, {REGIME[axis]['name']}: every effect at every point",
                    f"The effects of claims.yaml 'regime_effects' along '{REGIME[axis]['name']}' (the paper: "
                    f"{REGIME[axis]['paper']:,g}; {REGIME[axis]['source']}). {common}", note=note)
        written += [str(job.path(f"{axis}_csv")), str(job.path(f"{axis}_md"))]
    for axis in AXES:  # a table per axis is an output whatever the run measured: an empty one says why
        if not Path(job.path(f"{axis}_csv")).exists():
            empty = pd.DataFrame([{"split": "test", "axis": axis, "note": "not run: fewer than 2 points"}])
            write_table(empty, job.path(f"{axis}_csv"), job.path(f"{axis}_md"), f"Regime map: {axis}", "not run", note)
    shown = trends.drop(columns=[c for c in trends.columns if c.startswith("_")])
    write_table(shown, job.path("trends_csv"), job.path("trends_md"), "Regime map: which way each effect moves",
                f"Trends ({common}) The slope of each effect against the natural log of the axis, oriented so that it "
                f"grows toward the paper's regime (the base LM's perplexity falls; rows per vocabulary entry and keys "
                f"scanned grow), in percentage points per e-fold, with its 95% CI (the same jackknife: every point "
                f"leaves the same document out). trend: 'toward' the paper's value when the CI excludes 0 with the "
                f"sign of (the paper's value − the effect at the nearest point), 'away' with the other sign, 'flat' "
                f"when it includes 0; 'inconclusive (...)' when the documents are too few as the interval counts them "
                f"('withheld' shows what it would have said). reaches: the nearest point's CI holds the paper's "
                f"value. The factor: how far the nearest point still is from the paper's value of the axis. Only the "
                f"direction is claimed, no extrapolation.", note=note)
    written += [str(job.path("trends_csv")), str(job.path("trends_md"))]
    write_json(job.path("trends_json"), {"trends": [{k: v for k, v in r.items() if not k.startswith("_")}
                                                    | ({"slope": r["_slope"]} if "_slope" in r else {})
                                                    for r in all_trends],
                                         "effects": [{k: e[k] for k in ("id", "name", "paper_value", "claims")}
                                                     for e in EFFECTS]})
    written.append(str(job.path("trends_json")))
    for e in EFFECTS:
        paths = job.paths(f"fig_{e['id']}")
        if len(points) and not points[points["effect"] == e["id"]].empty:
            written += figure(e, points, REGIME, paths)
        else:  # an effect the run did not measure still gets its figure, saying so
            plt = pyplot()
            fig, ax = plt.subplots(figsize=(4, 2))
            ax.text(0.5, 0.5, f"{e['name']}:\nnot run (config 'regime')", ha="center", va="center", fontsize=8)
            ax.axis("off")
            written += save_figure(fig, paths)
            plt.close(fig)
    for r in all_trends:
        if "_slope" in r and r["split"] == "test":
            metrics[f"slope_{r['axis']}_{r['effect']}_{'tuned' if r['temperature'] != 'τ = 1' else 'tau1'}"] = \
                r["_slope"]["value"]
    counts = trends[trends["split"] == "test"]["trend"].value_counts().to_dict() if len(trends) else {}
    return {"metrics": metrics, "params": {f"trends_{k}": v for k, v in counts.items()}, "artifacts": written}


def claim_temperature(effect: dict, comparison: str) -> str:
    """Which of `effect`'s trends a findings row of comparison `comparison` sits beside: the effect's one temperature
    when it has one (the gain of tuning τ), else 'τ*' when the row compares at τ* (its comparison names τ*), else
    'τ = 1'."""
    if len(effect["temperatures"]) == 1:
        return TEMPERATURES[effect["temperatures"][0]]
    return TEMPERATURES["tuned" if TUNED.strip() in comparison else "1"]


def trend_text(t: dict | None) -> str:
    """A trend row of the trends JSON as one cell: 'toward (reaches) slope +1.23 pp/e-fold [+0.40, +2.05]; nearest
    point <name> ×<factor> from the paper's regime', or why there is none."""
    if t is None:
        return "not measured"
    if "slope" not in t:
        return t["trend"]
    s, factor = t["slope"], t["factor to the paper's regime"]
    head = t["trend"] + (" (reaches)" if t.get("reaches") == "yes" else "")
    if t.get("withheld"):
        head += f"; withheld: {t['withheld']}"
    return (f"{head}: slope {100 * s['value']:+.2f} pp/e-fold [{100 * s['lo']:+.2f}, {100 * s['hi']:+.2f}]; nearest "
            f"point {t['nearest point']} {factor} from the paper's regime")


def trend_kind(t: dict | None) -> str:
    """The trend's verdict word for the counts: toward / away / flat / rising / falling, 'inconclusive' (documents
    too few), 'not run' (the map has no such trend: see its row) or 'not measured' (no trend row at all)."""
    if t is None:
        return "not measured"
    if "slope" not in t:  # the map did not run it (its variants are not configured, or too few points)
        return t["trend"].split(" (")[0] if t.get("trend", "").startswith("not run") else "not measured"
    return t["trend"].split(" (")[0]


def findings_trends(job: Job) -> dict:
    """The findings rows that an effect of the regime map follows (claims.yaml 'regime_effects' 'claims'), each with
    its own verdict and, beside it, the effect's trend on every axis toward the paper's regime (test split; τ = 1 or τ*
    as the row compares), and a summary that counts the rows' verdicts by trend on each axis. Inputs 'findings_rows'
    (the findings job's JSON) and 'trends' (regime_map's JSON); outputs 'csv' and 'md'. Raises ArtifactError when an
    effect names a claim the findings have no row of (a claims.yaml entry without a row is a defect)."""
    found = read_checked_json(job.path("findings_rows"), "findings_rows")["rows"]
    trends = read_checked_json(job.path("trends"), "regime_trends")["trends"]
    by_key = {(t["axis"], t["effect"], t.get("temperature"), t["split"]): t for t in trends if "effect" in t}
    by_axis = {t["axis"]: t for t in trends if "effect" not in t and t["split"] == "test"}  # an axis not run
    ids = {r["claim id"] for r in found}
    rows, counts = [], {}
    for e in EFFECTS:
        missing = sorted(set(e["claims"]) - ids)
        if missing:
            raise ArtifactError(f"{job.path('findings_rows')}: regime effect {e['id']!r} names claims {missing} of "
                                f"{CLAIMS_FILE}, which have no findings row")
        for r in (r for r in found if r["claim id"] in e["claims"]):
            temp = claim_temperature(e, r["comparison (a vs b)"])
            verdict = r["verdict"].split(" (")[0]
            row = {"split": "test", "section": r["section"], "claim": r["claim"], "claim id": r["claim id"],
                   "comparison (a vs b)": r["comparison (a vs b)"], "ours (test, 95% CI)": r["ours (test, 95% CI)"],
                   "verdict": r["verdict"], "effect followed": f"{e['name']} ({temp})"}
            for axis in AXES:
                t = by_key.get((axis, e["id"], temp, "test"), by_axis.get(axis))
                row[f"trend: {REGIME[axis]['name']}"] = trend_text(t)
                key = (axis, verdict, trend_kind(t))
                counts[key] = counts.get(key, 0) + 1
            rows.append(row)
    table = pd.DataFrame(rows)
    summary = pd.DataFrame([{"split": "test", "axis": REGIME[a]["name"], "verdict": v, "trend": t, "rows": n}
                            for (a, v, t), n in sorted(counts.items())])
    cols = list(table.columns) if len(table) else ["split", "claim id", "verdict"]
    with atomic_path(job.path("csv")) as tmp:
        table.reindex(columns=cols).to_csv(tmp, index=False)
    text = [f"# Findings beside their trends ({job.cfg['name']})\n\n",
            "Each findings row that an effect of the regime map follows (claims.yaml 'regime_effects'), its own verdict "
            "(measured where this run stands) and, beside it, which way that effect moves along each regime axis as "
            "the run approaches the paper's regime: the slope of the effect against the log of the axis with its "
            "paired 95% CI over documents (test), 'toward' / 'away' from the paper's value or 'flat', '(reaches)' "
            "where the point nearest the paper's regime holds the paper's value, and how far that point still is. "
            "Only the direction is claimed, no extrapolation; the regime map's tables give every point.\n\n",
            "Summary: the rows' verdicts counted by trend on each axis.\n\n",
            (summary.drop(columns=["split"]).to_markdown(index=False) if len(summary) else "no row followed") + "\n\n",
            (table.drop(columns=["split"]).to_markdown(index=False) if len(table) else "") + "\n"]
    with atomic_path(job.path("md")) as tmp:
        tmp.write_text("".join(text))
    metrics = {f"n_{a}_{t}": sum(n for (a_, _, t_), n in counts.items() if a_ == a and t_ == t)
               for a in AXES for t in {k[2] for k in counts}}
    return {"metrics": {k.replace(" ", "_"): v for k, v in metrics.items()},
            "artifacts": [str(job.path("csv")), str(job.path("md"))]}
