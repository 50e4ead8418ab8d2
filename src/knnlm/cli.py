"""Command-line entry points called by the Snakemake rules (`python -m knnlm <command> ...`).

Every command that computes a number logs one MLflow run (knnlm.tracking.log_run) with the config
sections it used as params, its wildcards and rule as tags, its numbers as metrics, its tables as artifacts.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from .io import ArtifactError, atomic_path, read_json

log = logging.getLogger("knnlm")


def _kv(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        k, _, v = it.partition("=")
        out[k] = v
    return out


def _track(args, cfg: dict, sections: tuple[str, ...], metrics=None, step_metrics=None, artifacts=(), extra=None):
    from .tracking import log_run

    params = {s: cfg[s] for s in sections if s in cfg}
    params.update(extra or {})
    log_run(cfg, args.rule, _kv(args.wildcards), params=params, metrics=metrics, step_metrics=step_metrics,
            artifacts=artifacts, start_time=args.start_time)


def cmd_prepare_data(args, cfg):
    from .data import prepare_splits

    stats = prepare_splits(cfg, args.out_dir)
    m = {f"{s}_{k}": v[k] for s, v in stats.items() for k in ("lines", "words")}
    _track(args, cfg, ("data",), metrics=m, artifacts=[Path(args.out_dir) / "wordcounts.json"])


def cmd_download(args, cfg):
    from .data import download

    download(cfg)


def cmd_bpe(args, cfg):
    from .data import encode_bpe, train_bpe
    from .io import write_json

    data_dir, out = Path(args.data_dir), Path(args.out_dir)
    b = cfg["bpe"]
    model = train_bpe(data_dir / "wiki.train.tokens", out / "spm", b["vocab_size"], b["character_coverage"], b["seed"],
                      cfg["threads"])
    stats = {s: encode_bpe(model, data_dir / f"wiki.{s}.tokens", out / f"{s}.bpe") for s in ("train", "valid", "test")}
    write_json(out / "bpe_stats.json", stats)
    _track(args, cfg, ("bpe",), metrics={f"{s}_tokens": v["tokens"] for s, v in stats.items()},
           artifacts=[out / "bpe_stats.json"])


def cmd_preprocess(args, cfg):
    from .lm import preprocess

    preprocess(args.bpe_dir, args.out_dir, workers=cfg["threads"])
    vocab = sum(1 for _ in open(Path(args.out_dir) / "dict.txt"))
    _track(args, cfg, (), metrics={"dict_size": vocab})


def cmd_train_lm(args, cfg):
    from .lm import train

    curves = train(cfg["lm"], args.data_bin, args.work_dir, args.out, cfg["threads"], args.log)
    best = min(curves.get("valid_loss", [(0, float("nan"))]), key=lambda x: x[1])
    _track(args, cfg, ("lm",), metrics={"best_valid_loss_base2": best[1], "best_valid_update": best[0]},
           step_metrics=curves, artifacts=[args.log])


def cmd_dump_datastore(args, cfg):
    from .dump import dump_datastore

    ev = cfg["eval"]
    man = dump_datastore(args.checkpoint, args.data_bin, args.out_dir, ev["context_window"], ev["max_tokens"], cfg["threads"])
    size = sum(p.stat().st_size for p in Path(args.out_dir).glob("*.npy"))
    _track(args, cfg, ("eval",), metrics={"N": man["N"], "D": man["D"], "bytes_on_disk": size},
           artifacts=[Path(args.out_dir) / "manifest.json"])


def cmd_dump_queries(args, cfg):
    from .dump import dump_queries
    from .io import read_json
    from .scoring import perplexity

    ev = cfg["eval"]
    man = dump_queries(args.checkpoint, args.data_bin, args.split, args.out_dir, ev["context_window"], ev["max_tokens"],
                       cfg["threads"])
    words = read_json(args.wordcounts)[args.split]["words"]
    lp = np.load(Path(args.out_dir) / "lm_logprobs.npy")
    m = {"T": man["T"], "lm_ppl_word": perplexity(lp, words), "lm_ppl_token": perplexity(lp, len(lp))}
    log.info("base LM on %s: %s", args.split, m)
    _track(args, cfg, ("eval",), metrics=m, artifacts=[Path(args.out_dir) / "manifest.json"])


def _ckpt_sha(path):
    from .io import sha256_file

    return sha256_file(path) if path else None


def cmd_build_index(args, cfg):
    from .dump import open_datastore
    from .index import build_ivfpq, resolve_index_params
    from .io import write_json

    keys, _, man = open_datastore(args.datastore, args.key, _ckpt_sha(args.checkpoint))
    rows = _subset_rows(args.rows, man)
    n = man["N"] if rows is None else len(rows)
    params = resolve_index_params(cfg["index"], n, man["D"])
    t0 = time.time()
    stats = build_ivfpq(keys, args.metric, params, args.out, cfg["threads"], rows=rows)
    stats.update(key_type=args.key, metric=args.metric, build_seconds=time.time() - t0,
                 datastore_checkpoint_sha256=man["checkpoint_sha256"], N=man["N"], D=man["D"], subset_size=n)
    write_json(str(args.out) + ".json", stats)
    _track(args, cfg, ("index",), metrics={"ntotal": stats["ntotal"], "build_seconds": stats["build_seconds"]},
           extra={"resolved": params}, artifacts=[str(args.out) + ".json"])


def cmd_search(args, cfg):
    from .dump import open_queries
    from .index import search
    from .io import read_json, write_json

    q = open_queries(args.queries_dir, args.key, _ckpt_sha(args.checkpoint))
    idx_meta = read_json(str(args.index) + ".json")
    if idx_meta["datastore_checkpoint_sha256"] != q["manifest"]["checkpoint_sha256"]:
        raise ArtifactError(f"{args.index} was built from another checkpoint than the queries in {args.queries_dir}")
    queries = q["queries"]
    if args.scope:
        from .ablations import scope
        queries = queries[:scope(q["manifest"]["T"], cfg["retrieval"]["max_queries"])]
    t0 = time.time()
    stats = search(args.index, queries, cfg["knn"]["k"], cfg["index"]["nprobe"], args.out_prefix + "_ids.npy",
                   args.out_prefix + "_dists.npy", cfg["index"]["search_chunk"], cfg["threads"])
    stats.update(key_type=args.key, metric=args.metric, split=args.split, search_seconds=time.time() - t0,
                 checkpoint_sha256=q["manifest"]["checkpoint_sha256"], N=idx_meta["N"])
    write_json(args.out_prefix + ".json", stats)
    _track(args, cfg, ("knn", "index"), metrics={"T": stats["T"], "missing_neighbours": stats["missing_neighbours"],
                                                  "search_seconds": stats["search_seconds"]})


def cmd_score(args, cfg):
    from .dump import open_datastore, open_queries
    from .io import save_npy, write_json
    from .scoring import interpolate, knn_log_prob_from_cache, lambda_grid, oracle_log_prob, summarize, tune_lambda
    from .io import open_npy

    _, vals, dman = open_datastore(args.datastore, args.key)
    words = read_json(args.wordcounts)
    tau = cfg["knn"]["temperature"]
    lp = {}
    data = {}
    for split in ("valid", "test"):
        prefix = f"{args.neighbours_prefix}_{split}"
        meta = read_json(prefix + ".json")
        if meta["N"] != dman["N"] or meta["checkpoint_sha256"] != dman["checkpoint_sha256"]:
            raise ArtifactError(f"{prefix}.json: neighbours were searched in another datastore than {args.datastore}")
        q = open_queries(Path(args.queries_root) / split, args.key, dman["checkpoint_sha256"])
        t, k = q["manifest"]["T"], meta["k"]
        ids = open_npy(prefix + "_ids.npy", (t, k), np.int32)
        dists = open_npy(prefix + "_dists.npy", (t, k), np.float32)
        lp_knn = knn_log_prob_from_cache(ids, dists, vals, q["targets"], args.metric, tau)
        save_npy(f"{args.out_prefix}_{split}_knn_logprobs.npy", lp_knn.astype(np.float32))
        lp[split] = (np.asarray(q["lm_logprobs"], dtype=np.float64), lp_knn)
    grid = lambda_grid(cfg["knn"]["lambda_steps"])
    lam, nll = tune_lambda(*lp["valid"], grid)
    metrics = {"lambda": lam}
    for split, (lp_lm, lp_knn) in lp.items():
        w = words[split]["words"]
        data[split] = {"lm": summarize(lp_lm, w), "knn": summarize(lp_knn, w),
                       "interp": summarize(interpolate(lp_lm, lp_knn, lam), w),
                       "oracle": summarize(oracle_log_prob(lp_lm, lp_knn), w),
                       "target_absent_frac": float(np.mean(np.isneginf(lp_knn))), "T": len(lp_lm), "words": w}
        for part in ("lm", "knn", "interp", "oracle"):
            for unit in ("ppl_word", "ppl_token"):
                metrics[f"{split}_{part}_{unit}"] = data[split][part][unit]
        metrics[f"{split}_target_absent_frac"] = data[split]["target_absent_frac"]
    out = {"key_type": args.key, "metric": args.metric, "temperature": tau, "k": cfg["knn"]["k"], "lambda": lam,
           "lambda_grid": grid.tolist(), "valid_nll_per_lambda": nll.tolist(), **data}
    write_json(args.out_prefix + ".json", out)
    log.info("%s/%s: λ=%.2f test interp ppl/word %.3f (base %.3f)", args.key, args.metric, lam,
             data["test"]["interp"]["ppl_word"], data["test"]["lm"]["ppl_word"])
    _track(args, cfg, ("knn",), metrics=metrics, artifacts=[args.out_prefix + ".json"],
           step_metrics={"valid_nll_vs_lambda_x100": [(int(round(l * 100)), v) for l, v in zip(grid, nll) if np.isfinite(v)]})


def _base_perplexities(queries_root, wordcounts) -> dict:
    """{split: {'ppl_word', 'ppl_token'}} of the base LM on all of valid and test (from the dumped log-probs)."""
    from .scoring import perplexity

    words = read_json(wordcounts)
    base = {}
    for split in ("valid", "test"):
        lp = np.load(Path(queries_root) / split / "lm_logprobs.npy")
        base[split] = {"ppl_word": perplexity(lp, words[split]["words"]), "ppl_token": perplexity(lp, len(lp))}
    return base


def cmd_table1(args, cfg):
    from .tables import table1, write_table

    base = _base_perplexities(args.queries_root, args.wordcounts)
    scores = [read_json(p) for p in args.scores]
    df = table1(base, scores)
    cap = (f"Table 1 ({cfg['name']}): perplexity of the base LM and of kNN-LMs with att/ffn keys and L2/IP. "
           f"'PPL' of a kNN-LM row is kNN-only (inf when a target is absent from the k={cfg['knn']['k']} FAISS "
           f"neighbours); λ tuned on valid over {cfg['knn']['lambda_steps']} values in [0, 1], τ = "
           f"{cfg['knn']['temperature']}; FAISS mask + FAISS score (IVFPQ). Per word = total NLL / (whitespace words "
           f"+ one <eos> per line). {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, args.out_csv, args.out_md, "Table 1: kNN-LM variants", cap)
    m = {}
    for _, r in df.iterrows():
        tag = "base" if r["model"] == "Base LM" else f"{r['h_ds']}_{r['⊗']}"
        m[f"{r['split']}_{tag}_ppl_word"] = r["PPL (word)"]
        if r["model"] != "Base LM":
            m[f"{r['split']}_{tag}_interp_ppl_word"] = r["interp PPL (word)"]
    _track(args, cfg, ("knn",), metrics=m, artifacts=[args.out_csv, args.out_md])
    print(Path(args.out_md).read_text())


def _scoped_queries(args, cfg):
    from .ablations import scope
    from .dump import open_queries
    from .io import read_json

    man = read_json(Path(args.datastore) / "manifest.json")
    q = open_queries(args.queries_dir, args.key, man["checkpoint_sha256"])
    t = scope(q["manifest"]["T"], cfg["retrieval"]["max_queries"])
    return q, t, man


def cmd_real_score(args, cfg):
    from .dump import open_datastore
    from .exact import recompute_distances
    from .io import open_npy, read_json, save_npy, write_json

    keys, _, _ = open_datastore(args.datastore, args.key)
    q, t, man = _scoped_queries(args, cfg)
    meta = read_json(args.neighbours_prefix + ".json")
    ids = open_npy(args.neighbours_prefix + "_ids.npy", (meta["T"], meta["k"]), np.int32)[:t]
    t0 = time.time()
    d = recompute_distances(keys, q["queries"][:t], ids, args.metric)
    save_npy(args.out, d)
    stats = {"T": t, "k": meta["k"], "seconds": time.time() - t0, "checkpoint_sha256": man["checkpoint_sha256"]}
    write_json(args.out + ".json", stats)
    _track(args, cfg, ("retrieval",), metrics={"T": t, "seconds": stats["seconds"]})


def cmd_exact_search(args, cfg):
    from .dump import open_datastore
    from .exact import exact_topk
    from .io import create_npy, write_json

    keys, _, _ = open_datastore(args.datastore, args.key)
    q, t, man = _scoped_queries(args, cfg)
    rows = _subset_rows(args.rows, man)
    k, r = cfg["knn"]["k"], cfg["retrieval"]
    t0 = time.time()
    ids, d = exact_topk(keys, q["queries"][:t], k, args.metric, r["exact_key_chunk"], r["exact_query_chunk"],
                        r["exact_query_block"], rows=rows)
    with create_npy(args.out_prefix + "_ids.npy", ids.shape, np.int32) as a:
        a[:] = ids
    with create_npy(args.out_prefix + "_dists.npy", d.shape, np.float32) as a:
        a[:] = d
    secs = time.time() - t0
    gflops = 2.0 * t * (keys.shape[0] if rows is None else len(rows)) * keys.shape[1] / secs / 1e9
    write_json(args.out_prefix + ".json", {"T": t, "k": k, "N": int(keys.shape[0]), "seconds": secs, "gflops": gflops,
                                           "checkpoint_sha256": man["checkpoint_sha256"]})
    _track(args, cfg, ("retrieval", "knn"), metrics={"T": t, "seconds": secs, "gflops": gflops})


def _subset_rows(path, man):
    """Sorted int64 datastore row ids of a subset (from `knnlm subsample`), or None for the full datastore."""
    if not path:
        return None
    from .io import open_npy, read_json

    meta = read_json(str(path) + ".json")
    if meta["N"] != man["N"] or meta["checkpoint_sha256"] != man["checkpoint_sha256"]:
        raise ArtifactError(f"{path}: subset of another datastore (N={meta['N']}) than this one (N={man['N']})")
    return np.asarray(open_npy(path, (meta["size"],), np.int64))


def _settings_log_probs(root: Path, store_dir: Path, key: str, metric: str, cfg: dict, raw: bool = False):
    """Per split, the base LM and the three mask/score settings (Table 3) on the retrieval query scope.

    Returns (lp_lm {split: [t]}, words {split: int}, lp_knn {setting: {split: [t]}}), or with raw=True
    {setting: {split: (scores [t, k], hit, valid)}} in place of lp_knn, for the τ sweep.
    store_dir: root for the full datastore, root/subsets/<store> for a subset (same layout below it).
    """
    from .ablations import SETTINGS, count_words, scope, word_starts
    from .dump import open_datastore, open_queries
    from .io import open_npy, read_json
    from .scoring import knn_log_prob_from_cache, neighbour_hits, scores_from_distances

    starts = word_starts(root / "data-bin" / "dict.txt")
    _, vals, man = open_datastore(root / "datastore", key)
    tau = cfg["knn"]["temperature"]
    lp_lm, words, out = {}, {}, {s: {} for s in SETTINGS}
    for split in ("valid", "test"):
        q = open_queries(root / "queries" / split, key, man["checkpoint_sha256"])
        t = scope(q["manifest"]["T"], cfg["retrieval"]["max_queries"])
        tg = np.asarray(q["targets"][:t])
        lp_lm[split] = np.asarray(q["lm_logprobs"][:t], dtype=np.float64)
        words[split] = count_words(tg, starts)
        pre = store_dir / "neighbours" / f"{key}_{metric}_{split}"
        ex = store_dir / "exact" / f"{key}_{metric}_{split}"
        meta, emeta = read_json(str(pre) + ".json"), read_json(str(ex) + ".json")
        if meta["T"] < t or emeta["T"] != t:
            raise ArtifactError(f"{pre}: neighbours cover {meta['T']} and exact search {emeta['T']} queries; the "
                                f"scope 'retrieval.max_queries' needs {t}: rerun the search rules")
        k = meta["k"]
        f_ids = open_npy(str(pre) + "_ids.npy", (meta["T"], k), np.int32)[:t]
        caches = {"faiss_mask_faiss_score": (f_ids, open_npy(str(pre) + "_dists.npy", (meta["T"], k), np.float32)[:t]),
                  "faiss_mask_real_score": (f_ids, open_npy(str(pre) + "_realdists.npy", (t, k), np.float32)),
                  "real_mask_real_score": (open_npy(str(ex) + "_ids.npy", (t, k), np.int32),
                                           open_npy(str(ex) + "_dists.npy", (t, k), np.float32))}
        for setting, (ids, d) in caches.items():
            if raw:
                hit, valid = neighbour_hits(ids, vals, tg)
                out[setting][split] = (scores_from_distances(np.asarray(d), metric), hit, valid)
            else:
                out[setting][split] = knn_log_prob_from_cache(ids, d, vals, tg, metric, tau)
    return lp_lm, words, out


def _scope_caption(cfg):
    mq = cfg["retrieval"]["max_queries"]
    return "all tokens of valid and test" if not mq else f"the first {mq} tokens of valid and of test"


def cmd_table3(args, cfg):
    from .ablations import SETTING_LABEL, evaluate_settings
    from .scoring import summarize
    from .tables import METRIC_NAME, write_table
    import pandas as pd

    root = Path(args.root)
    tau, r = cfg["knn"]["temperature"], cfg["retrieval"]
    rows, metrics = [], {}
    for key in r["key_types"]:
        for metric in r["metrics"]:
            lp_lm, words, lp_knn = _settings_log_probs(root, root, key, metric, cfg)
            res = evaluate_settings(lp_lm, lp_knn, words, cfg["knn"]["lambda_steps"])
            for split in ("test", "valid"):
                base = summarize(lp_lm[split], words[split])
                rows.append({"split": split, "h_ds": key, "⊗": METRIC_NAME[metric], "mask": "-", "score": "-",
                             "λ": None, "interp PPL (word)": base["ppl_word"], "oracle PPL (word)": None,
                             "interp PPL (token)": base["ppl_token"],
                             "oracle PPL (token)": None, "tokens": len(lp_lm[split]), "words": words[split]})
                for setting, v in res.items():
                    mask, score = SETTING_LABEL[setting]
                    rows.append({"split": split, "h_ds": key, "⊗": METRIC_NAME[metric], "mask": mask, "score": score,
                                 "λ": v["lambda"], "interp PPL (word)": v[split]["interp"]["ppl_word"],
                                 "oracle PPL (word)": v[split]["oracle"]["ppl_word"],
                                 "interp PPL (token)": v[split]["interp"]["ppl_token"],
                                 "oracle PPL (token)": v[split]["oracle"]["ppl_token"],
                                 "tokens": len(lp_lm[split]), "words": words[split]})
                    metrics[f"{split}_{key}_{metric}_{setting}_interp_ppl_word"] = v[split]["interp"]["ppl_word"]
    df = pd.DataFrame(rows)
    cap = (f"Table 3 ({cfg['name']}): FAISS (IVFPQ) vs real (exact) mask and score, τ = {tau}, k = {cfg['knn']['k']}, "
           f"λ tuned on valid; scope: {_scope_caption(cfg)} (rows with mask '-' are the base LM on the same scope). "
           f"Word counts of a scope: tokens that start a word ('▁') plus <eos>. {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, args.out_csv, args.out_md, "Table 3: approximate vs exact retrieval", cap)
    _track(args, cfg, ("retrieval", "knn"), metrics=metrics, artifacts=[args.out_csv, args.out_md])


def cmd_subsample(args, cfg):
    from .ablations import subsample_rows
    from .config import store_ratio
    from .io import read_json, save_npy, write_json

    man = read_json(Path(args.datastore) / "manifest.json")
    ratio = store_ratio(args.store)
    rows = subsample_rows(man["N"], ratio, cfg["datastore_size"]["seed"])
    save_npy(args.out, rows)
    write_json(args.out + ".json", {"ratio": ratio, "size": len(rows), "N": man["N"], "seed": cfg["datastore_size"]["seed"],
                                    "checkpoint_sha256": man["checkpoint_sha256"]})
    _track(args, cfg, ("datastore_size",), metrics={"size": len(rows), "ratio": ratio})


def cmd_sweep(args, cfg):
    """Fig. 2/4 numbers at the config τ, and the τ×λ grid of Fig. 5, for one (datastore size, key type, metric)."""
    from .ablations import evaluate_settings, temperature_sweep
    from .config import store_ratio, temperatures
    from .io import write_json
    from .scoring import knn_log_prob_from_hits, summarize

    root, store_dir = Path(args.root), Path(args.store_dir)
    t0 = time.time()
    tau = cfg["knn"]["temperature"]
    lp_lm, words, caches = _settings_log_probs(root, store_dir, args.key, args.metric, cfg, raw=args.tau_sweep)
    lp_knn = ({st: {sp: knn_log_prob_from_hits(*c, tau) for sp, c in by.items()} for st, by in caches.items()}
              if args.tau_sweep else caches)  # the τ sweep needs the raw caches: read them once
    at_tau = evaluate_settings(lp_lm, lp_knn, words, cfg["knn"]["lambda_steps"])
    out = {"store": args.store, "ratio": store_ratio(args.store), "key_type": args.key, "metric": args.metric,
           "temperature": tau, "scope_tokens": {s: len(v) for s, v in lp_lm.items()},
           "words": words, "base": {s: summarize(lp_lm[s], words[s]) for s in lp_lm}, "settings": at_tau}
    metrics = {f"test_{st}_interp_ppl_word": v["test"]["interp"]["ppl_word"] for st, v in at_tau.items()}
    if args.tau_sweep:
        raw = caches
        t1 = time.time()
        out["tau_sweep"] = temperature_sweep(lp_lm, raw, words, temperatures(cfg), cfg["temperature"]["lambda_steps"])
        out["tau_sweep_seconds"] = time.time() - t1
        for st, v in out["tau_sweep"].items():
            metrics[f"best_tau_{st}"] = v["best"]["tau"]
            metrics[f"test_{st}_best_tau_interp_ppl_word"] = v["best"]["test_interp_ppl_word"]
    out["seconds"] = time.time() - t0
    write_json(args.out, out)
    step = {f"{st}_test_ppl_vs_tau_x10": [(int(round(tau * 10)), p) for tau, p in zip(v["tau"], v["test_interp_ppl_word"])
                                          if np.isfinite(p)] for st, v in out.get("tau_sweep", {}).items()}
    _track(args, cfg, ("knn", "retrieval", "datastore_size", "temperature"), metrics=metrics, step_metrics=step,
           artifacts=[args.out])


def cmd_figures(args, cfg):
    from .figures import write_size_temperature

    arts = write_size_temperature(args.sweeps, cfg, args.fig_dir, args.tables_dir,
                                  _scope_caption(cfg))
    _track(args, cfg, ("datastore_size", "temperature", "retrieval", "knn"), artifacts=arts)


def cmd_word_stats(args, cfg):
    from .alternatives import output_matrix, word_stats
    from .dump import open_datastore

    keys, vals, man = open_datastore(args.datastore, "ffn", _ckpt_sha(args.checkpoint))
    t0 = time.time()
    st = word_stats(keys, vals, output_matrix(args.checkpoint), bf16=cfg["parametric"]["bf16"])
    with atomic_path(args.out) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **st)
    _track(args, cfg, ("parametric",), metrics={"seconds": time.time() - t0, "train_nll_per_token":
                                                 float(st["loss"].sum() / st["freq"].sum())})


def cmd_train_parametric(args, cfg):
    from .alternatives import run_variant

    res = run_variant(args.variant, args.key, cfg, Path(args.root), Path(args.out_dir), args.checkpoint,
                      args.word_stats, cfg["threads"])
    metrics, step = {}, {}
    for stage, v in res["stages"].items():
        metrics[f"{stage}_lambda"] = v["lambda"]
        for split in ("valid", "test"):
            for part in ("knn", "interp", "oracle"):
                metrics[f"{stage}_{split}_{'alone' if part == 'knn' else part}_ppl_word"] = v[split][part]["ppl_word"]
    if "history" in res:
        h = res["history"]
        step = {"train_loss": [(s, l) for s, l in h["train"]], "valid_nll": [(e, l) for e, l in h["valid"]]}
        metrics.update(epochs=h["epochs"], best_epoch=h["best_epoch"], train_seconds=h["seconds"],
                       train_tokens_per_second=h["tokens_per_second"])
    _track(args, cfg, ("parametric", "knn"), metrics=metrics, step_metrics=step,
           artifacts=[str(Path(args.out_dir) / "result.json")], extra={"info": res["info"]})


def cmd_tables_parametric(args, cfg):
    from .alternatives import write_tables

    base = _base_perplexities(args.queries_root, args.wordcounts)
    arts = write_tables([read_json(p) for p in args.results], [read_json(p) for p in args.scores], base, cfg,
                        Path(args.tables_dir), Path(args.fig_dir))
    _track(args, cfg, ("parametric", "knn"), artifacts=arts)


COMMANDS = {
    "prepare-data": (cmd_prepare_data, [("--out-dir", {})]),
    "download": (cmd_download, []),
    "bpe": (cmd_bpe, [("--data-dir", {}), ("--out-dir", {})]),
    "preprocess": (cmd_preprocess, [("--bpe-dir", {}), ("--out-dir", {})]),
    "train-lm": (cmd_train_lm, [("--data-bin", {}), ("--work-dir", {}), ("--out", {}), ("--log", {})]),
    "dump-datastore": (cmd_dump_datastore, [("--checkpoint", {}), ("--data-bin", {}), ("--out-dir", {})]),
    "dump-queries": (cmd_dump_queries, [("--checkpoint", {}), ("--data-bin", {}), ("--split", {}), ("--out-dir", {}),
                                        ("--wordcounts", {})]),
    "build-index": (cmd_build_index, [("--datastore", {}), ("--key", {}), ("--metric", {}), ("--out", {}),
                                      ("--checkpoint", {"default": None}), ("--rows", {"default": None})]),
    "search": (cmd_search, [("--index", {}), ("--queries-dir", {}), ("--key", {}), ("--metric", {}), ("--split", {}),
                            ("--out-prefix", {}), ("--checkpoint", {"default": None}),
                            ("--scope", {"action": "store_true", "default": False})]),
    "score": (cmd_score, [("--datastore", {}), ("--queries-root", {}), ("--neighbours-prefix", {}), ("--key", {}),
                          ("--metric", {}), ("--wordcounts", {}), ("--out-prefix", {})]),
    "real-score": (cmd_real_score, [("--datastore", {}), ("--queries-dir", {}), ("--key", {}), ("--metric", {}),
                                    ("--neighbours-prefix", {}), ("--out", {})]),
    "exact-search": (cmd_exact_search, [("--datastore", {}), ("--queries-dir", {}), ("--key", {}), ("--metric", {}),
                                        ("--out-prefix", {}), ("--rows", {"default": None})]),
    "table3": (cmd_table3, [("--root", {}), ("--out-csv", {}), ("--out-md", {})]),
    "subsample": (cmd_subsample, [("--datastore", {}), ("--store", {}), ("--out", {})]),
    "sweep": (cmd_sweep, [("--root", {}), ("--store", {}), ("--store-dir", {}), ("--key", {}), ("--metric", {}),
                          ("--tau-sweep", {"action": "store_true", "default": False}), ("--out", {})]),
    "word-stats": (cmd_word_stats, [("--datastore", {}), ("--checkpoint", {}), ("--out", {})]),
    "train-parametric": (cmd_train_parametric, [("--variant", {}), ("--key", {}), ("--root", {}), ("--out-dir", {}),
                                                ("--checkpoint", {}), ("--word-stats", {"default": None})]),
    "tables-parametric": (cmd_tables_parametric, [("--results", {"nargs": "+"}), ("--scores", {"nargs": "+"}),
                                                  ("--queries-root", {}), ("--wordcounts", {}), ("--tables-dir", {}),
                                                  ("--fig-dir", {})]),
    "figures": (cmd_figures, [("--sweeps", {"nargs": "+"}), ("--fig-dir", {}), ("--tables-dir", {})]),
    "table1": (cmd_table1, [("--queries-root", {}), ("--wordcounts", {}), ("--scores", {"nargs": "+"}),
                            ("--out-csv", {}), ("--out-md", {})]),
}


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="knnlm", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, opts) in COMMANDS.items():
        sp = sub.add_parser(name)
        sp.add_argument("--cfg", required=True, help="JSON of the (validated) config, as passed by the Snakefile")
        sp.add_argument("--rule", default=name, help="Snakemake rule name (MLflow tag)")
        sp.add_argument("--wildcards", nargs="*", default=[], help="key=value pairs (MLflow tags)")
        for flag, kw in opts:
            sp.add_argument(flag, required="default" not in kw and "action" not in kw, **kw)
    args = p.parse_args(argv)
    args.start_time = time.time()
    cfg = json.loads(args.cfg)
    COMMANDS[args.command][0](args, cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
