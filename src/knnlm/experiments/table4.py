"""Table 4 (Xu et al. 2023, App. A): kNN-LM applied to base LMs of different strength.

The paper applies the Sec. 3 kNN-LM to DistilGPT2 and GPT-2 small/medium/large and finds the gain shrinks as
the base LM gets stronger. Here every base LM of config 'lms' gets the same kNN-LM (its own datastore, full
store, FAISS mask + score, key type and metric of config 'table4', λ tuned on valid; also with τ tuned on
valid), and each gain carries a paired 95 % CI over documents. When every LM's documents
are the same (text-defined documents: 'wikitext' or 'blank_lines'), the gains of LMs are also compared with
each other on the same resamples: "the stronger LM gains less" is a verdict, not a reading of two numbers.

Job: table4.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..job import Job
from ..config import table4_lms
from ..io import load_checkpoint, read_checked_json, read_json
from ..scoring.results import METRIC_NAME
from ..scoring.interpolation import interpolate
from ..statistics.captions import ci_caption, comparison_rows, contrast_row, fmt_ci
from ..statistics.intervals import compare, effective_documents, estimate, per_document
from ..statistics.verdicts import verdict
from .common import lm_training_label

log = logging.getLogger(__name__)


def lm_summary(path: str | Path) -> dict:
    """What Table 4 says of a base LM: {'parameters': int, 'training': str}. Parameters: from a Hugging Face model
    card (.json) or a fairseq checkpoint's state dict (tensors that share storage, e.g. tied input/output
    embeddings, counted once).

    For a fairseq checkpoint, 'training' is its convergence as fairseq saved it: updates, epochs, and the best
    valid loss as a per-token perplexity (2 ** loss, fairseq's base-2 loss over its own BPE tokens); the whole
    valid curve is the MLflow run of its train_lm job. For a Hugging Face model card: "pretrained".
    Raises KeyError when a checkpoint lacks fairseq's 'model' state."""
    import torch

    path = Path(path)
    if path.suffix == ".json":
        return {"parameters": int(read_json(path)["parameters"]), "training": "pretrained"}
    ckpt = load_checkpoint(path)
    seen, total = set(), 0
    for t in ckpt["model"].values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel()
    extra = ckpt.get("extra_state") or {}
    history = ckpt.get("optimizer_history") or [{}]
    updates, best = history[-1].get("num_updates"), extra.get("best")
    epoch = (extra.get("train_iterator") or {}).get("epoch")
    training = f"{updates} updates" + (f", epoch {epoch}" if epoch is not None else "")
    if best is not None:  # fairseq's own validation (blocks without the context window), not the eval's perplexity
        training += f", best valid PPL/token {2 ** best:.1f} (fairseq's validation)"
    return {"parameters": total, "training": training}


def _lm_nll(job: Job, split: str, i: int, score: dict) -> np.ndarray:
    """[3, T] per-token NLL of LM i on `split`: base, kNN-LM (config τ), kNN-LM (τ tuned)."""
    lm = np.load(job.paths(f"lm_logprobs_{split}")[i]).astype(np.float64)
    knn = np.load(job.paths(f"knn_{split}")[i]).astype(np.float64)
    tuned = np.load(job.paths(f"tuned_{split}")[i]).astype(np.float64)
    return -np.stack([lm, interpolate(lm, knn, score["lambda"]), interpolate(lm, tuned, score["tuned"]["lambda"])])


def table4(job: Job) -> dict:
    """Table 4 as CSV + Markdown: per base LM its parameters, base PPL, kNN-LM PPL (config τ and τ tuned), the
    absolute gain and the relative gain with 95 % CIs; then the pairwise comparisons of relative gains across
    LMs when their documents coincide."""
    import pandas as pd

    from ..report.tables import write_csv, write_table

    cfg, st, t4 = job.cfg, job.cfg["stats"], job.cfg["table4"]
    names = table4_lms(cfg)  # config 'table4.lms'; the LMs trained from another one are App. E.6's
    scores = [read_checked_json(p, "score") for p in job.paths("scores")]
    summaries = [lm_summary(p) for p in job.paths("models")]
    rows, m, cross, cmp_rows, boots_of = [], {}, [], [], {}
    for split in ("test", "valid"):
        docs = [np.load(p) for p in job.paths(f"documents_{split}")]
        boots = boots_of[split] = []
        for i, name in enumerate(names):
            d = docs[i]
            n_docs = int(d["doc"].max()) + 1
            doc_words = np.bincount(d["doc"], weights=d["words"], minlength=n_docs)
            doc_nll = per_document(_lm_nll(job, split, i, scores[i]), d["doc"], n_docs)
            c = compare(doc_nll, doc_words, ["base", "knn", "tuned"],
                        [("knn", "base"), ("tuned", "base"), ("tuned", "knn")], st)
            boots.append((doc_nll, doc_words))
            named = {"knn": f"kNN-LM ({name})", "tuned": f"kNN-LM ({name}) τ*", "base": f"base LM ({name})"}
            cmp_rows += [{**r, "comparison": " vs ".join(named[x] for x in r["comparison"].split(" vs "))}
                         for r in comparison_rows(c, split=split)]
            b, k, kt = (c["ppl"][x] for x in ("base", "knn", "tuned"))
            rows.append({"split": split, "LM": name, "source": cfg["lms"][name]["source"],
                         "#params": summaries[i]["parameters"], "training": summaries[i]["training"],
                         "base PPL (word)": b["value"], "kNN-LM PPL (word)": k["value"],
                         "absolute gain": b["value"] - k["value"], "λ": scores[i]["lambda"],
                         "relative gain (95% CI)": fmt_ci(c["diff"]["knn vs base"], pct=True),
                         "kNN-LM PPL, τ tuned": kt["value"], "τ*": scores[i]["tuned"]["temperature"],
                         "relative gain, τ tuned (95% CI)": fmt_ci(c["diff"]["tuned vs base"], pct=True),
                         "base 95% CI": fmt_ci(b), "kNN-LM 95% CI": fmt_ci(k), "documents": c["documents"]})
            m[f"{split}_{name}_base_ppl_word"] = b["value"]
            m[f"{split}_{name}_knn_interp_ppl_word"] = k["value"]
            m[f"{split}_{name}_rel_gain"] = c["diff"]["knn vs base"]["value"]
        cross += _cross_lm(names, boots, split, st)
    df = pd.DataFrame(rows)
    valid = df[df["split"] == "valid"].set_index("LM")["base PPL (word)"]
    order = sorted(names, key=lambda n: valid[n])  # stronger first, by base perplexity on valid (chosen on valid)
    for split, boots in boots_of.items():
        cmp_rows += gain_contrasts(names, order, boots, split, st)
    scheme = str(docs[0]["scheme"]) if "scheme" in docs[0] else st["documents"]
    note = (f"Documents ({scheme}) differ between LMs, so gains of different LMs are not compared with each other."
            if not cross else "")
    which = "every base LM of config 'lms'" if t4.get("lms") is None else f"the base LMs of config 'table4.lms' ({', '.join(names)})"
    cap = (f"Table 4 ({cfg['name']}; Xu et al. 2023, App. A): the kNN-LM of Sec. 3 on {which} "
           f"(each with its own datastore from its own pass over train): h_ds = {t4['key_type']}, ⊗ = "
           f"{METRIC_NAME[t4['metric']]}, full store, FAISS mask + score, k = {cfg['knn']['k']}, τ = "
           f"{cfg['knn']['temperature']} (and τ tuned on valid), λ tuned on valid. Per word = total NLL / (whitespace "
           f"words + one <eos> per line), the same word count for every tokenizer. Relative gain = kNN-LM / base − 1 "
           f"(negative = better), {ci_caption(st)}; documents per row in 'documents'. #params: of the base LM (tied embeddings counted once). Training: the base LM's convergence as its "
           f"checkpoint records it (valid curves: the MLflow runs of train_lm). {note} "
           f"{cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "Table 4: kNN-LM gain vs base-LM strength", cap, note=lm_training_label(job))
    if cross:
        cdf = pd.DataFrame(cross)
        with open(job.path("md"), "a") as f:
            f.write("\n## Gains compared across LMs (same documents, same resamples)\n\n"
                    "Difference of relative gains (a − b, percentage points; negative: a gains more).\n\n")
            f.write(cdf.to_markdown(index=False, floatfmt=".2f") + "\n")
            f.write("\nApp. A's claims (the kNN-LM improves every base LM; the stronger LM, by base perplexity on valid, "
                    "gains less than its weaker neighbour, at τ = 1 and each at its τ*) are tested in the findings "
                    "report, by the rules of every claim.\n")
    on = f"{t4['key_type']}/{METRIC_NAME[t4['metric']]}, each LM's own full store, FAISS mask + score, all tokens"
    write_csv(pd.DataFrame([{**r, "on": on} for r in cmp_rows]), job.path("cmp_csv"))
    print(Path(job.path("md")).read_text())
    return {"metrics": m, "artifacts": [job.path("csv"), job.path("md"), job.path("cmp_csv")]}


def gain_contrasts(names: list[str], order: list[str], boots: list[tuple[np.ndarray, np.ndarray]], split: str,
                   st: dict) -> list[dict]:
    """Comparison rows (knnlm.statistics.captions.comparison_rows' columns, with 'τ settings' and 'τ source' for the
    findings) of App. A's "the better the base LM, the less gain": for each pair of neighbours in `order` (LMs by base
    perplexity on valid, stronger first), the relative gain of the stronger LM's kNN-LM (ppl_kNN / ppl_base − 1) minus
    the weaker one's, at the config τ and with each at its τ*, paired over the same documents (boots: each LM's
    per-document NLL [3, D] of base, kNN-LM, kNN-LM at τ*, and words [D]; [] when the LMs' documents differ).
    Positive: the stronger LM gains less."""
    idx = {n: i for i, n in enumerate(names)}
    if len(names) < 2 or any(b[0].shape[1] != boots[0][0].shape[1] or not np.array_equal(b[1], boots[0][1])
                             for b in boots):
        return []
    out = []
    for a, b in zip(order, order[1:]):
        (na, w), (nb, _) = boots[idx[a]], boots[idx[b]]
        for j, t in ((1, ""), (2, " τ*")):
            out.append(contrast_row([na[0], na[j], nb[0], nb[j]], w,
                                 lambda p: (p[..., 1] / p[..., 0] - 1) - (p[..., 3] / p[..., 2] - 1), st,
                                 st.get("scheme", ""), split,
                                 f"relative gain of kNN-LM ({a}){t} minus relative gain of kNN-LM ({b}){t}",
                                 **{"τ settings": "" if t else f"kNN-LM ({a}); kNN-LM ({b})",
                                    "τ source": "" if t else "table4"}))
    return out


def _cross_lm(names: list[str], boots: list[tuple[np.ndarray, np.ndarray]], split: str, st: dict) -> list[dict]:
    """Pairwise differences of relative gain (kNN-LM at the config τ) between LMs, paired over the same documents
    (knnlm.statistics.intervals.estimate, config 'stats.interval'); [] when the LMs' documents differ (other counts or words per document)."""
    if len(names) < 2:
        return []
    n_docs = boots[0][0].shape[1]
    if any(b[0].shape[1] != n_docs or not np.array_equal(b[1], boots[0][1]) for b in boots):
        return []
    nll = np.concatenate([b[0][:2] for b in boots])  # [2 L, D]: base, kNN-LM of every LM, same documents
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]

    def gain_diffs(p):  # relative gain of LM i minus that of LM j, for every pair
        gains = [p[..., 2 * i + 1] / p[..., 2 * i] - 1 for i in range(len(names))]
        return np.stack([gains[i] - gains[j] for i, j in pairs], axis=-1)

    point, lo, hi = estimate(gain_diffs, nll, boots[0][1], st, "linear")
    out = []
    for k, (i, j) in enumerate(pairs):
        out.append({"split": split, "a": names[i], "b": names[j], "gain a − gain b (pp)": 100 * point[k],
                    "CI low": 100 * lo[k], "CI high": 100 * hi[k], "documents": n_docs,
                    "verdict": verdict(lo[k], hi[k], n_docs, st["min_documents"],
                                       effective_documents(boots[0][1]), st.get("scheme", "")).replace(
                        "lower", "a gains more").replace("higher", "b gains more")})
    return out
