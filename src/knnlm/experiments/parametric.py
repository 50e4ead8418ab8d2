"""Parametric alternatives to the datastore (Xu et al. 2023, Sec. 4, App. C): word statistics, one training run
per variant, and Tables 2, 5, 6, 7, the clustered-datastore table and Figure 3.

Jobs: word_stats, train_parametric, tables. The models are in knnlm.parametric.

Variant names (a wildcard of the `train_parametric` rule):
  nv<n>             n embeddings per word (n = 1: the learned W_ds of Table 2; Table 5, Figure 3)
  adaptive-<by>     1 + ⌊log_b f_v⌋ rows per word, f = training frequency ('freq') or total base-LM training
                    loss ('loss'), total = parametric.adaptive.total_n × V rows (Table 6)
  mos<R>-<only|embed>  mixture of R softmaxes over W_sm, W_sm frozen or fine-tuned (Table 7)
  cluster<m>        k-means of the keys into m × V centroids, M from each cluster's word frequencies, L2
                    scores over τ (tuned on valid, then learned with the centroids), scored before and after
                    fine-tuning the centroids (App. C.3)
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from ..job import Job
from ..io import atomic_path, create_npy, open_npy, read_checked_json, read_json, save_npy, write_json
from ..parametric import (KeyBatches, build_model, cached, cluster_aggregation, compute_word_stats, converged_label,
                          evaluate_log_probs, kmeans_centroids, parse_variant, train, training_settings,
                          tune_l2_temperature)
from ..scoring.results import METRIC_NAME, SPLITS, base_summary, evaluate, result_row
from ..statistics.intervals import per_document
from ..datastore.stores import TRAINING_SUBSET_LABEL, training_subset_rows, training_subset_size
from .common import (by_split, documents_label, lm_backend, lm_log_probs, lm_training_label, open_datastore,
                     open_split, split_documents, words_per_split)

log = logging.getLogger(__name__)
# nv<n>-sub: trained on the rows of config 'parametric.train_tokens', like the other variants; the kNN-LM whose
# store is exactly those rows (knnlm.datastore.stores.TRAINING_SUBSET): 'kNN-LM att/IP on the subset'
SUBSET = TRAINING_SUBSET_LABEL
ALONE = " alone"  # a parametric model's own perplexity, not interpolated with the base LM ('W_ds (learned) att alone')


def output_matrix(job: Job) -> torch.Tensor:
    """W_sm [V, D] float32: the base LM's output projection, from the job's input 'checkpoint' (fairseq
    decoder.output_projection.weight) or 'model_card' (a Hugging Face LM's output embeddings), by the backend the
    input belongs to (lm_backend). Raises ArtifactError when the LM has no plain bias-free linear output
    layer (adaptive softmax, lm_head bias)."""
    impl, files = lm_backend(job)
    return impl.output_matrix(files)


def train_parametric(job: Job) -> dict:
    """Train one variant (wildcards 'variant', 'key') on the dumped keys, resumable from its work dir
    (job.extra["work_dir"]: train_state.pt, kmeans.pt, per-stage log-probs), score it on valid and test,
    write result.json.

    The result: per stage ('trained', or 'before'/'after' fine-tuning for clusters) an evaluate() result (λ
    tuned on valid, the model alone as 'knn', interp, oracle), plus the training history (valid NLL per epoch).
    """
    variant, key, threads = job.wildcards["variant"], job.wildcards["key"], job.threads
    cfg = job.cfg
    torch.set_num_threads(threads)
    p = cfg["parametric"]
    spec = parse_variant(variant)
    keys, vals, man = open_datastore(job)
    w_sm = output_matrix(job)
    stats_path = job.input.get("word_stats")
    vocab, dim = w_sm.shape[0], keys.shape[1]
    tr = training_settings(p, variant)
    rows = None if tr["train_tokens"] is None else training_subset_rows(man["N"], tr["train_tokens"], p["seed"])
    q = {s: open_split(job, s, with_queries=True, checkpoint_sha256=man["checkpoint_sha256"]) for s in SPLITS}
    words = words_per_split(job)
    lp_lm = {s: np.asarray(q[s]["lm_logprobs"], dtype=np.float64) for s in q}
    vt = p["valid_tokens"] or q["valid"]["manifest"]["T"]
    valid = (q["valid"]["queries"][:vt], np.asarray(q["valid"]["targets"][:vt], dtype=np.int64))
    interp = None
    if spec.get("interp_loss"):  # App. E.6.3: log p_LM(val) of every training row (knnlm.parametric.compute_word_stats)
        aux = open_npy(job.path("row_logprobs"), shape=(man["N"],), dtype=np.float32)
        interp = (spec["interp_loss"], lp_lm["valid"][:vt])
    else:
        aux = None
    batches = KeyBatches(keys, vals, rows, p["batch_size"], p["seed"], aux_keys=aux)
    out_dir = Path(job.extra["work_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"variant": variant, "key_type": key, "spec": spec, "train_rows": len(batches.rows), "training": tr,
              "datastore_rows": int(man["N"]), "valid_tokens": len(valid[1]), "stages": {}}

    def score(model, stage):
        t0 = time.time()
        lp = {s: evaluate_log_probs(model, q[s]["queries"], q[s]["targets"], p["batch_size"], p["bf16"]) for s in q}
        for s, v in lp.items():
            save_npy(out_dir / f"{stage}_{s}_lp.npy", v.astype(np.float32))  # per stage (clusters: before/after)
        res = evaluate(lp_lm, lp, words, cfg["knn"]["lambda_steps"])
        res["eval_seconds"] = time.time() - t0
        result["stages"][stage] = res
        log.info("%s/%s %s: test alone %.3f, interp %.3f (λ=%.2f), base %.3f", variant, key, stage,
                 res["test"]["knn"]["ppl_word"], res["test"]["interp"]["ppl_word"], res["lambda"],
                 np.exp(-lp_lm["test"].sum() / words["test"]))

    if spec["kind"] == "cluster":
        cpath = out_dir / "kmeans.pt"
        cl = p["clustered"]
        km_settings = {"clusters": spec["m"] * vocab, "iters": cl["kmeans_iters"], "sample": cl["kmeans_sample"],
                       "seed": p["seed"], "rows": len(batches.rows), "key": key}

        def compute():
            cent, assign = kmeans_centroids(keys, batches.rows, spec["m"] * vocab, cl["kmeans_iters"], cl["kmeans_sample"],
                                            p["seed"], threads)
            return {"centroids": cent, "assign": assign}

        km = cached(cpath, km_settings, compute)
        agg = cluster_aggregation(km["assign"], np.asarray(vals[batches.rows]), spec["m"] * vocab, vocab)
        model, info = build_model(spec, cfg, vocab, dim, w_sm, stats_path, km["centroids"], agg)
        info["kmeans_seconds"], info["kmeans"] = km["seconds"], km_settings  # (new k-means: training starts over)
        info["empty_clusters"] = int(spec["m"] * vocab - len(np.unique(km["assign"])))
        t0 = time.time()
        info["temperature_init"], grid_nll = tune_l2_temperature(model, *valid, batch_size=p["batch_size"])
        result["temperature"] = {"grid_valid_nll": grid_nll, "seconds": time.time() - t0}
        log.info("%s/%s: τ = %.3g tuned on valid (NLL %.4f nats/token; %.4f at τ = 1)", variant, key,
                 info["temperature_init"], grid_nll[info["temperature_init"]], grid_nll[1.0])
        score(model, "before")
        epochs = p["clustered"]["finetune_epochs"]
    else:
        model, info = build_model(spec, cfg, vocab, dim, w_sm, stats_path)
        epochs = tr["max_epochs"]
    result["info"] = info
    if epochs > 0:
        hist = train(model, batches, valid, out_dir / "train_state.pt", p["lr"], epochs, tr["patience"], p["bf16"],
                     evals_per_epoch=tr["evals_per_epoch"], on_eval=job.curve, lr_schedule=p["lr_schedule"],
                     plateau=tr["plateau"],
                     settings={"variant": variant, "key": key, "batch_size": p["batch_size"], "seed": p["seed"],
                               "train_tokens": tr["train_tokens"], "train_rows": len(batches.rows),
                               "valid_tokens": len(valid[1]), "info": {k: v for k, v in info.items() if not k.endswith("seconds")}},
                     interp=interp)
        result["history"] = hist
        if spec["kind"] == "cluster":
            result["temperature"]["after"] = model.temperature  # learned with the centroids
        score(model, "after" if spec["kind"] == "cluster" else "trained")
    final = list(result["stages"])[-1]
    for split, path in by_split(job, "logprobs").items():
        save_npy(path, np.load(out_dir / f"{final}_{split}_lp.npy"))
    result["final_stage"] = final
    write_json(job.path("result"), result)
    metrics, step = {}, {}
    for stage, v in result["stages"].items():
        metrics[f"{stage}_lambda"] = v["lambda"]
        for split in SPLITS:
            for part in ("knn", "interp", "oracle"):
                metrics[f"{stage}_{split}_{'alone' if part == 'knn' else part}_ppl_word"] = v[split][part]["ppl_word"]
    if "history" in result:
        h = result["history"]
        step = {"train_loss": [(s, l) for s, l in h["train"]], "valid_nll": [(s, l) for s, _, l in h["valid"]]}
        metrics.update(epochs=h["epochs"], steps=h["steps"], best_step=h["best_step"], converged=int(h["converged"]),
                       train_seconds=h["seconds"], train_tokens_per_second=h["tokens_per_second"])
    return {"metrics": metrics, "step_metrics": step, "artifacts": [job.path("result")], "params": {"info": result["info"]}}


def word_stats(job: Job) -> dict:
    """Per word: training frequency and total base-LM training loss (from the ffn keys and W_sm), for the
    adaptive counts of Table 6; and the base LM's log p(val) of every datastore row, the frozen term of the
    interpolated loss (App. E.6.3), computed once here instead of in every training step."""
    keys, vals, man = open_datastore(job)
    t0 = time.time()
    with create_npy(job.path("row_logprobs"), (len(vals),), np.float32) as rows:
        st = compute_word_stats(keys, vals, output_matrix(job), bf16=job.cfg["parametric"]["bf16"], row_logprobs=rows)
    with atomic_path(job.path("out")) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **st)
    return {"metrics": {"seconds": time.time() - t0, "train_nll_per_token": float(st["loss"].sum() / st["freq"].sum())}}


def _rows(result: dict, stage: str, label: str, base: dict, knn_best: dict) -> list[dict]:
    """Rows (test, valid) of one trained variant at one stage, with the share of the kNN-LM's gain it recovers."""
    out = []
    h = {} if stage == "before" else result.get("history", {})
    for split in ("test", "valid"):
        row = result_row(split, {"model": label, "h_ds": result["key_type"]}, result["stages"][stage])
        out.append({**row, "kNN-LM gain recovered": _gain(row, base, knn_best, split), "train rows": result["train_rows"],
                    "epochs": round(h.get("epochs", 0), 2), "steps": h.get("steps", 0),
                    "converged": "-" if not h else converged_label(h)})
    return out



def _schedule_text(schedule: str) -> str:
    return "halved at every valid evaluation without a new best" if schedule == "plateau" else "constant"


def _plateau_text(plateau: float | None) -> str:
    return "" if plateau is None else f", or an epoch improving valid perplexity by < {100 * plateau:g} %"


def _gain(row: dict, base: dict, knn_best: dict, split: str) -> float:
    """(base − interp) / (base − best kNN-LM interp), per-word perplexities of `split`."""
    return (base[split]["ppl_word"] - row["interp PPL (word)"]) / (base[split]["ppl_word"] - knn_best[split])


def _label(result: dict) -> tuple[str, str]:
    """(table, row label) of a variant."""
    s = result["spec"]
    if s["kind"] == "nv":
        name = "W_ds (learned)" if s["n"] == 1 else f"{s['n']}V embeddings"
        return ("table5", name + SUBSET if s.get("subset") else name)
    if s["kind"] == "adaptive":
        return ("table6", f"adaptive counts by {'frequency' if s['by'] == 'freq' else 'base-LM loss'}")
    if s["kind"] == "mos":
        return ("table7", f"MoS R={s['mixtures']} ({'+ embed' if s['train_embed'] else 'only'})")
    return ("clustered", f"clustered datastore {s['m']}V")


def _tau_text(result: dict, stage: str) -> str:
    """', τ = …' of a clustered variant's stage: tuned on valid before fine-tuning, learned after ('' if unknown)."""
    t = result.get("temperature", {})
    tau = result["info"].get("temperature_init") if stage == "before" else t.get("after")
    return "" if tau is None else f", τ = {tau:.3g}"


TABLE_COLUMNS = ["split", "model", "h_ds", "PPL (word)", "PPL (token)", "λ", "interp PPL (word)", "oracle PPL (word)",
                 "interp PPL (token)", "oracle PPL (token)", "kNN-LM gain recovered", "train rows", "epochs", "steps",
                 "converged"]


def _variant_name(result: dict) -> str:
    """'<row label> <h_ds>' of a trained variant, e.g. 'W_ds (learned) att' (the comparisons' names)."""
    return f"{_label(result)[1]} {result['key_type']}"


def _is_w_ds(result: dict) -> bool:
    """W_ds: nV with n = 1 (nv1, or nv1-sub on the subset)."""
    return result["spec"]["kind"] == "nv" and result["spec"]["n"] == 1


def _same_rows_w_ds(result: dict, results: list[dict]) -> list[int]:
    """Indices in `results` of the W_ds of `result`'s key type trained on as many rows (the same seeded subset)."""
    return [i for i, w in enumerate(results) if _is_w_ds(w) and w["key_type"] == result["key_type"]
            and w["train_rows"] == result["train_rows"]]


def _test_interp_ppl(result: dict) -> float:
    """Test interpolated per-word perplexity of a trained variant (its 'trained' stage)."""
    return result["stages"]["trained"]["test"]["interp"]["ppl_word"]


def nv_check(results: list[dict]) -> str:
    """Table 5's check (caption text): nV contains 1V as a special case, so at equal training rows its test
    interpolated perplexity should be no worse than W_ds's; each nV that is worse is named with both numbers and its
    training, since the gap then measures training, not softmax capacity. '' without nV models."""
    nv = [r for r in results if r["spec"]["kind"] == "nv"]
    out = []
    for r in (r for r in nv if r["spec"]["n"] > 1):
        ref = [results[i] for i in _same_rows_w_ds(r, results)]
        if not ref:
            out.append(f"{r['spec']['n']}V {r['key_type']}: no W_ds trained on its {r['train_rows']:,} rows to check against")
        elif _test_interp_ppl(r) > _test_interp_ppl(ref[0]):
            h = r.get("history", {})
            out.append(f"{r['spec']['n']}V {r['key_type']} is worse than W_ds on the same {r['train_rows']:,} rows "
                       f"({_test_interp_ppl(r):.3f} vs {_test_interp_ppl(ref[0]):.3f}; {h.get('steps', '?')} steps, "
                       f"{'converged' if h.get('converged') else 'under-trained'}): nV contains 1V, so the gap is its "
                       f"training (more parameters per word to fit from the same rows), not its capacity")
    if not nv or not out:
        return " Check: every nV is no worse than W_ds trained on the same rows." if len(nv) > 1 else ""
    return " Check (nV contains 1V): " + "; ".join(out) + "."


def equal_rows_pairs(results: list[dict], names: list[str]) -> list[tuple[str, str]]:
    """(variant, W_ds) comparisons at equal training rows: every variant other than W_ds against the W_ds (nv1, or
    nv1-sub: W_ds on the shrunk subset) of its key type trained on as many rows (the same seeded subset), so that a
    difference measures the softmax, not the data (Xu et al. 2023, App. B-C). A variant without such a W_ds gets
    none (its rows against the kNN-LM say how many rows it saw)."""
    out = []
    for r, n in zip(results, names):
        ref = [] if _is_w_ds(r) else _same_rows_w_ds(r, results)
        out += [(n, names[ref[0]])] if ref else []
    return out


def equal_capacity_pairs(results: list[dict], names: list[str]) -> list[tuple[str, str]]:
    """(variant, nV) comparisons of App. C against "the simple multi-embedding approach", at equal training rows and
    key type: each adaptive variant against the nV with as many embeddings in all (its 'info' rows; C.1: "given the
    same number of total embeddings"), each MoS variant against every nV with n > 1 (C.2: "worse than those that
    simply increase the number of embeddings"). A variant without such an nV gets none."""
    def nv(r: dict) -> bool:
        return r["spec"]["kind"] == "nv" and not r["spec"].get("interp_loss")

    out = []
    for r, n in zip(results, names):
        same = [(w, m) for w, m in zip(results, names) if nv(w) and w["key_type"] == r["key_type"]
                and w["train_rows"] == r["train_rows"]]
        if r["spec"]["kind"] == "adaptive":
            out += [(n, m) for w, m in same if w.get("info", {}).get("rows") == r.get("info", {}).get("rows")]
        elif r["spec"]["kind"] == "mos":
            out += [(n, m) for w, m in same if w["spec"]["n"] > 1]
    return out


def comparison_variant(comparison: str, variants: list[str]) -> str:
    """The trained variant among `variants` that a parametric comparison names: 'ALT vs base', 'ALT alone vs base',
    'kNN-LM X vs ALT' or 'share of the gain: ALT of kNN-LM X'. Raises ValueError when it names none."""
    if comparison.startswith("share of the gain: "):
        parts = [comparison[len("share of the gain: "):].rsplit(" of kNN-LM ", 1)[0]]
    else:
        parts = [p.removesuffix(ALONE) for p in comparison.split(" vs ", 1)]
    for part in parts:
        if part in variants:
            return part
    raise ValueError(f"comparison {comparison!r} names none of the trained variants {variants}")


def _subset_reference(job: Job, results: list[dict]) -> dict | None:
    """The kNN-LM on the alternatives' training rows (inputs 'subset_score', 'subset_knn', 'subset_tuned'; store
    knnlm.datastore.stores.TRAINING_SUBSET, rows of config 'parametric.train_tokens'): {'name', 'label', 'rows', 'score'}
    (the score JSON of knnlm.experiments.table1.score), or None without those inputs."""
    if not job.input.get("subset_score"):
        return None
    s, p = read_checked_json(job.path("subset_score"), "score"), job.cfg["parametric"]
    rows = training_subset_size(results[0]["datastore_rows"], p["train_tokens"]) if results else 0
    pair = f"{s['key_type']}/{METRIC_NAME[s['metric']]}"
    return {"name": f"kNN-LM {pair}{SUBSET}", "label": f"{pair}{SUBSET}", "rows": rows, "score": s}


def _comparisons(job: Job, results: list[dict], scores: list[dict], best: dict) -> list[str]:
    """Table 'parametric_comparisons': every variant's interpolated perplexity vs the base LM, vs the best kNN-LM
    (Table 1, chosen on valid; at τ and at τ*) and vs the paper's reference kNN-LM of Tables 2 and 5-7 (att/IP, at the
    config τ and at its τ*), and the share of each one's gain it recovers (Sec. 4: the learned W_ds recovers ~55 %),
    each with a paired 95 % CI over documents (whole valid and test; knnlm.statistics.intervals, 'stats.interval')."""
    from ..scoring.interpolation import interpolate
    from ..statistics.captions import ci_caption, comparison_rows
    from ..statistics.intervals import compare
    from ..report.tables import write_comparisons

    from .common import stats_options

    st = stats_options(job)
    lp_lm = lm_log_probs(job)
    knn_files, par_files = job.paths("knn_logprobs"), job.paths("par_logprobs")
    tuned_files = job.paths("knn_tuned")
    if len(knn_files) != len(SPLITS) * len(scores) or len(par_files) != len(SPLITS) * len(results) \
            or len(tuned_files) != len(knn_files):
        raise ValueError(f"rule {job.rule}: inputs knn_logprobs / knn_tuned / par_logprobs must list one file per split "
                         f"of every score / score / variant, found {len(knn_files)} / {len(tuned_files)} / {len(par_files)}")
    knn_name = {id(s): f"kNN-LM {s['key_type']}/{METRIC_NAME[s['metric']]}" for s in scores}
    sub = _subset_reference(job, results)
    best_name = knn_name[id(best)]
    best_tuned = best_name + " τ*"  # the same kNN-LM at its τ tuned on valid (λ re-tuned; Table 1's 'τ tuned' row)
    paper_ref = "kNN-LM att/IP"  # Tables 2 and 5-7 of the paper: h_ds = att, ⊗ = IP (τ = 1 there; here also at τ*)
    par_names = [_variant_name(r) for r in results]
    rows = []
    for j, split in enumerate(SPLITS):
        doc, doc_words = split_documents(job, split)
        lps, names = [lp_lm[split]], ["base"]
        for i, s in enumerate(scores):
            lps.append(interpolate(lp_lm[split], np.load(knn_files[i * len(SPLITS) + j]).astype(np.float64), s["lambda"]))
            names.append(knn_name[id(s)])
            if s is best or knn_name[id(s)] == paper_ref:  # at its τ* too: ours, and the paper's reference
                lps.append(interpolate(lp_lm[split], np.load(tuned_files[i * len(SPLITS) + j]).astype(np.float64),
                                       s["tuned"]["lambda"]))
                names.append(knn_name[id(s)] + " τ*")
        if sub:  # the kNN-LM on the alternatives' training rows, at the config τ and at its τ* (λ tuned on valid)
            for name, f, lam in ((sub["name"], "subset_knn", sub["score"]["lambda"]),
                                 (sub["name"] + " τ*", "subset_tuned", sub["score"]["tuned"]["lambda"])):
                lps.append(interpolate(lp_lm[split], np.load(by_split(job, f)[split]).astype(np.float64), lam))
                names.append(name)
        for i, r in enumerate(results):
            lam = r["stages"][r.get("final_stage", list(r["stages"])[-1])]["lambda"]
            lp_par = np.load(par_files[i * len(SPLITS) + j]).astype(np.float64)
            lps += [interpolate(lp_lm[split], lp_par, lam), lp_par]  # interpolated, and the model alone
            names += [par_names[i], par_names[i] + ALONE]
        nll = per_document(-np.stack(lps), doc, len(doc_words))
        # the best kNN-LM (ours, chosen on valid) at τ and at τ*, and the paper's own reference of Tables 2 and 5-7,
        # the att/IP kNN-LM (19.095 in the paper) at the config τ and at its τ*, when the run has it
        refs = [best_name, best_tuned] + [n for n in (paper_ref, paper_ref + " τ*")
                                          if n in names and n not in (best_name, best_tuned)]
        on_sub = [n for n, r in zip(par_names, results) if sub and r["train_rows"] == sub["rows"]]
        sub_refs = [sub["name"], sub["name"] + " τ*"] if on_sub else []
        pairs = ([(n, "base") for n in par_names] + [(r, n) for r in refs for n in par_names]
                 + [(r, n) for r in sub_refs for n in on_sub]  # the kNN-LM on the same rows (App. B-C, like for like)
                 + ([(sub_refs[1], sub_refs[0])] if sub_refs else [])  # does its τ* beat τ = 1 (chosen on valid)
                 + [(n + ALONE, "base") for n in par_names]  # the model alone vs the base LM alone (Sec. 4)
                 + [(n, n + ALONE) for n in par_names]  # interpolated vs alone: two views ensembled (Sec. 4.1)
                 + equal_rows_pairs(results, par_names)  # each variant vs W_ds trained on the same rows
                 + equal_capacity_pairs(results, par_names))  # App. C: vs nV of as many embeddings, same rows
        c = compare(nll, doc_words, names, pairs, st, shares=[(n, r) for r in refs for n in par_names]
                    + [(n, r) for r in sub_refs for n in on_sub])
        rows += comparison_rows(c, split=split)  # the shares of a gain too
    history = {n: r.get("history", {}) for n, r in zip(par_names, results)}
    for row in rows:  # which kNN-LM a row compares with: ours (best on valid, at τ or τ*) and/or the paper's
        c, ref = row["comparison"], []
        if sub and sub["name"] in c:
            row["reference"] = "the paper's (" + sub["label"] + (", τ*)" if sub["name"] + " τ*" in c else ", config τ)")
            continue
        if best_tuned in c:
            ref.append("best on valid, τ*")
        elif best_name in c:
            ref.append("best on valid")
        if f"{paper_ref} τ*" in c:
            ref.append("the paper's (att/IP, τ*)")
        elif paper_ref in c:
            ref.append("the paper's (att/IP, config τ)")
        row["reference"] = "; ".join(ref)
    by_name = dict(zip(par_names, results))
    for row in rows:  # the training of the variant each comparison involves: under-trained rows prove less
        if sub and row["comparison"] == f"{sub['name']} τ* vs {sub['name']}":
            row.update({"train rows": "-", "reference rows": sub["rows"]})
            continue
        v = by_name[comparison_variant(row["comparison"], par_names)]
        h = history[_variant_name(v)]
        if sub and sub["name"] in row["comparison"]:
            ref_rows = sub["rows"]  # the kNN-LM on the alternatives' training rows
        elif row["comparison"].startswith(("kNN-LM ", "share of the gain: ")):
            ref_rows = v.get("datastore_rows", "-")  # a kNN-LM searches every datastore row
        else:  # 'X vs base' (no rows), 'X vs W_ds ...' (the rows W_ds was trained on)
            other = row["comparison"].split(" vs ", 1)[-1]
            ref_rows = by_name[other]["train_rows"] if other in by_name else "-"
        row.update({"steps": h.get("steps", 0), "epochs": round(h.get("epochs", 0), 2), "converged": converged_label(h),
                    "train rows": v["train_rows"], "reference rows": ref_rows})
    boot = f"{ci_caption(st, documents_label(job))}; all tokens of valid and test."
    cap = (f"Parametric alternatives ({job.cfg['name']}; Xu et al. 2023, Sec. 4): interpolated perplexity of each "
           f"variant vs the base LM and vs the best kNN-LM ({best_name}, chosen on valid, at τ = "
           f"{job.cfg['knn']['temperature']} and at its τ tuned on valid, 'τ*') and vs the paper's reference of Tables "
           f"2 and 5-7, the att/IP kNN-LM at τ = {job.cfg['knn']['temperature']} and at its τ* (when the run has it), and "
           f"'share of the gain: "
           f"a of b' = (base − a) / (base − b) of per-word perplexity (the paper: W_ds att recovers ~55 %). "
           f"steps / converged / train rows: the training of the variant the comparison involves; 'reference rows': the "
           f"rows of what it is compared with (a kNN-LM: every datastore row; W_ds: the rows it was trained on). "
           f"'X vs W_ds (learned)[ on the subset]' compares a variant with W_ds trained on the same rows, "
           f"'X alone vs base' the model without interpolation."
           + (f" '{sub['name']}': the kNN-LM whose datastore is exactly the {sub['rows']:,} rows the variants "
              f"'{SUBSET.strip()}' were trained on (the same seeded subset), at τ = {job.cfg['knn']['temperature']} and "
              f"at its τ* (λ tuned on valid): each such variant is also compared with it, at equal rows." if sub else ""))
    write_comparisons(rows, job.path("cmp_csv"), job.path("cmp_md"), "Parametric comparisons with 95% CIs", cap, boot, note=lm_training_label(job))
    return [str(job.path("cmp_csv")), str(job.path("cmp_md"))]


def tables(job: Job) -> dict:
    """Tables 2, 5, 6, 7 and the clustered-datastore table (CSV + Markdown) and Figure 3 (PNG + PDF).

    Inputs: 'results' (result.json of every variant), 'scores' (Table 1's score JSONs: the kNN-LM rows and the
    best kNN-LM, chosen by valid interpolated perplexity, whose gain over the base LM each alternative is
    compared with), the base LM's log-probs and word counts (whole valid and test).
    """
    import pandas as pd

    from ..report.figures import pyplot, save_figure
    from ..report.tables import write_table

    plt = pyplot()
    cfg = job.cfg
    results = [read_json(p) for p in job.paths("results")]
    scores = [read_checked_json(p, "score") for p in job.paths("scores")]
    base = base_summary(lm_log_probs(job), words_per_split(job))
    best = min(scores, key=lambda s: s["valid"]["interp"]["ppl_word"])
    knn_best = {s: best[s]["interp"]["ppl_word"] for s in ("valid", "test")}
    p = cfg["parametric"]
    note = cfg.get("profile", {}).get("caption", "")
    train_txt = "all datastore rows" if p["train_tokens"] is None else f"a seeded subset of {p['train_tokens']} datastore rows"
    c = p["converge"]
    conv_txt = "all datastore rows" if c["train_tokens"] is None else f"{c['train_tokens']} rows"
    common = (f"Trained on the dumped keys (LM frozen, clean features: the paper kept dropout in the frozen body) "
              f"with Adam lr {p['lr']} ({_schedule_text(p['lr_schedule'])}), batch {p['batch_size']}, valid NLL on "
              f"{p['valid_tokens'] or 'all'} valid tokens. Variants {', '.join(c['variants']) or 'none'} (W_ds = nv1): "
              f"trained until the valid NLL stops improving ({c['evals_per_epoch']} evaluations per epoch, patience "
              f"{c['patience']} evaluations{_plateau_text(c['plateau'])}, ≤ {c['max_epochs']} epochs) on {conv_txt}; the "
              f"others: ≤ {p['max_epochs']} epochs, patience {p['patience']}{_plateau_text(p['plateau'])}, on "
              f"{train_txt}. 'converged': 'yes (patience)' = stopped by early stopping, 'yes (plateau)' = an epoch "
              f"gained less than the plateau fraction; 'no (under-trained)' = "
              f"stopped at max_epochs while still improving. 'PPL' = the model alone, 'interp' = with the base "
              f"LM, λ tuned on valid; 'kNN-LM gain recovered' = (base − interp) / (base − best kNN-LM interp), best "
              f"kNN-LM = {best['key_type']}/{METRIC_NAME[best['metric']]} (Table 1). All tokens of valid and test. {note}")
    tables: dict[str, list] = {"table2": [], "table5": [], "table6": [], "table7": [], "clustered": []}
    for split in ("test", "valid"):
        b = result_row(split, {"model": "Base LM", "h_ds": "-"}, base=base)
        for t in tables:
            tables[t].append(dict(b))
        for s in scores:
            row = result_row(split, {"model": f"kNN-LM ({METRIC_NAME[s['metric']]})", "h_ds": s["key_type"]}, s)
            tables["table2"].append({**row, "kNN-LM gain recovered": _gain(row, base, knn_best, split)})
    for res in results:
        table, label = _label(res)
        for stage in res["stages"]:
            lab = label + (f" ({stage} fine-tuning{_tau_text(res, stage)})" if stage in ("before", "after") else "")
            rows = _rows(res, stage, lab, base, knn_best)
            tables[table] += rows
            if res["spec"]["kind"] == "nv" and res["spec"]["n"] == 1 and not res["spec"].get("subset"):
                tables["table2"] += rows
            if res["spec"]["kind"] == "nv" and res["spec"]["n"] == p["adaptive"]["total_n"] \
                    and res["key_type"] in p["adaptive"]["key_types"]:
                tables["table6"] += [dict(r, model=f"equal counts ({r['model']})") for r in rows]
    titles = {"table2": "Table 2: learned W_ds vs the datastore", "table5": "Table 5: n embeddings per word (nV)",
              "table6": f"Table 6: adaptive vs equal counts at {p['adaptive']['total_n']}V rows",
              "table7": "Table 7: mixture of softmaxes", "clustered": "Appendix C.3: clustered datastore"}
    extra = {"clustered": " Clustered datastore: softmax over −|h − c|² / τ, τ tuned on the valid NLL over √2-spaced "
                          "values 1 … 4096 before fine-tuning, then learned with the centroids (the τ of each row)."}
    extra["table5"] = nv_check(results)
    written, lm_note = [], lm_training_label(job)
    for csv, md in zip(job.paths("csv"), job.paths("md")):
        t = md.name.rsplit(".", 1)[0]
        if len(tables[t]) <= 2:
            raise ValueError(f"rule {job.rule}: table {t} has no trained variant; check config section 'parametric'")
        df = pd.DataFrame(tables[t]).sort_values("split", ascending=True, kind="stable")
        df = df[[c for c in TABLE_COLUMNS if c in df]]
        write_table(df, csv, md, titles[t], f"{titles[t]} ({cfg['name']}; Xu et al. 2023, Sec. 4 and App. C). {common}{extra.get(t, '')}", note=lm_note)
        written += [str(csv), str(md)]

    written += _comparisons(job, results, scores, best)

    fig, ax = plt.subplots(figsize=(5, 3.6))
    nv = sorted((r for r in results if r["spec"]["kind"] == "nv"), key=lambda r: r["spec"]["n"])
    for key in p["key_types"]:  # the nV line at equal training rows (nv1-sub where W_ds itself saw every row)
        mine = [r for r in nv if r["key_type"] == key]
        rows = {r["train_rows"] for r in mine if r["spec"]["n"] > 1} or {r["train_rows"] for r in mine}
        line = [r for r in mine if r["train_rows"] in rows]
        if line:
            ax.plot([r["spec"]["n"] for r in line], [_test_interp_ppl(r) for r in line], "-o",
                    label=f"nV softmax on {key} ({', '.join(f'{n:,}' for n in sorted(rows))} rows)")
        for r in (r for r in mine if r["train_rows"] not in rows):
            ax.plot([r["spec"]["n"]], [_test_interp_ppl(r)], "s", label=f"W_ds on {key}, {r['train_rows']:,} rows")
    ax.axhline(base["test"]["ppl_word"], color="k", ls="--", label="base LM")
    for key in p["key_types"]:
        ks = [s for s in scores if s["key_type"] == key]
        if ks:
            kb = min(ks, key=lambda s: s["valid"]["interp"]["ppl_word"])
            ax.axhline(kb["test"]["interp"]["ppl_word"], ls=":", color="C0" if key == "att" else "C1",
                       label=f"kNN-LM {key}/{METRIC_NAME[kb['metric']]}")
    ax.set_xlabel("embeddings per word n")
    ax.set_ylabel("test interp. perplexity (per word)")
    ax.set_title(f"Fig. 3 ({cfg['name']}): nV softmax vs kNN-LM", fontsize=10)
    ax.legend(fontsize=7)
    written += save_figure(fig, job.paths("fig3"))
    plt.close(fig)
    return {"artifacts": written}
