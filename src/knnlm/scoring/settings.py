"""The mask/score settings of a store (Xu et al. 2023, Sec. 5, Table 3) and the rows and comparisons built from them.

A store's settings JSON (knnlm.experiments.retrieval.settings) scores three settings at the config τ and at each
setting's τ tuned on valid (' τ*'):
  faiss_mask_faiss_score -- IVFPQ neighbours, IVFPQ (approximate) distances      (the usual kNN-LM)
  faiss_mask_real_score  -- IVFPQ neighbours, distances recomputed in fp32 from the keys
  real_mask_real_score   -- exact top-k neighbours (knnlm.search.exact), exact distances
This module is the vocabulary every table, figure and finding of them shares; it reads no file.
"""
from __future__ import annotations

from ..io import ArtifactError
from ..statistics.captions import ci_caption, fmt_ci
from ..statistics.intervals import compare
from ..statistics.documents import scheme_label
from .results import METRIC_NAME, result_row


SETTINGS = ("faiss_mask_faiss_score", "faiss_mask_real_score", "real_mask_real_score")


FAISS_FAISS, FAISS_REAL, REAL_REAL = SETTINGS
SETTING_LABEL = {"faiss_mask_faiss_score": ("FAISS", "FAISS"), "faiss_mask_real_score": ("FAISS", "real"),
                 "real_mask_real_score": ("real", "real")}


TUNED = " τ*"  # suffix of a setting at its τ tuned on valid (λ re-tuned), e.g. "real_mask_real_score τ*"


def _pairs(suffix: str = "") -> list[tuple[str, str]]:
    """The comparisons of Sec. 5 within one store at one temperature, as (a, b): a / b − 1 of per-word perplexity."""
    return [(st + suffix, "base") for st in SETTINGS] + [
        ("faiss_mask_real_score" + suffix, "faiss_mask_faiss_score" + suffix),  # real vs FAISS score (FAISS mask)
        ("real_mask_real_score" + suffix, "faiss_mask_real_score" + suffix),  # real vs FAISS mask (real score)
        ("real_mask_real_score" + suffix, "faiss_mask_faiss_score" + suffix)]  # exact vs approximate retrieval


# Every comparison of a store's settings: at the config τ (the paper's Table 3, τ = 1), at each setting's tuned τ
# (Sec. 5.2: "even at the optimal temperature ..."), and tuned τ vs the config τ per setting (Figure 5).
SETTING_PAIRS = _pairs() + _pairs(TUNED) + [(st + TUNED, st) for st in SETTINGS]


def tau_edges(s: dict) -> dict[str, str]:
    """{'<setting> τ*': "<setting> τ*: τ* = 30 on the grid's upper edge"} of each setting of a settings JSON whose τ
    tuned on valid sat on its grid's edge (knnlm.config.tau_edge): the flags of its comparison rows
    (knnlm.statistics.captions.flag_edges)."""
    return {n + TUNED: f"{n}{TUNED}: τ* = {v['tau']:g} on the grid's {v['tau_edge']} edge"
            for n, v in (s.get("tuned") or {}).items() if v.get("tau_edge")}


def check_same_scope(a: dict, b: dict, split: str) -> None:
    """Check that two stores' settings JSONs were scored on the same documents and tokens of `split` (their 'doc_ids'
    and 'token_digest', knnlm.experiments.retrieval.scope_digest), so their per-document NLL pair up. Raises
    ArtifactError naming both stores otherwise."""
    if a["doc_ids"][split] != b["doc_ids"][split]:
        raise ArtifactError(f"store {a['store']} and {b['store']} were scored on different {split} documents")
    da, db = (s.get("token_digest", {}).get(split) for s in (a, b))
    if da != db:
        raise ArtifactError(f"store {a['store']} and {b['store']} were scored on different {split} tokens of the same "
                            f"documents (token digests {da} and {db}): rerun their settings jobs")


