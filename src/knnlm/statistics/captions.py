"""Captions and rows: how a table says what its intervals are and on which documents they rest."""
from __future__ import annotations

from .intervals import INTERVALS, options
from .verdicts import verdict


def ci_caption(stats: dict | None, documents: str = "") -> str:
    """How a table's CIs were computed, for captions: the level, the interval method, the documents (`documents`:
    e.g. 'WikiText articles: 60 test, 60 valid') and the minimum for a verdict."""
    st = options(stats)
    how = INTERVALS[st["interval"]].caption.format(**st)
    docs = f"; documents: {documents}" if documents else ""
    return (f"{100 * st['level']:g}% CI, paired over documents ({how}{docs}); a comparison whose "
            f"documents count fewer than {st['min_documents']} as the interval counts them (Kish's effective number, "
            f"n_eff) is inconclusive whatever its CI")


def comparison_rows(result: dict, **labels) -> list[dict]:
    """Rows (labels, comparison, relative difference, CI low, CI high, verdict, documents, effective documents) of a
    compare() result: its differences, then its shares of a gain ('share of the gain: a of b', the share in 'relative
    difference', verdict '-': a share is tested against a claim's band, not against 0)."""
    rows = [{**labels, "comparison": k, "relative difference": v["value"], "CI low": v["lo"], "CI high": v["hi"],
             "verdict": v["verdict"], "documents": v.get("documents", result.get("documents")),
             "effective documents": v.get("effective", result.get("effective"))}
            for k, v in result["diff"].items()]
    return rows + [{**labels, "comparison": f"share of the gain: {k}", "relative difference": v["value"],
                    "CI low": v["lo"], "CI high": v["hi"], "verdict": "-", "documents": v["documents"],
                    "effective documents": v.get("effective")} for k, v in result.get("share", {}).items()]


def fmt_ci(v: dict, pct: bool = False) -> str:
    """'219.49 [217.10, 221.95]' or, for relative differences, '−7.9 % [−8.6, −7.2]'."""
    if pct:
        return f"{100 * v['value']:+.1f} % [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]"
    return f"{v['value']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]"


# Column 'n_eff of' of a comparison row whose effective number of documents is that of its design (a least-squares
# slope's or correlation's leverages, knnlm.statistics.regression.regression_leverage), not of its outcome: when it is
# under 'stats.min_documents', no outcome on these documents could decide the row (the findings say so)
DESIGN_N_EFF = "the leverage of the regressor, fixed by the design"


def statistic_row(name: str, value: float, lo: float, hi: float, documents: int, min_documents: int,
                  effective: float | None = None, scheme: str = "", **labels) -> dict:
    """A comparison row (the columns of comparison_rows) for a statistic that is not a relative difference (a slope,
    a correlation): 'relative difference' holds the statistic, its verdict says whether the CI excludes 0 (with at
    least `min_documents` effective documents, see verdict)."""
    return {**labels, "comparison": name, "relative difference": float(value), "CI low": float(lo),
            "CI high": float(hi), "verdict": verdict(lo, hi, documents, min_documents, effective, scheme),
            "documents": int(documents), "effective documents": effective}


def contrast_row(nll: list, words, fn, stats: dict, scheme: str, split: str, name: str, **labels) -> dict:
    """One comparison row (split, comparison `name`, relative difference, CI low, CI high, verdict, documents,
    effective documents, `labels`) of a contrast of perplexities: statistic `fn`, mapping perplexities [..., S] to
    [...] (e.g. a difference of two relative differences, p1 / p0 − p3 / p2), of the per-document NLL `nll` (S arrays
    [D], nats, the same documents and tokens; `words` [D] words per document), with its paired interval over the
    documents (knnlm.statistics.intervals.estimate on the linear scale, config section `stats`) and its verdict
    ('lower' / 'higher' when the CI lies below / above 0, see verdict). Raises ValueError for fewer than 2
    documents."""
    import numpy as np

    from .intervals import effective_documents, estimate, options

    st = options(stats)
    w = np.asarray(words, dtype=np.float64)
    v, lo, hi = estimate(lambda p: np.asarray(fn(p))[..., None], np.asarray(nll, dtype=np.float64), w, st, "linear")
    return {**labels, "split": split, "comparison": name, "relative difference": float(v[0]), "CI low": float(lo[0]),
            "CI high": float(hi[0]), "verdict": verdict(lo[0], hi[0], len(w), st["min_documents"],
                                                        effective_documents(w), scheme),
            "documents": len(w), "effective documents": effective_documents(w)}


def flag_edges(rows: list[dict], edges: dict[str, str]) -> list[dict]:
    """Add to each comparison row's 'flag' (comparison_rows; joined with one it has) the edges of the tuned values its
    sides rest on: `edges` {a row name: e.g. "att/L2 τ*: τ* = 30 on the grid's upper edge"}, the sides being those of
    'a vs b' and of 'share of the gain: a of b'. A tuned value on its grid's edge may not be the optimum the claim
    needs (Xu et al. 2023, Sec. 5.2: τ tuned). Returns `rows`, changed in place."""
    import re

    for r in rows:
        sides = re.split(r" vs | of ", str(r["comparison"]).removeprefix("share of the gain: "))
        found = [edges[x] for x in sides if x in edges]
        r["flag"] = "; ".join(x for x in [r.get("flag") or ""] + found if x)
    return rows
