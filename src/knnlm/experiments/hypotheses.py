"""The hypotheses the paper rejects that need no new training (Xu et al. 2023, Sec. 6, App. E.1-E.4), on the
artifacts of Table 1 (the full store's FAISS neighbours of every valid and test token):

  E.1 distance metric  -- the kNN scores replaced by −‖W_sm[v_i] − h_ds‖², the distance of the query to the output
                          embedding of each retrieved token v_i (att and ffn queries); τ and λ tuned on valid
  E.2 sparsification   -- (a) the LM's distribution kept to its top k tokens, renormalised at a temperature chosen
                          on valid, interpolated with the LM; (b) the LM's distribution restricted to the tokens the
                          kNN search retrieved (their distances ignored), with and without removing duplicates
  E.3 location         -- the change of the base LM's per-token NLL and of the kNN-LM's gain (nats) between the first
                          and the last quarter of positions in the context window and in the document (the kNN-LM at
                          the config τ and at its τ*; test and valid, where the findings derive the margin they are
                          tested against); Pearson's r reported beside it
  E.4 stolen probabilities -- the words of W_sm that can never be the argmax (inside the convex hull of the others)

Every interpolation is compared with the base LM and, like for like, with the kNN-LM of Table 1 at its τ tuned on
the same valid tokens (same key type, Table 3's metric; 'kNN-LM <key> τ*'), since each twin gets its τ or T tuned
on valid; the kNN-LM at the config τ is in the table beside it. A τ* or T* on its grid's edge is flagged in the
comparison row ('flag') and in the findings. Comparisons are on the same tokens, paired over documents
(knnlm.statistics.intervals); E.3's effects get the jackknife-t interval of knnlm.statistics.intervals.jackknife_sums
(coverage: docs/statistics.md).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..job import Job
from ..io import ArtifactError, iter_chunks, open_npy, read_checked_json, read_json, release_rows
from ..scoring.results import METRIC_NAME, SPLITS, evaluate
from ..scoring.interpolation import interpolate
from ..statistics.captions import DESIGN_N_EFF, ci_caption, comparison_rows, fmt_ci, statistic_row
from ..statistics.intervals import compare, effective_documents, jackknife_sums, per_document
from ..report.tables import write_csv, write_table
from .common import by_split, documents_label, lm_training_label, split_documents, stats_options

log = logging.getLogger(__name__)
CHUNK = 2048  # tokens per chunk, one chunk per thread at a time: [CHUNK, V] float64 logits per thread in RAM


def _split_inputs(job: Job, split: str, keys: list[str]) -> dict:
    """Targets, LM log-probs, manifest, queries per key and FAISS neighbour ids per key of one split (memmaps)."""
    from ..datastore.dump import open_queries
    from .retrieval import _rows_of

    f = {n: by_split(job, n)[split] for n in ("queries_manifest", "targets", "lm_logprobs")}
    q = open_queries(f["queries_manifest"], f["targets"], f["lm_logprobs"], by_split(job, "queries_ffn")[split])
    t = q["manifest"]["T"]
    out = {"targets": np.asarray(q["targets"], dtype=np.int64), "lm": np.asarray(q["lm_logprobs"], dtype=np.float64),
           "manifest": q["manifest"], "ffn": q["queries"], "queries": {}, "ids": {}}
    for key in keys:
        out["queries"][key] = open_npy(by_split(job, f"queries_{key}")[split], (t, q["manifest"]["D"]), np.float32)
        meta_path = by_split(job, f"nb_meta_{key}")[split]
        meta = read_json(meta_path)
        ids = open_npy(by_split(job, f"nb_ids_{key}")[split], (meta["T"], meta["k"]), np.int32)
        out["ids"][key] = (ids, _rows_of(meta, np.arange(t), meta_path))
    return out


def _per_token(job: Job, w_sm: np.ndarray, vals, keys: list[str], taus: list[float], temps: list[float],
               split: str, check: bool = True) -> tuple[dict, float]:
    """One pass over every token of `split`: ({name: [n, T] or [T] log p(target)} for E.1 (per τ of `taus`; none when
    empty), E.2a (per (k, temperature of `temps`)) and E.2b (per temperature), the largest |log p_LM recomputed −
    dumped| (0.0 unless `check`)).
    Every quantity is per token and per grid value, so a pass for some grid values gives the same numbers as a pass
    for a larger grid. Chunks of CHUNK tokens run on job.threads threads at once (numpy and torch release the GIL;
    the numba kernels, themselves parallel, run one at a time)."""
    from ..scoring.analysis import (GEMM_ROWS, fixed_shape_matmul, output_embedding_scores, subset_log_prob_grid,
                                    topk_log_prob_grid, unique_tokens)
    from ..scoring.interpolation import sweep_temperature

    hyp = job.cfg["hypotheses"]
    v = w_sm.shape[0]
    ks = sorted({k for k in hyp["topk"] if k < v})
    kernels = threading.Lock()  # numba's parallel kernels, one call at a time
    s = _split_inputs(job, split, keys)
    t = len(s["targets"])
    r = {"e1": {key: np.empty((len(taus), t)) for key in keys},
         "topk": np.empty((len(ks), len(temps), t)),
         "subset": {(key, dd): np.empty((len(temps), t)) for key in keys for dd in (False, True)}}

    def chunk(a: int, b: int) -> float:
        """Fill tokens a..b of r; returns their largest |log p_LM recomputed − dumped| (0.0 unless check)."""
        tg = s["targets"][a:b]
        # [c, V]: h_sm · W_sm, the same bits for a token whatever the chunking (chunks start at multiples of GEMM_ROWS)
        logits = fixed_shape_matmul(s["ffn"][a:b], w_sm.T)
        if ks and temps:  # E.2a: the LM's top k tokens, every (k, temperature) from one selection
            r["topk"][:, :, a:b] = topk_log_prob_grid(logits, tg, ks, temps)
        for key in keys:
            ids_mm, rows = s["ids"][key]
            ids = np.asarray(ids_mm[rows[a:b]])
            # the cache's pages of these rows leave the RSS (2 key types x 1.1 GB of ids per split at wikitext2)
            release_rows(ids_mm, int(rows[a:b].min(initial=0)), int(rows[a:b].max(initial=-1)) + 1)
            valid = ids >= 0
            nb_vals = np.where(valid, np.asarray(vals)[np.where(valid, ids, 0)], -1).astype(np.int64)
            for dd, tokens in ((False, nb_vals), (True, unique_tokens(nb_vals))) if temps else ():  # E.2b
                with kernels:
                    r["subset"][(key, dd)][:, a:b] = subset_log_prob_grid(logits, tg, tokens, temps)
            if not taus:
                continue
            # E.1: −‖W_sm[v_i] − h_ds‖² of each neighbour's token v_i
            scores = output_embedding_scores(s["queries"][key][a:b], w_sm, nb_vals)
            hit = (nb_vals == tg[:, None]) & valid
            with kernels:
                r["e1"][key][:, a:b] = sweep_temperature(np.where(valid, scores, 0).astype(np.float32), hit, valid,
                                                         taus)
        if not check:
            return 0.0
        # a float32 log-softmax (~1e-5 nats, against a 0.05-nat tolerance), in place over the logits, read no more
        target = logits[np.arange(b - a), tg]
        m = logits.max(1)
        np.subtract(logits, m[:, None], out=logits)
        lse = m + np.log(np.exp(logits, out=logits).sum(1))
        return float(np.abs(target - lse - s["lm"][a:b]).max(initial=0))

    if CHUNK % GEMM_ROWS:
        raise ValueError(f"CHUNK {CHUNK} must be a multiple of GEMM_ROWS {GEMM_ROWS}")
    spans = list(iter_chunks(t, CHUNK))
    with ThreadPoolExecutor(max(1, job.threads), thread_name_prefix="hypotheses") as pool:
        done = tqdm(pool.map(lambda ab: chunk(*ab), spans), total=len(spans), desc=f"E.1, E.2 {split}",
                    unit=" chunk", mininterval=10)
        drift = max(done, default=0.0)  # a chunk's error is raised here
    return r, drift


def speculative_temperatures(temps: list[float], rounds: int) -> list[float]:
    """Every value that `rounds` extensions of E.2's T grid `temps` (ascending) can add (_grids: half the first value
    while a T* is the first, 1.5 and 2 times the last while one is the last), computed as the extensions compute them
    (the same floats), ascending, those already in `temps` left out."""
    lo, hi, out = temps[0], temps[-1], []
    for _ in range(rounds):
        lo = lo / 2
        out += [lo, hi * 1.5, hi * 2]
        hi = hi * 2
    return sorted(set(out) - set(temps))


def _grids(job: Job, w_sm: np.ndarray, vals, keys: list[str], lp_lm: dict, steps: int, taus: list[float],
           temps: list[float]) -> tuple[dict, dict, list[float], list[float], list[int]]:
    """_per_token on both splits, with E.1's τ grid and E.2's T grid extended where a twin's tuned value sits on an
    edge, as τ's is for the kNN-LM (both sides tuned alike): while some twin's τ* is the grid's last value, the τ
    grid grows by its own span (knnlm.config.extended_temperatures); while some T* is the last (first) T, the T grid
    gains 1.5 and 2 times its last value (half its first); at most config 'temperature.max_extensions' times.
    Tuning reads valid only. Valid's one pass also computes every T an extension could add
    (speculative_temperatures), so an extension of the T grid reveals values already computed (the grid, its tuned
    values and the arrays returned are those of extending it pass by pass); an extension of the τ grid gets a pass
    for its new values. Test gets one pass at the values tuned on valid (nan at every other value of the grids).
    Returns ({split: _per_token's arrays, the grids' values in ascending order}, {split: drift}, taus, temps, ks)."""
    from ..config import extended_temperatures
    from ..scoring.interpolation import tune_temperature

    def at(values: np.ndarray) -> int:
        return tune_temperature(lp_lm["valid"], values, None, steps)

    rounds = job.cfg["temperature"]["max_extensions"]
    ks = sorted({k for k in job.cfg["hypotheses"]["topk"] if k < w_sm.shape[0]})
    computed = sorted(temps + speculative_temperatures(temps, rounds))
    r, drift = {}, {}
    full, drift["valid"] = _per_token(job, w_sm, vals, keys, taus, computed, "valid")

    def shown(values: list[float]) -> dict:  # valid's arrays at T grid `values` (ascending; computed already)
        idx = [computed.index(x) for x in values]
        return {"e1": full["e1"], "topk": full["topk"][:, idx], "subset": {c: a[idx] for c, a in full["subset"].items()}}

    for _ in range(rounds):
        v = shown(temps)
        e1 = [at(v["e1"][key]) for key in keys]
        e2 = [at(v["topk"][i]) for i in range(len(ks))] + [at(v["subset"][c]) for c in v["subset"]]
        more_taus = extended_temperatures(job.cfg, taus) if len(taus) - 1 in e1 else []
        more_temps = ([temps[0] / 2] if 0 in e2 else []) + ([temps[-1] * 1.5, temps[-1] * 2]
                                                            if len(temps) - 1 in e2 else [])
        if not (more_taus or more_temps):
            break
        log.info("E.1/E.2: a tuned value on its grid's edge: τ += %s, T += %s", more_taus, more_temps)
        missing = [x for x in more_temps if x not in computed]  # never, with rounds extensions computed ahead
        if more_taus or missing:
            x, _ = _per_token(job, w_sm, vals, keys, more_taus, missing, "valid", check=False)
            for key in keys:
                full["e1"][key] = np.concatenate([full["e1"][key], x["e1"][key]])
            order = np.argsort(computed + missing, kind="stable")
            full["topk"] = np.concatenate([full["topk"], x["topk"]], axis=1)[:, order]
            for c in full["subset"]:
                full["subset"][c] = np.concatenate([full["subset"][c], x["subset"][c]])[order]
            computed = [(computed + missing)[i] for i in order]
        taus, temps = taus + more_taus, sorted(temps + more_temps)
    r["valid"] = v = shown(temps)
    # test measures only: each twin at its value tuned on valid (the other grid values stay nan)
    ti = sorted({at(v["e1"][key]) for key in keys})
    tj = sorted({at(v["topk"][i]) for i in range(len(ks))} | {at(v["subset"][c]) for c in v["subset"]})
    x, drift["test"] = _per_token(job, w_sm, vals, keys, [taus[i] for i in ti], [temps[j] for j in tj], "test")
    t = x["topk"].shape[-1]
    r["test"] = {"e1": {key: np.full((len(taus), t), np.nan) for key in keys},
                 "topk": np.full((len(ks), len(temps), t), np.nan),
                 "subset": {c: np.full((len(temps), t), np.nan) for c in v["subset"]}}
    for key in keys:
        r["test"]["e1"][key][ti] = x["e1"][key]
    r["test"]["topk"][:, tj] = x["topk"]
    for c in v["subset"]:
        r["test"]["subset"][c][tj] = x["subset"][c]
    return r, drift, taus, temps, ks


def _base_lm(job: Job) -> tuple[dict, dict, dict]:
    """The base LM on every valid and test token: ({split: [T] float64 log p_LM(target)}, {split: (doc [T] document
    of each token, doc_words [D])} (split_documents), {split: words}) from inputs 'lm_logprobs' and 'documents'."""
    lp_lm = {s: np.load(p).astype(np.float64) for s, p in by_split(job, "lm_logprobs").items()}
    docs = {s: split_documents(job, s) for s in SPLITS}
    return lp_lm, docs, {s: int(docs[s][1].sum()) for s in SPLITS}


def _tune(lp_lm: dict, per: dict, words: dict, steps: int) -> tuple[int, dict]:
    """(index of the candidate with the lowest valid interpolated NLL at its best λ,
    knnlm.scoring.interpolation.tune_temperature: ties go to the first; its evaluate() result); per = {split: [n, T]
    log p of each candidate}."""
    from ..scoring.interpolation import tune_temperature

    best = tune_temperature(lp_lm["valid"], np.asarray(per["valid"]), None, steps)
    return best, evaluate(lp_lm, {s: per[s][best] for s in SPLITS}, words, steps)


def hypotheses(job: Job) -> dict:
    """E.1-E.4 (Xu et al. 2023, App. E): table 'hypotheses' (every variant's perplexity and comparisons with CIs)
    and its comparisons CSV (read by findings)."""
    from ..scoring.analysis import (argmaxable, document_positions, position_fraction, quarter_difference,
                                    quarter_sums, window_positions)
    from ..statistics.regression import correlation_of, regression_leverage, regression_sums
    from ..config import temperatures
    from .parametric import output_matrix

    t0 = time.time()
    cfg, hyp, st = job.cfg, job.cfg["hypotheses"], stats_options(job)
    steps = cfg["knn"]["lambda_steps"]
    scores = {sc["key_type"]: sc for sc in (read_checked_json(p, "score") for p in job.paths("scores"))}
    keys = sorted(scores, key=["att", "ffn"].index)
    metric = next(iter(scores.values()))["metric"]
    w_sm = output_matrix(job).numpy().astype(np.float32)
    vals = np.load(job.path("vals"), mmap_mode="r")
    taus = [t for t in temperatures(cfg) if t > 0] or [1.0]
    temps = sorted(hyp["sparsify_temperatures"])
    lp_lm, docs, words = _base_lm(job)
    per, drift, taus, temps, ks = _grids(job, w_sm, vals, keys, lp_lm, steps, taus, temps)
    if max(drift["valid"], drift["test"]) > 0.05:
        raise ArtifactError(f"log softmax(W_sm h_ffn) differs from the dumped log p_LM by up to "
                            f"{max(drift['valid'], drift['test']):.3f} nats: W_sm or the ffn queries are not the LM's")
    variants = {}  # name -> (labels, {split: log p interpolated}, evaluate result)

    def add(name, labels, lp_alt):
        ev = evaluate(lp_lm, lp_alt, words, steps)
        variants[name] = (labels, {s: interpolate(lp_lm[s], lp_alt[s], ev["lambda"]) for s in SPLITS}, ev)

    edges = {}  # variant -> "τ* on the grid edge" and the like: flagged in its comparison rows

    def edge_of(i: int, grid: list, what: str, lam: float) -> str:
        # λ* = 0: the variant gets no weight, every value of the grid ties and the first is taken: not an edge
        return f"{what} on the grid edge ({grid[i]:g} of {grid[0]:g} … {grid[-1]:g})" if len(grid) > 1 and i in (
            0, len(grid) - 1) and lam > 0 else ""

    for key in keys:  # the kNN-LM of Table 1: at the config τ (for reference) and at τ* tuned on valid (like for like)
        sc = scores[key]
        add(f"kNN-LM {key}", {"section": "Table 1", "variant": f"kNN-LM {key}/{METRIC_NAME[metric]}",
                              "τ / T": f"{cfg['knn']['temperature']:g}"},
            {s: np.load(by_split(job, f"knn_{key}")[s]).astype(np.float64) for s in SPLITS})
        tau = sc["tuned"]["temperature"]
        add(f"kNN-LM {key} τ*", {"section": "Table 1", "variant": f"kNN-LM {key}/{METRIC_NAME[metric]}, τ tuned",
                                 "τ / T": f"{tau:g}" + (" (grid edge)" if sc["tuned"].get("tau_edge") else "")},
            {s: np.load(by_split(job, f"knn_tuned_{key}")[s]).astype(np.float64) for s in SPLITS})
        if sc["tuned"].get("tau_edge"):
            edges[f"kNN-LM {key} τ*"] = f"the kNN-LM's τ* = {tau:g} on its grid's edge"
    for key in keys:
        i, ev = _tune(lp_lm, {s: per[s]["e1"][key] for s in SPLITS}, words, steps)
        edges[f"W_sm distance {key}"] = edge_of(i, taus, "the twin's τ*", ev["lambda"])
        add(f"W_sm distance {key}", {"section": "E.1", "variant": f"−‖W_sm[v] − h_{key}‖² of the retrieved tokens",
                                     "τ / T": f"{taus[i]:g}" + (" (grid edge)" if edges[f"W_sm distance {key}"] else "")},
            {s: per[s]["e1"][key][i] for s in SPLITS})
    for i, k in enumerate(ks):
        j, ev = _tune(lp_lm, {s: per[s]["topk"][i] for s in SPLITS}, words, steps)
        edges[f"LM top-{k}"] = edge_of(j, temps, "T*", ev["lambda"])
        add(f"LM top-{k}", {"section": "E.2", "variant": f"LM's top {k} tokens, renormalised",
                            "τ / T": f"{temps[j]:g}"}, {s: per[s]["topk"][i, j] for s in SPLITS})
    for key in keys:
        for dd in (False, True):
            name = f"retrieved set {key}" + (" (dedup)" if dd else "")
            j, ev = _tune(lp_lm, {s: per[s]["subset"][(key, dd)] for s in SPLITS}, words, steps)
            edges[name] = edge_of(j, temps, "T*", ev["lambda"])
            add(name, {"section": "E.2", "variant": f"LM restricted to the tokens retrieved with {key} keys"
                       + (", duplicates removed" if dd else ", weighted by count"),
                       "τ / T": f"{temps[j]:g}"}, {s: per[s]["subset"][(key, dd)][j] for s in SPLITS})
    names = ["base"] + list(variants)
    pairs = [(n, "base") for n in variants]
    for key in keys:  # each twin (tuned on valid) against the kNN-LM tuned on the same valid tokens, and at config τ
        twins = [n for n in variants if not n.startswith("kNN-LM") and n.split(" (")[0].endswith(key)]
        pairs += [(f"kNN-LM {key} τ*", n) for n in twins] + [(f"kNN-LM {key}", n) for n in twins]
    ci, cmp_rows = {}, []
    for split in SPLITS:
        doc, doc_words = docs[split]
        lps = [lp_lm[split]] + [v[1][split] for v in variants.values()]
        ci[split] = compare(per_document(-np.stack(lps), doc, len(doc_words)), doc_words, names, pairs, st)
        for r in comparison_rows(ci[split], split=split):
            a, b = r["comparison"].split(" vs ", 1)
            r["flag"] = "; ".join(f for f in (edges.get(a, ""), edges.get(b, "")) if f)
            if a.startswith("kNN-LM ") and not a.endswith("τ*") and b != "base":
                r["flag"] = "; ".join(f for f in (r["flag"], "the kNN-LM at the config τ, the twin tuned") if f)
            cmp_rows.append(r)
    rows = []
    for split in ("test", "valid"):
        c = ci[split]
        for name, (labels, _, ev) in variants.items():
            row = {"split": split, **labels, "λ": ev["lambda"], "interp PPL (word)": ev[split]["interp"]["ppl_word"],
                   "95% CI (word)": fmt_ci(c["ppl"][name]), "vs base (95% CI)": fmt_ci(c["diff"][f"{name} vs base"], pct=True)}
            ref = next((f"kNN-LM {k} τ* vs {name}" for k in keys if f"kNN-LM {k} τ* vs {name}" in c["diff"]), None)
            row["kNN-LM vs this (95% CI)"] = fmt_ci(c["diff"][ref], pct=True) if ref else "-"
            row["documents"] = str(c["documents"])
            rows.append(row)
    # E.3: location within the context window and the document, on both splits (valid gives the margins, findings)
    key0 = "att" if "att" in keys else keys[0]
    setting = f"{key0}/{METRIC_NAME[metric]}"  # Table 1's setting of the kNN-LM whose gain is measured
    for split in ("test", "valid"):
        doc, doc_words = docs[split]
        man = read_checked_json(by_split(job, "queries_manifest")[split], "queries_manifest")
        t = len(lp_lm[split])
        in_window = window_positions(t, man["tokens_per_sample"], man["context_window"])
        in_doc = document_positions(doc)
        # the window's quarters over the tokens scored with a full context window (C to L - 1 tokens of context): the
        # split's first block, with fewer, would be the only first-quarter tokens (one document: no interval)
        full = position_fraction(in_window, lo=man["context_window"], hi=man["tokens_per_sample"] - 1)
        at_config = f"kNN-LM gain at τ = {cfg['knn']['temperature']:g}"
        on = f"{setting} kNN-LM (Table 1's), {split} tokens"
        ys = {"base-LM NLL": (-lp_lm[split], {"on": f"the base LM, {split} tokens"}),  # the kNN-LM's gain at the
              at_config: (variants[f"kNN-LM {key0}"][1][split] - lp_lm[split],  # config τ and at τ* (per token, nats)
                          {"on": on, "τ settings": setting, "τ source": "table1"}),
              "kNN-LM gain at τ*": (variants[f"kNN-LM {key0} τ*"][1][split] - lp_lm[split], {"on": on})}
        for y_name in (at_config, "kNN-LM gain at τ*"):  # what the effects are judged against
            y, labels = ys[y_name]
            sums = np.stack([np.bincount(doc, weights=y, minlength=len(doc_words)),
                             np.bincount(doc, minlength=len(doc_words)).astype(np.float64)], axis=1)
            v, lo, hi = jackknife_sums(lambda s_: (s_[..., 0] / s_[..., 1])[..., None], sums, sums[:, 1], st)
            cmp_rows.append(statistic_row(f"{y_name}: mean per token", v[0], lo[0], hi[0], len(doc_words),
                                          st["min_documents"], effective_documents(sums[:, 1]), st.get("scheme", ""),
                                          split=split, **labels))
        for pos_name, pos, frac in (("context window", in_window, full),
                                    ("document", in_doc, position_fraction(in_doc, doc))):
            lev = regression_leverage(pos, doc, len(doc_words))
            for y_name, (y, labels) in ys.items():
                qs = quarter_sums(frac, y, doc, len(doc_words))
                v, lo, hi = jackknife_sums(quarter_difference, qs, qs[:, 1] + qs[:, 3], st)
                name = f"{y_name}: last minus first quarter of positions in the {pos_name}"
                cmp_rows.append(statistic_row(name, v[0], lo[0], hi[0], len(doc_words), st["min_documents"],
                                              effective_documents(qs[:, 1] + qs[:, 3]), st.get("scheme", ""),
                                              split=split, **labels))
                if split == "test":
                    rows.append({"split": split, "section": "E.3", "variant": name + " (nats per token)",
                                 "τ / T": "-", "λ": "-", "interp PPL (word)": "-",
                                 "95% CI (word)": f"{v[0]:+.4f} [{lo[0]:+.4f}, {hi[0]:+.4f}]", "vs base (95% CI)": "-",
                                 "kNN-LM vs this (95% CI)": "-", "documents": str(len(doc_words))})
                if y_name == "kNN-LM gain at τ*":
                    continue  # Pearson's r beside the paper's two (base LM, kNN-LM at the config τ)
                sums = regression_sums(pos, y, doc, len(doc_words))
                v, lo, hi = jackknife_sums(correlation_of, sums, lev, st)
                name = f"correlation of {y_name} with position in the {pos_name}"
                cmp_rows.append(statistic_row(name, v[0], lo[0], hi[0], len(doc_words), st["min_documents"],
                                              effective_documents(lev), st.get("scheme", ""), split=split,
                                              **{**labels, "n_eff of": DESIGN_N_EFF}))
                if split == "test":
                    rows.append({"split": split, "section": "E.3", "variant": name + " (Pearson r)", "τ / T": "-",
                                 "λ": "-", "interp PPL (word)": "-",
                                 "95% CI (word)": f"{v[0]:+.3f} [{lo[0]:+.3f}, {hi[0]:+.3f}]",
                                 "vs base (95% CI)": "-", "kNN-LM vs this (95% CI)": "-",
                                 "documents": str(len(doc_words))})
    # E.4: stolen probabilities
    arg = argmaxable(w_sm, hyp["max_lp_words"])
    n_bad, n_open = len(arg["unargmaxable"]), len(arg["unresolved"])
    cmp_rows.append({"split": "test", "comparison": "un-argmaxable words of W_sm", "relative difference": n_bad,
                     "CI low": n_bad, "CI high": n_bad + n_open,
                     "verdict": "unresolved" if n_open else ("none" if n_bad == 0 else "some"), "documents": None,
                     "on": "the output matrix W_sm"})
    rows.append({"split": "test", "section": "E.4", "variant": "un-argmaxable words of W_sm", "τ / T": "-", "λ": "-",
                 "interp PPL (word)": "-", "95% CI (word)": f"{n_bad} of {arg['rows']:,}"
                 + (f" ({n_open} unresolved)" if n_open else ""),
                 "vs base (95% CI)": "-", "kNN-LM vs this (95% CI)": "-", "documents": "-"})
    df = pd.DataFrame(rows)
    cap = (f"Rejected hypotheses without new training ({cfg['name']}; Xu et al. 2023, Sec. 6, App. E.1-E.4), on every "
           f"valid and test token; the kNN-LM rows are Table 1's ({'/'.join(keys)} keys, {METRIC_NAME[metric]}, τ = "
           f"{cfg['knn']['temperature']:g}, and at τ* tuned on valid: 'kNN-LM vs this' compares each row with it, "
           f"both sides tuned on the same valid tokens). E.1: the kNN scores of the full store's FAISS neighbours replaced by "
           f"−‖W_sm[v_i] − h_ds‖² of each neighbour's token v_i, τ tuned on valid over {taus[0]:g} … {taus[-1]:g} (the "
           f"grid extended while a twin's τ* sat on its last value, as the kNN-LM's) "
           f"('τ / T'). E.2: the LM's own distribution sparsified, (a) to its top k tokens, (b) to the tokens the kNN "
           f"search retrieved (their distances ignored; 'weighted by count' keeps duplicates), renormalised at a "
           f"temperature T chosen on valid from {', '.join(f'{x:g}' for x in temps)} (config "
           f"{', '.join(f'{x:g}' for x in hyp['sparsify_temperatures'])}, extended at an edge where a T* sat); λ tuned "
           f"on valid for every row. E.3: "
           f"how the base LM's per-token NLL and the kNN-LM's gain (log p interpolated − log p_LM, nats) change with "
           f"the token's position in its context window (tokens of context it was scored with; the quarters of "
           f"{man['context_window']} … {man['tokens_per_sample'] - 1}, the tokens scored with a full context window, "
           f"so the split's first block is left out) and in its document: "
           f"the mean over the last quarter of positions minus the mean over the first (test tokens; the paper finds "
           f"no correlation: the findings test it against a margin derived on valid, a tenth of the kNN-LM's mean gain "
           f"per token and never less than the row's own CI half-width there), for the kNN-LM at τ = "
           f"{cfg['knn']['temperature']:g} and at its τ* (the gain measured against the base LM's own NLL), with "
           f"Pearson's r beside it. E.4: words of W_sm that cannot be the argmax of W_sm·h for any h (a quick "
           f"witness search, then an LP per remaining word, scipy/HiGHS, at most {hyp['max_lp_words']} LPs; Grivas "
           f"et al. 2022): {arg['witness']:,} proven argmaxable by a witness, {arg['lp_checked']} by LP. "
           f"log softmax(W_sm h_ffn) matches the dumped log p_LM to {max(drift['valid'], drift['test']):.1e} nats. "
           f"{ci_caption(st, documents_label(job))}; correlations: jackknife t on the linear scale (coverage: "
           f"docs/statistics.md). {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "App. E.1-E.4: rejected hypotheses", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp_rows), job.path("cmp_csv"))
    metrics = {"unargmaxable": n_bad, "seconds": time.time() - t0}
    metrics.update({f"test_ppl_{n.replace(' ', '_').replace('(', '').replace(')', '')}": v[2]["test"]["interp"]["ppl_word"]
                    for n, v in variants.items()})
    return {"metrics": metrics, "artifacts": [str(job.path(n)) for n in ("csv", "md", "cmp_csv")]}


def interpolated_loss(job: Job) -> dict:
    """E.6.3 (Xu et al. 2023, App. E.6.3, Eq. 12): W_ds trained on the interpolated loss (parametric variant
    'iloss<100 λ>') against W_ds on the plain loss (nv1), same key type, rows and training schedule; each
    interpolated with the base LM at its own λ tuned on valid. Table 'interpolated_loss' and its comparisons CSV."""
    from ..parametric import converged_label  # here: the other jobs of this module never load torch

    cfg, st = job.cfg, stats_options(job)
    steps = cfg["knn"]["lambda_steps"]
    keys = [k for k in ("att", "ffn") if job.input.get(f"iloss_result_{k}")]
    lp_lm, docs, words = _base_lm(job)
    models, lps = {}, {}
    for key in keys:
        for tag, label in (("iloss", f"W_ds interpolated loss {key}"), ("w_ds", f"W_ds {key}")):
            res = read_json(job.path(f"{tag}_result_{key}"))
            lp = {s: np.load(p).astype(np.float64) for s, p in by_split(job, f"{tag}_{key}").items()}
            ev = evaluate(lp_lm, lp, words, steps)
            models[label] = (key, res, ev)
            lps[label] = {s: interpolate(lp_lm[s], lp[s], ev["lambda"]) for s in SPLITS}
    names = ["base"] + list(models)
    pairs = [(n, "base") for n in models] + [(f"W_ds interpolated loss {k}", f"W_ds {k}") for k in keys]
    rows, cmp_rows = [], []
    for split in SPLITS:
        doc, doc_words = docs[split]
        c = compare(per_document(-np.stack([lp_lm[split]] + [lps[n][split] for n in models]), doc, len(doc_words)),
                    doc_words, names, pairs, st)
        for r in comparison_rows(c, split=split):
            key = r["comparison"].split(" vs ")[0].rsplit(" ", 1)[-1]
            res = models[f"W_ds interpolated loss {key}"][1]
            hist = res.get("history", {})
            cmp_rows.append({**r, "converged": converged_label(hist), "steps": hist.get("steps", 0),
                             "epochs": round(hist.get("epochs", 0), 2), "train rows": res["train_rows"]})
        for name, (key, res, ev) in models.items():
            hist = res.get("history", {})
            vs = c["diff"].get(f"{name} vs W_ds {key}")
            rows.append({"split": split, "model": name, "h_ds": key,
                         "training loss": (f"interpolated, λ = {res['spec']['interp_loss']:g} (Eq. 12)"
                                           if res["spec"].get("interp_loss") else "plain cross-entropy"),
                         "train rows": res["train_rows"], "steps": hist.get("steps", 0),
                         "epochs": round(hist.get("epochs", 0), 2), "converged": converged_label(hist),
                         "PPL alone (word)": ev[split]["knn"]["ppl_word"], "λ": ev["lambda"],
                         "interp PPL (word)": ev[split]["interp"]["ppl_word"],
                         "oracle PPL (word)": ev[split]["oracle"]["ppl_word"],
                         "95% CI (word)": fmt_ci(c["ppl"][name]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{name} vs base"], pct=True),
                         "vs plain W_ds (95% CI)": fmt_ci(vs, pct=True) if vs else "-",
                         "documents": str(c["documents"])})
    df = pd.DataFrame(rows)
    df["split"] = pd.Categorical(df["split"], ["test", "valid"])
    df = df.sort_values("split", kind="stable").astype({"split": str})
    lam = next((m[1]["spec"]["interp_loss"] for m in models.values() if m[1]["spec"].get("interp_loss")), None)
    cap = (f"Training W_ds on the interpolated loss ({cfg['name']}; Xu et al. 2023, App. E.6.3, Eq. 12): W_ds trained "
           f"on −log(λ p_W_ds(y) + (1 − λ) p_LM(y)) with λ = {lam:g} (p_LM from the frozen base LM) against W_ds on the "
           f"plain loss, the same rows, epochs and early stopping (on the same interpolated loss on valid); each then "
           f"interpolated with the base LM at its own λ tuned on valid ('λ'). The paper finds no gain. "
           f"{ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), "App. E.6.3: W_ds on the interpolated loss", cap,
                note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp_rows), job.path("cmp_csv"))
    return {"metrics": {f"test_interp_ppl_{n.replace(' ', '_')}": m[2]["test"]["interp"]["ppl_word"]
                        for n, m in models.items()},
            "artifacts": [str(job.path(n)) for n in ("csv", "md", "cmp_csv")]}


def _other_lms(job: Job) -> list[str]:
    """The names of the LMs other than the base LM among the job's inputs ('lm_<name>'), in input order."""
    return [k[len("lm_"):] for k in job.input if k.startswith("lm_") and k not in ("lm_logprobs", "lm_training")]


def _load_lms(job: Job, others: list[str], key: str) -> tuple[dict, dict, dict, dict]:
    """(lp {'base' and each of `others`: {split: [T] float64 log p(target)}}, docs, words (as _base_lm), knn {split:
    [T] float64 log p_kNN}) from inputs 'lm_logprobs', 'targets', 'lm_<name>', 'targets_<name>', 'knn', 'documents'.
    Raises ArtifactError when an LM's targets differ from the base LM's (another tokenisation; `key` is the config
    key that named the LM)."""
    lp_base, docs, words = _base_lm(job)
    lp = {"base": lp_base}
    tg = {s: np.load(p) for s, p in by_split(job, "targets").items()}
    for n in others:
        lp[n] = {s: np.load(p).astype(np.float64) for s, p in by_split(job, f"lm_{n}").items()}
        for s, p in by_split(job, f"targets_{n}").items():
            if not np.array_equal(np.load(p), tg[s]):
                raise ArtifactError(f"{p}: LM {n!r} scores other tokens than the base LM on {s} (another tokenisation "
                                    f"or data); config key '{key}' needs LMs over this run's tokens")
    knn = {s: np.load(p).astype(np.float64) for s, p in by_split(job, "knn").items()}
    return lp, docs, words, knn


def knn_component(job: Job) -> str:
    """How a caption names the kNN component of E.5 and E.6 (input 'knn': Table 1's full store at its τ* tuned on
    valid, input 'score'): 'τ* = 0.75 (tuned on valid)', with '(on its grid's edge)' when τ* sat on the grid's edge."""
    tuned = read_checked_json(job.path("score"), "score")["tuned"]
    return f"τ* = {tuned['temperature']:g} (tuned on valid" + ("; on its grid's edge)" if tuned.get("tau_edge") else ")")


def _trainings(job: Job) -> dict[str, dict]:
    """{LM name: its training.json (knnlm.lm.training.convergence)} of the job's input 'lm_training' files (lms/<name>/)."""
    files = job.paths("lm_training") if job.input.get("lm_training") else []
    return {p.parent.name: read_checked_json(p, "lm_training") for p in files}


def memorised_below() -> float:
    """E.6.1's premise threshold from the claims table ('premises.memorised.below', with the paper's words): an LM
    memorised its training set when its training perplexity is under this share of its valid perplexity."""
    from .findings import claims_document, CLAIMS_FILE

    return float(claims_document(CLAIMS_FILE)["premises"]["memorised"]["below"])


def memorisation(name: str, training: dict | None) -> dict:
    """E.6.1's check that an 'overfitted' LM overfitted: the comparison row 'memorisation of <name>' with its last
    training perplexity (token; fairseq's last logged training loss, dropout as trained) over its valid perplexity
    at its last evaluation, and verdict 'memorised' when the ratio is under memorised_below() (the paper trained until the
    training loss was near zero), 'not memorised' otherwise, 'unknown' without a training record."""
    row = {"split": "test", "comparison": f"memorisation of {name}: train / valid perplexity (token)",
           "documents": None, "on": "its training log"}
    if not training or training.get("train_loss_last") is None or not training.get("valid"):
        return {**row, "relative difference": float("nan"), "CI low": float("nan"), "CI high": float("nan"),
                "verdict": "unknown"}
    train, valid = 2.0 ** training["train_loss_last"], training["valid"][-1][1]
    ratio = train / valid
    return {**row, "relative difference": ratio, "CI low": ratio, "CI high": ratio,
            "verdict": "memorised" if ratio < memorised_below() else "not memorised",
            "on": f"train PPL {train:.2f}, valid PPL {valid:.2f} (token) after {training['updates']:,} updates"}


def _with_base(job: Job, members: list[str], refs: list[str], key: str, title: str, cap: str,
               extra_rows: list[dict] = (), premises: dict[str, str] | None = None,
               twins: dict[str, list[str]] | None = None) -> dict:
    """App. E.6.1 / E.6.2: each LM of `members` (and of `refs`, the reference LMs it is compared with) alone and
    interpolated with the base LM (weights tuned on valid by EM, knnlm.scoring.analysis.mixture_weights), with its
    oracle (per token the better of the base LM and it), against the kNN-LM (base LM + the kNN component of Table 1,
    tuned the same way). Writes outputs 'csv', 'md' (the table, caption `cap` + the CI method) and 'cmp_csv'
    (comparisons 'base + X vs base alone', 'base + X vs kNN-LM', 'kNN-LM vs base alone', and for each member and
    reference R of it in `twins` ({member: its references}; default: every reference), 'base + M vs base + R
    (one-hot)'; a reference R is labelled 'R (one-hot)' everywhere), paired over documents; then `extra_rows` (memorisation). premises: {LM: why the paper's premise fails for it} set as column
    'premise' of every comparison naming that LM (the findings then test none of them and count them apart). Raises
    ArtifactError as _load_lms (config key `key`)."""
    from ..scoring.analysis import mixture_log_prob, mixture_weights
    from ..scoring.interpolation import oracle_log_prob, summarize

    st = stats_options(job)
    lp, docs, words, knn = _load_lms(job, members + refs, key)
    lp["kNN"] = knn
    trained = _trainings(job)
    mixes = {}  # name -> ({split: log p}, weights, members)
    label = {**{n: n for n in members}, **{r: f"{r} (one-hot)" for r in refs}}

    def mix(name, comps):
        per = {s: [lp[m][s] for m in comps] for s in SPLITS}
        w = mixture_weights(per["valid"])
        mixes[name] = ({s: mixture_log_prob(per[s], w) for s in SPLITS}, w, comps)

    mix("base alone", ["base"])
    mix("kNN-LM", ["base", "kNN"])
    for n in members + refs:
        mix(f"{label[n]} alone", [n])
        mix(f"base + {label[n]}", ["base", n])
    names = list(mixes)
    pairs = [("kNN-LM", "base alone")] + [(f"base + {label[n]}", "base alone") for n in members + refs]
    pairs += [(f"base + {label[n]}", "kNN-LM") for n in members + refs]
    pairs += [(f"base + {m}", f"base + {label[r]}") for m in members for r in (refs if twins is None else twins[m])]
    ci, rows, cmp_rows = {}, [], []
    for split in SPLITS:
        doc, doc_words = docs[split]
        ci[split] = compare(per_document(-np.stack([mixes[n][0][split] for n in names]), doc, len(doc_words)),
                            doc_words, names, pairs, st)
        for r in comparison_rows(ci[split], split=split):
            r["premise"] = "; ".join(f for n, f in (premises or {}).items() if f and f" {n} " in f" {r['comparison']} ")
            cmp_rows.append(r)
    cmp_rows += list(extra_rows)
    for split in ("test", "valid"):
        c = ci[split]
        for n in names:
            lps, w, comps = mixes[n]
            lm = comps[-1]
            t = trained.get(lm, {})
            rows.append({"split": split, "model": n, "components": " + ".join(comps),
                         "weights (valid)": " / ".join(f"{x:.2f}" for x in w),
                         "updates": f"{t['updates']:,}" if "updates" in t and lm not in ("base", "kNN") else "-",
                         "train PPL (token, last logged)": (round(2.0 ** t["train_loss_last"], 3)
                                                            if t.get("train_loss_last") is not None else "-"),
                         "PPL (word)": summarize(lps[split], words[split])["ppl_word"],
                         "oracle PPL (word)": (summarize(oracle_log_prob(lp["base"][split], lp[lm][split]),
                                                         words[split])["ppl_word"] if len(comps) == 2 else None),
                         "95% CI (word)": fmt_ci(c["ppl"][n]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base alone"], pct=True)
                         if f"{n} vs base alone" in c["diff"] else "-",
                         "vs kNN-LM (95% CI)": fmt_ci(c["diff"][f"{n} vs kNN-LM"], pct=True)
                         if f"{n} vs kNN-LM" in c["diff"] else "-",
                         "documents": str(c["documents"])})
    cap = f"{cap} {ci_caption(st, documents_label(job))}. {job.cfg.get('profile', {}).get('caption', '')}"
    write_table(pd.DataFrame(rows), job.path("csv"), job.path("md"), title, cap, note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp_rows), job.path("cmp_csv"))
    return {"metrics": {f"test_ppl_{n.replace(' ', '_').replace('+', 'plus')}": summarize(mixes[n][0]["test"],
                                                                                        words["test"])["ppl_word"]
                        for n in names},
            "artifacts": [str(job.path(n)) for n in ("csv", "md", "cmp_csv")]}


def overfitting(job: Job) -> dict:
    """E.6.1 (Xu et al. 2023, App. E.6.1, Table 9): is the kNN-LM a memory of the training set that an overfitted LM
    would give too? The LMs of config 'hypotheses.overfit_lms' continue training the base LM ('lms.<name>.init_from',
    typically dropout 0 and the last checkpoint, chained entries as checkpoints along the way); each alone,
    interpolated with the base LM and its oracle, against the kNN-LM (Table 1's kNN component: full store, Table 3's
    key type and metric, at its τ* tuned on valid). Inputs as ensembling, plus each LM's 'lm_training' (updates and
    last training perplexity, how far the overfitting went)."""
    cfg = job.cfg
    members = list(cfg["hypotheses"]["overfit_lms"])
    trained = _trainings(job)
    reach = "; ".join(f"{n}: {trained[n]['updates']:,} updates, last training perplexity "
                      f"{2.0 ** trained[n]['train_loss_last']:.2f}" for n in members
                      if n in trained and trained[n].get("train_loss_last") is not None)
    cap = (f"Is the kNN-LM just memorisation? ({cfg['name']}; Xu et al. 2023, App. E.6.1, Table 9): the base LM trained "
           f"further on the training set to overfit it ({', '.join(members)}: config 'hypotheses.overfit_lms', entries of "
           f"'lms' with 'init_from'; {reach or 'training not recorded'}; 'train PPL' is fairseq's last logged training "
           f"perplexity per token, which the paper drives near 1), each alone, interpolated with the base LM and its "
           f"oracle (per token the better of the two), against the kNN-LM (base LM + the kNN component of Table 1, "
           f"full store, {knn_component(job)}); every mixture's weights tuned on valid by EM. The paper: "
           f"interpolated 21.732 (Overfit@92 epochs) and 21.733 (@129) vs base 21.750 and kNN-LM 19.174 (att/L2). "
           f"An LM memorised its training set when its training perplexity is under {memorised_below():g}× its valid "
           f"perplexity; the comparisons of an LM that did not are not tested (the paper's premise is absent: it "
           f"would test another regime than the paper's) and count apart in the findings.")
    mem = [memorisation(n, trained.get(n)) for n in members]
    premises = {n: f"{n} did not memorise, {m['on']}" for n, m in zip(members, mem) if m["verdict"] != "memorised"}
    return _with_base(job, members, [], "hypotheses.overfit_lms", "Table 9: overfitted LMs vs the kNN-LM", cap,
                      extra_rows=mem, premises=premises)


def soft_labels(job: Job) -> dict:
    """E.6.2 (Xu et al. 2023, App. E.6.2): is the kNN-LM's gain the soft labels of a distillation? The LMs of config
    'hypotheses.soft_label_lms' are fresh LMs trained on the base LM's distribution mixed with the one-hot label
    ('lms.<name>.teacher', knnlm.lm.soft_labels); each alone and interpolated with the base LM, against the kNN-LM and
    against the LMs of 'hypotheses.ensemble_lms' (trained on one-hot labels: the same second-LM ensemble without soft
    labels). Inputs as ensembling, 'lm_<name>' for both kinds."""
    cfg, hyp = job.cfg, job.cfg["hypotheses"]
    members = list(hyp["soft_label_lms"])
    refs = [n for n in _other_lms(job) if n not in members]
    twins = {m: [r for r in refs if one_hot_twin(cfg["lms"][m], cfg["lms"][r])] for m in members}
    weights = ", ".join(f"{n}: w = {cfg['lms'][n]['soft_label_weight']:g}" for n in members)
    cap = (f"Are soft labels the key? ({cfg['name']}; Xu et al. 2023, App. E.6.2): fresh LMs trained on the label "
           f"(1 − w)·one-hot + w·p_base (the base LM's distribution; {weights}: config 'hypotheses.soft_label_lms', "
           f"entries of 'lms' with 'teacher'), each alone and interpolated with the base LM"
           + (f", against LMs trained on one-hot labels ({', '.join(refs)}: 'hypotheses.ensemble_lms')" if refs else "")
           + f" and against the kNN-LM (base LM + the kNN component of Table 1, full store, {knn_component(job)}); "
           f"every mixture's weights tuned on valid by EM; 'oracle' = per token the better "
           f"of the base LM and the other component. The paper: soft labels from the base LM do not help the "
           f"interpolated perplexity at all (no numbers given).")
    pairs = "; ".join(f"{m} vs {', '.join(twins[m]) or 'none'}" for m in members)
    cap += (f" 'base + M vs base + R (one-hot)' compares each soft-label LM with its one-hot twin only, an LM of the "
            f"same architecture, seed and budget trained on one-hot labels ({pairs}).")
    return _with_base(job, members, refs, "hypotheses.soft_label_lms", "App. E.6.2: soft-label LMs vs the kNN-LM", cap,
                      twins=twins)


def one_hot_twin(soft: dict, other: dict) -> bool:
    """Whether config entry `other` of 'lms' is the one-hot twin of soft-label LM `soft` (App. E.6.2): trained by this
    run with the same 'lm' overrides (architecture, seed, budget), start and checkpoint, and no teacher."""
    keys = ("source", "lm", "init_from", "checkpoint")
    return not other.get("teacher") and all((soft.get(k) or None) == (other.get(k) or None) for k in keys)


TWIN_KEYS = ("source", "init_from", "checkpoint", "teacher", "tokens_per_sample", "path", "revision")  # besides 'lm'


def seed_twin(base: dict, other: dict) -> bool:
    """Whether config entry `other` of 'lms' is the base LM's entry `base` trained with another random seed and nothing
    else changed (App. E.5's "another identical LM, trained with another random seed"): both trained by this run, the
    same 'lm' overrides but 'seed' (architecture, budget, schedule), start, checkpoint, context and no teacher, and
    another seed. A Hugging Face or imported LM is nobody's seed twin."""
    la, lb = dict(base.get("lm") or {}), dict(other.get("lm") or {})
    return (base.get("source") == "train" and all((base.get(k) or None) == (other.get(k) or None) for k in TWIN_KEYS)
            and la.pop("seed", None) != lb.pop("seed", None) and la == lb)


def _lm_relation(cfg: dict, base: str, other: str) -> str:
    """How LM `other` of config 'lms' relates to the base LM `base` (the comparisons' 'reference' column of Table 8,
    which the claims table's 'ref' selects on): 'identical LM (another seed)' for a seed twin (seed_twin), else
    'another LM (…)' naming what differs."""
    a, b = cfg["lms"].get(base, {}), cfg["lms"].get(other, {})
    if seed_twin(a, b):
        return f"identical LM (another seed: {(b.get('lm') or {}).get('seed')})"
    la, lb = a.get("lm") or {}, b.get("lm") or {}
    diff = sorted(k for k in set(la) | set(lb) if k != "seed" and la.get(k) != lb.get(k))
    diff += sorted(k for k in TWIN_KEYS if (a.get(k) or None) != (b.get(k) or None))
    return f"another LM ({', '.join(diff) or 'the same entry'} differ{'s' if len(diff) == 1 else ''})"


def ensemble_reference(cfg: dict, base: str, others: list[str], comparison: str) -> str:
    """The 'reference' column of a Table 8 / Figure 8 comparison: for one other LM ('base + X …', 'X alone …') how it
    relates to the base LM (_lm_relation); for Figure 8's 'K−1 LMs + kNN vs K LMs' (the base LM and the first K − 1 of
    `others`) 'identical LMs (another seed each)' when each is a seed twin, else 'with another LM (names)'; '-' for
    the rest (the kNN-LM vs the base LM)."""
    m = re.match(r"(\d+) LMs? \+ kNN vs (\d+) LMs", comparison)
    if m:
        members = others[:int(m.group(2)) - 1]
        odd = [n for n in members if not seed_twin(cfg["lms"].get(base, {}), cfg["lms"].get(n, {}))]
        return f"with another LM ({', '.join(odd)})" if odd else "identical LMs (another seed each)"
    named = [n for n in others if f"base + {n} " in f"{comparison} " or comparison.startswith(f"{n} alone")]
    return _lm_relation(cfg, base, named[0]) if named else "-"


def ensembling(job: Job) -> dict:
    """E.5 (Xu et al. 2023, App. E.5, Table 8, Figure 8): is the kNN-LM just an ensemble? Other LMs of config
    'hypotheses.ensemble_lms' (entries of 'lms' over this run's tokens) against the kNN component of Table 1 (the
    full store, at its τ* tuned on valid like every mixture's weights): each LM alone, interpolated with the base LM,
    and its oracle (Table 8); the ensemble of K LMs against K − 1 LMs + the kNN component, K = 1 … M (Figure 8).
    Every mixture's weights are tuned on valid (EM, knnlm.scoring.analysis.mixture_weights). Inputs: per split
    'lm_logprobs', 'targets' (the base LM), 'lm_<name>', 'targets_<name>' (each other LM), 'knn' (p_kNN of Table 1
    at τ*), 'score' (τ*), 'documents'. Raises ArtifactError when an LM's targets differ from the base LM's (another
    tokenisation)."""
    from ..scoring.analysis import mixture_log_prob, mixture_weights
    from ..report.figures import interval_bars, pyplot, save_figure
    from ..scoring.interpolation import oracle_log_prob, summarize

    cfg, st = job.cfg, stats_options(job)
    others = _other_lms(job)
    base = job.wildcards.get("lm", next(iter(cfg["lms"])))
    lp, docs, words, knn = _load_lms(job, others, "hypotheses.ensemble_lms")
    lms = ["base"] + others
    mixes = {}  # name -> ({split: log p}, weights, members)

    def mix(name, members):
        comps = {s: [lp[m][s] if m != "kNN" else knn[s] for m in members] for s in SPLITS}
        w = mixture_weights(comps["valid"])
        mixes[name] = ({s: mixture_log_prob(comps[s], w) for s in SPLITS}, w, members)

    for n in lms:
        mix(f"{n} alone", [n])
    mix("kNN-LM", ["base", "kNN"])
    for n in others:
        mix(f"base + {n}", ["base", n])
    series = {"LMs": [], "LMs + kNN": []}

    def n_lms(k):
        return f"{k} LM" + ("s" if k > 1 else "")

    for k in range(1, len(lms) + 1):
        mix(n_lms(k), lms[:k])
        series["LMs"].append((k, n_lms(k)))
        if k >= 2:
            mix(f"{n_lms(k - 1)} + kNN", lms[:k - 1] + ["kNN"])
            series["LMs + kNN"].append((k, f"{n_lms(k - 1)} + kNN"))
    names = list(mixes)
    # Table 8's oracle: per token the better of the base LM and the other LM (never worse than either)
    oracles = {f"oracle of base + {n}": {s: oracle_log_prob(lp["base"][s], lp[n][s]) for s in SPLITS} for n in others}
    pairs = [(f"{n_lms(k - 1)} + kNN", n_lms(k)) for k in range(2, len(lms) + 1)]
    pairs += [(f"base + {n}", "kNN-LM") for n in others] + [(n, "base alone") for n in names if n != "base alone"]
    pairs += [(o, "base alone") for o in oracles]
    ci, rows, cmp_rows = {}, [], []
    for split in SPLITS:
        doc, doc_words = docs[split]
        stack = [mixes[n][0][split] for n in names] + [o[split] for o in oracles.values()]
        ci[split] = compare(per_document(-np.stack(stack), doc, len(doc_words)), doc_words, names + list(oracles),
                            pairs, st)
        for r in comparison_rows(ci[split], split=split):
            r["reference"] = ensemble_reference(cfg, base, others, r["comparison"])
            cmp_rows.append(r)
    shown = {}  # Figure 8's points that repeat a mixture of the table (the same components) are not repeated in it
    for n in names:
        shown.setdefault(tuple(mixes[n][2]), n)
    for split in ("test", "valid"):
        c = ci[split]
        for n in shown.values():
            lps, w, members = mixes[n]
            orc = (summarize(oracle_log_prob(lp["base"][split], lp[members[-1]][split] if members[-1] != "kNN"
                                             else knn[split]), words[split])["ppl_word"]
                   if len(members) == 2 and members[0] == "base" else None)
            rows.append({"split": split, "model": n, "components": " + ".join(members),
                         "weights (valid)": " / ".join(f"{x:.2f}" for x in w),
                         "PPL (word)": summarize(lps[split], words[split])["ppl_word"],
                         "oracle PPL (word)": orc, "95% CI (word)": fmt_ci(c["ppl"][n]),
                         "vs base (95% CI)": fmt_ci(c["diff"][f"{n} vs base alone"], pct=True) if n != "base alone" else "-",
                         "documents": str(c["documents"])})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    for label, pts in series.items():
        xs = [k for k, _ in pts]
        v, err = interval_bars([ci["test"]["ppl"][n] for _, n in pts])
        ax.errorbar(xs, v, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xlabel("ensemble components (K)")
    ax.set_ylabel("test perplexity (per word)")
    ax.set_xticks(range(1, len(lms) + 1))
    ax.legend()
    ax.set_title(f"Fig. 8 ({cfg['name']}): K LMs vs K − 1 LMs + kNN", fontsize=9)
    save_figure(fig, job.paths("fig8"))
    plt.close(fig)
    cap = (f"Is the kNN-LM just an ensemble? ({cfg['name']}; Xu et al. 2023, App. E.5, Table 8 and Figure 8): the base "
           f"LM, other LMs over the same tokens ({', '.join(others)}: config 'hypotheses.ensemble_lms', each an entry of "
           f"'lms' whose training its Table 4 row and MLflow runs describe; "
           + "; ".join(f"{n}: {_lm_relation(cfg, base, n)}" for n in others)
           + f"), and the kNN component of Table 1 (full "
           f"store, {knn_component(job)}); every mixture's weights tuned on valid by EM ('weights'); "
           f"'oracle' = per token the better of its two components. Figure 8: the ensemble of K LMs against K − 1 LMs "
           f"+ the kNN component. {ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(pd.DataFrame(rows), job.path("csv"), job.path("md"), "Table 8: ensembles of LMs vs the kNN component",
                cap, note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp_rows), job.path("cmp_csv"))
    return {"metrics": {f"test_ppl_{n.replace(' ', '_').replace('+', 'plus')}": summarize(mixes[n][0]["test"],
                                                                                        words["test"])["ppl_word"]
                        for n in names},
            "artifacts": [str(job.path(n)) for n in ("csv", "md", "cmp_csv")] + [str(p) for p in job.paths("fig8")]}