def store_vs_store(a: dict, b: dict, split: str, setting: str, stats: dict) -> dict:
    """Paired relative difference of `setting` (a name of the settings JSONs' doc_nll, e.g. 'faiss_mask_faiss_score'
    or its ' τ*' twin) between two stores' settings JSONs `a` and `b` on `split`: {'value', 'lo', 'hi', 'verdict'}
    of ppl_a / ppl_b − 1 from the per-document NLL of both (knnlm.statistics.intervals.compare, config section `stats`).
    Raises ArtifactError when the two were scored on different documents or on different tokens of them (their
    'token_digest', knnlm.experiments.retrieval.scope_digest)."""
    check_same_scope(a, b, split)
    scheme = a.get("documents_scheme", {}).get("scheme", "")
    return compare([a["doc_nll"][split][setting], b["doc_nll"][split][setting]], a["doc_words"][split], ["a", "b"],
                   [("a", "b")], stats, scheme=scheme)["diff"]["a vs b"]


def settings_rows(settings_jsons: list[dict], labels=lambda s: {}, reference: str | None = None,
                  stats: dict | None = None) -> list[dict]:
    """Rows (split, h_ds, ⊗, *labels(s), mask, score, λ, interp PPL (word), interp PPL (token), oracle PPL (word),
    base PPL (word), CI low, CI high, documents, recall@k, keys scanned / query) of every mask/score setting in settings
    JSONs: the tables that compare stores. With `reference` (a store, e.g. 'full'): also each row's paired relative
    difference to the same setting in the reference store, with its CI and verdict (knnlm.statistics.intervals, config
    section `stats`: 'lower' / 'higher' when the CI of this store / reference − 1 lies below / above 0), from the
    per-document NLL of both stores on the same scope; the reference's own rows say '-'.
    """
    keep = ("λ", "interp PPL (word)", "interp PPL (token)", "oracle PPL (word)")
    ref = {(s["key_type"], s["metric"]): s for s in settings_jsons if s["store"] == reference}
    rows = []
    for s in settings_jsons:
        for split in ("test", "valid"):
            for setting in SETTINGS:
                mask, score = SETTING_LABEL[setting]
                lab = {"h_ds": s["key_type"], "⊗": METRIC_NAME[s["metric"]], **labels(s), "mask": mask, "score": score}
                r = result_row(split, lab, s["settings"][setting])
                ci = s["ci"][split]["ppl"][setting]
                row = {"split": split, **lab, **{k: r[k] for k in keep}, "base PPL (word)": s["base"][split]["ppl_word"],
                       "CI low": ci["lo"], "CI high": ci["hi"], "documents": len(s["doc_ids"][split]),
                       "recall@k": s["recall"][split],
                       "keys scanned / query": s.get("scan", {}).get(split, {}).get("keys_scanned_per_query"),
                       "missing neighbours": s.get("scan", {}).get(split, {}).get("missing_neighbours")}
                if reference and s["store"] == reference:  # the reference itself: nothing to compare
                    row.update({f"vs {reference} (95% CI)": "-", "verdict": "-"})
                elif reference:
                    d = store_vs_store(s, ref[(s["key_type"], s["metric"])], split, setting, stats)
                    row.update({f"vs {reference} (95% CI)": fmt_ci(d, pct=True), "verdict": d["verdict"]})
                rows.append(row)
    return rows


def settings_ci_caption(jsons: list[dict], stats: dict) -> str:
    """The CI sentence of a table of settings JSONs: method, documents scheme and the documents scored per split
    (of the whole split's), via knnlm.statistics.captions.ci_caption."""
    s = jsons[0]
    sch = s.get("documents_scheme", {"scheme": stats["documents"], "block_tokens": {}, "split_documents": {}})
    counts = {sp: len(ids) for sp, ids in s["doc_ids"].items()}
    label = scheme_label(sch, counts)
    if sch["split_documents"] and counts != sch["split_documents"]:
        label += " (of " + ", ".join(f"{n} {sp}" for sp, n in sch["split_documents"].items()) + " in the splits)"
    return ci_caption(stats, label)
