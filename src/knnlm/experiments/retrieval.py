"""Retrieval for every datastore variant ("store", knnlm.datastore.stores), and Table 3: FAISS vs real mask and score
(Xu et al. 2023, Sec. 5).

One family of jobs serves every store: prepare_store, build_index (IVFPQ), search (the FAISS mask and
score), real_score (exact distances of the FAISS neighbours), exact_search (the real mask), and settings,
which scores the three mask/score settings at the config τ on the retrieval scope:
  faiss_mask_faiss_score -- IVFPQ neighbours, IVFPQ (approximate) distances      (the usual kNN-LM)
  faiss_mask_real_score  -- IVFPQ neighbours, distances recomputed in fp32 from the keys
  real_mask_real_score   -- exact top-k neighbours (knnlm.search.exact), exact distances
λ is tuned on the valid scope. Table 3 is the full store's settings; Figures 2 and 4 are the subsets'.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from ..job import Job
from ..io import (ArtifactError, atomic_path, create_npy, iter_chunks, machine, open_npy, read_checked_json, read_json,
                  release_rows, rerun_hint, save_npy, write_json)
from ..scoring.results import METRIC_NAME, SPLITS, evaluate, result_row
from ..scoring.interpolation import recall_at_k, summarize, temperature_sweep  # noqa: F401 (re-exported)
from ..scoring.settings import (FAISS_FAISS, FAISS_REAL, REAL_REAL, SETTING_LABEL, SETTING_PAIRS,  # noqa: F401
                                SETTINGS, TUNED, settings_ci_caption, settings_rows, store_vs_store)
from ..search.scope import block_sample, every_token_label, scope_caption, scope_tokens, tuning_caption
from .common import lm_training_label, by_split, documents_scheme, open_datastore, open_split, scoped_documents

log = logging.getLogger(__name__)


def _store(job: Job):
    """(store, datastore manifest) of the job's 'store' (prep dir) and datastore inputs."""
    from ..datastore.stores import open_store

    keys, _, man = open_datastore(job)
    return open_store(job.path("store"), keys, man), man


def scope_file(job: Job, split: str | None = None) -> Path | None:
    """The token indices file of the tokens the job scores on `split` (the job's own split when None), or None for
    every token. A store scored on every token (knnlm.datastore.stores.scores_every_token) reads no retrieval scope:
    every test token, and on valid its input 'tuning_sample' when config 'retrieval.tuning_documents' gives one (whole
    valid documents, where λ and τ are tuned), or, when config 'retrieval.table3_fraction' < 1, its input
    'table3_sample' (a block sample of those tokens; a list per split for a job of both splits); any other store
    reads the retrieval scope (input 'scope', a list per split for a job of both splits)."""
    from ..datastore.stores import scores_every_token

    split = split or job.wildcards["split"]
    if scores_every_token(job.wildcards.get("store", "")):  # a nested exact search has no store wildcard: scoped
        block = job.input.get("table3_sample")  # config 'retrieval.table3_fraction' < 1: a block sample of them
        if block:
            return by_split(job, "table3_sample")[split] if isinstance(block, list) else Path(block)
        sample = job.input.get("tuning_sample")
        return Path(sample) if sample and split == "valid" else None
    return by_split(job, "scope")[split] if isinstance(job.input.get("scope"), list) else job.path("scope")


def scope_indices(job: Job, split: str, n_tokens: int) -> np.ndarray:
    """[t] sorted int64 indices of the tokens the job scores on `split` (scope_file; np.arange(n_tokens) for every
    token). Raises ArtifactError when the file indexes beyond the split's n_tokens tokens."""
    path = scope_file(job, split)
    sc = np.arange(n_tokens) if path is None else np.load(path)
    if len(sc) and sc[-1] >= n_tokens:
        raise ArtifactError(f"{path}: token {sc[-1]} beyond the {n_tokens} tokens of split {split}")
    return sc


def scope_digest(job: Job, split: str) -> str:
    """A digest of the token indices the job scores on `split` (scope_file): 'all' for every token, else the first 16
    hex digits of the SHA-256 of the sorted int64 indices. Two settings JSONs are paired token for token only when
    their digests match (knnlm.scoring.settings.store_vs_store)."""
    import hashlib

    path = scope_file(job, split)
    return "all" if path is None else hashlib.sha256(np.load(path).astype(np.int64).tobytes()).hexdigest()[:16]


def _scoped(job: Job, man: dict, everything: bool = False):
    """(queries manifest, queries [t, D] float32, scope [t] token indices) of the job's split: the tokens it scores
    (scope_indices), or every token when `everything`; every token's queries stay a memmap, read in chunks."""
    q = open_split(job, with_queries=True, checkpoint_sha256=man["checkpoint_sha256"])
    t = q["manifest"]["T"]
    path = None if everything else scope_file(job)
    sc = np.arange(t) if path is None else scope_indices(job, job.wildcards["split"], t)
    return q, (q["queries"] if path is None else np.asarray(q["queries"][sc])), sc


def scoped_targets(job: Job, split: str) -> np.ndarray:
    """[t] int64: the targets of the tokens that load_settings scores on `split` (scope_indices), in the same order."""
    q = open_split(job, split)
    tg = np.asarray(q["targets"], dtype=np.int64)
    return tg[scope_indices(job, split, len(tg))]


def tuning_sample(job: Job) -> dict:
    """The tuning sample of valid (config 'retrieval.tuning_documents'; knnlm.search.scope.document_sample): the valid
    tokens of the stores scored on every token."""
    from ..search.scope import document_sample

    docs = np.load(job.path("documents"))
    r = job.cfg["retrieval"]
    sc = document_sample(docs["doc"], r["tuning_documents"], r["scope_seed"])
    save_npy(job.path("out"), sc)
    return {"metrics": {"tokens": len(sc), "documents": len(np.unique(docs["doc"][sc])),
                        "split_tokens": len(docs["doc"]), "split_documents": len(docs["tokens"])}}


def table3_sample(job: Job) -> dict:
    """The tokens of the stores scored on every token when config 'retrieval.table3_fraction' < 1: a seeded
    proportional block sample of that share (knnlm.search.scope.scope_tokens: one block of whole words per
    document) of every token of the split, on valid of its tuning sample (input 'tuning_sample', when
    'retrieval.tuning_documents' gives one). Its size follows docs/statistics.md ("How large a sample")."""
    docs = np.load(job.path("documents"))
    r = job.cfg["retrieval"]
    base = (np.load(job.path("tuning_sample")).astype(np.int64) if job.input.get("tuning_sample")
            else np.arange(len(docs["doc"]), dtype=np.int64))
    sc = base[block_sample(np.asarray(docs["doc"])[base], np.asarray(docs["words"])[base], r["table3_fraction"],
                           r["scope_seed"])]
    save_npy(job.path("out"), sc)
    return {"metrics": {"tokens": len(sc), "of_tokens": len(base), "documents": len(np.unique(docs["doc"][sc])),
                        "split_tokens": len(docs["doc"]), "split_documents": len(docs["tokens"])}}


def scope(job: Job) -> dict:
    """The retrieval scope of a split: one seeded word-aligned block per document, 'retrieval.max_queries' tokens in
    all (knnlm.search.scope.scope_tokens)."""
    docs = np.load(job.path("documents"))
    sc = scope_tokens(docs["doc"], job.cfg["retrieval"]["max_queries"], job.cfg["retrieval"]["scope_seed"],
                      docs["words"])
    save_npy(job.path("out"), sc)
    return {"metrics": {"tokens": len(sc), "documents": len(np.unique(docs["doc"][sc])),
                        "split_tokens": len(docs["doc"]), "split_documents": len(docs["tokens"])}}


def _rows_of(meta: dict, sc: np.ndarray, source) -> np.ndarray:
    """Rows of a query cache (meta 'queries': 'all' tokens or the 'scope') for the scope's tokens."""
    if meta.get("queries", "scope") == "all":
        return sc
    if meta["T"] != len(sc):
        raise ArtifactError(f"{source}: cache of {meta['T']} scoped queries, the scope has {len(sc)}: rerun its rule")
    return np.arange(len(sc))


def prepare_store(job: Job) -> dict:
    """Prepare the store of wildcard 'store' for key type 'key' (knnlm.datastore.stores.prepare_store)."""
    from ..datastore.stores import prepare_store as prepare

    keys, _, man = open_datastore(job)
    with atomic_path(job.path("store")) as tmp:
        meta = prepare(job.wildcards["store"], job.wildcards["key"], keys, man, job.cfg, tmp)
    return {"metrics": {"size": meta["size"], "dim": meta["dim"]}, "params": {"store_meta": meta}}


def _index_params(job: Job, store, man: dict) -> dict:
    """The store's IVFPQ parameters (knnlm.search.index.resolve_index_params of config 'index' at k = 'knn.k': nprobe
    scans at least index.scan_factor × k keys; a PCA store keeps the full keys' code size; a store named
    '-ivf<k>' trains its index with seed k, one named '-np<n>' searches n lists)."""
    from ..search.index import resolve_index_params

    cfg = dict(job.cfg["index"], seed=store.meta.get("index_seed", job.cfg["index"]["seed"]))
    if "nprobe" in store.meta:  # a point of the probe sweep ('-np<n>')
        cfg["nprobe"] = store.meta["nprobe"]
    k = job.cfg.get("knn", {}).get("k")  # a build needs no k: nprobe is set at search time
    return resolve_index_params(cfg, store.size, store.meta["dim"], k, code_dim=man["D"] if store.transform else None)


def build_index(job: Job) -> dict:
    """An IVFPQ index over the store's keys (trained on a seeded sample; ids = datastore rows)."""
    from ..search.index import build_ivfpq

    store, man = _store(job)
    params = _index_params(job, store, man)
    t0 = time.time()
    stats = build_ivfpq(store.keys, job.wildcards["metric"], params, job.path("index"), job.threads, rows=store.rows)
    stats.update(key_type=job.wildcards["key"], metric=job.wildcards["metric"], store=job.wildcards["store"],
                 build_seconds=time.time() - t0, datastore_checkpoint_sha256=man["checkpoint_sha256"], N=man["N"],
                 D=store.meta["dim"], subset_size=store.size)
    write_json(job.path("meta"), stats)
    return {"metrics": {"ntotal": stats["ntotal"], "build_seconds": stats["build_seconds"], "nprobe": params["nprobe"],
                        "probed_fraction": params["probed_fraction"], "code_size": params["code_size"]},
            "params": {"resolved": params}, "artifacts": [job.path("meta")]}


def search(job: Job) -> dict:
    """Top-k FAISS neighbours (the FAISS mask) and their PQ distances (the FAISS score) for the queries of the
    job's split: all of them for the full store (Table 1), the retrieval scope for other stores."""
    from ..datastore.stores import searches_every_token
    from ..search.index import check_index_matches, search as faiss_search

    store, man = _store(job)
    idx_meta = read_json(job.path("index_meta"))
    if idx_meta["datastore_checkpoint_sha256"] != man["checkpoint_sha256"]:
        raise ArtifactError(f"{job.path('index')} was built from another checkpoint than the datastore {job.path('manifest')}")
    from ..datastore.stores import same_index_store

    built = {n: idx_meta.get(n) for n in ("key_type", "metric", "store")}
    # the store whose index this is (a probe-sweep point, an '-alltokens' store: its base store's)
    want = {"key_type": job.wildcards["key"], "metric": job.wildcards["metric"],
            "store": same_index_store(job.wildcards["store"])}
    if built != want:
        raise ArtifactError(f"{job.path('index_meta')}: an index built for {built}, where this job searches {want} (a "
                            f"file moved or copied under another name?); {rerun_hint(job.path('index'))}")
    params = _index_params(job, store, man)
    check_index_matches(idx_meta, params, job.path("index"))
    everything = searches_every_token(job.wildcards["store"])  # Table 1 reads the full store's search of every token
    q, queries, sc = _scoped(job, man, everything)
    everything = len(sc) == q["manifest"]["T"]
    t0 = time.time()
    stats = faiss_search(job.path("index"), store.project(queries) if store.transform else queries, job.cfg["knn"]["k"],
                         params["nprobe"], job.path("ids"), job.path("dists"), job.cfg["index"]["search_chunk"],
                         job.threads, id_limit=man["N"],  # a subset's index holds datastore rows as its ids
                         expect={"metric": job.wildcards["metric"], "keys": store.keys, "key": job.wildcards["key"]})
    stats.update(key_type=job.wildcards["key"], metric=job.wildcards["metric"], split=job.wildcards["split"],
                 store=job.wildcards["store"], search_seconds=time.time() - t0, queries="all" if everything else "scope",
                 checkpoint_sha256=man["checkpoint_sha256"], N=idx_meta["N"], machine=machine(job.threads, stats["device"]))
    write_json(job.path("meta"), stats)
    return {"metrics": {"T": stats["T"], "missing_neighbours": stats["missing_neighbours"],
                        "requeried_for_k": stats["requeried_for_k"], "search_seconds": stats["search_seconds"],
                        **({"keys_scanned_per_query": stats["keys_scanned_per_query"]}
                           if stats["keys_scanned_per_query"] is not None else {})}}


def real_score(job: Job, chunk: int = 16384) -> dict:
    """Exact distances (fp32, from the store's keys) of the FAISS neighbours of the scoped queries, `chunk` queries
    at a time into the output memmap (memory flat in the scope's size)."""
    from ..search.real_score import recompute_distances

    store, man = _store(job)
    q, queries, sc = _scoped(job, man)
    t = len(sc)
    meta = read_json(job.path("nb_meta"))
    ids = open_npy(job.path("nb_ids"), (meta["T"], meta["k"]), np.int32)
    rows = _rows_of(meta, sc, job.path("nb_meta"))
    t0 = time.time()
    with create_npy(job.path("dists"), (t, meta["k"]), np.float32) as out:
        for a, b in iter_chunks(t, chunk, out, queries):  # the chunk's pages of the output and queries leave the RSS
            r = rows[a:b]
            out[a:b] = recompute_distances(store.keys, store.project(np.asarray(queries[a:b], dtype=np.float32)),
                                           np.asarray(ids[r]), job.wildcards["metric"])
            release_rows(ids, int(r.min()), int(r.max()) + 1)  # the FAISS ids' rows of these scoped queries
    stats = {"T": t, "k": meta["k"], "seconds": time.time() - t0, "checkpoint_sha256": man["checkpoint_sha256"],
             "machine": machine(job.threads)}
    write_json(job.path("meta"), stats)
    return {"metrics": {"T": t, "seconds": stats["seconds"]}}


def _write_exact_meta(path, shape: tuple[int, int], n: int, secs: float, flop: float, man: dict, **extra) -> dict:
    """Write the meta of an exact search (queries T and k of `shape`, keys N = `n`, its seconds, flops and GFLOP/s, the
    datastore's checkpoint, what ran it: knnlm.io.machine, unless `extra` names it) to `path`; the meta."""
    extra.setdefault("machine", machine())
    meta = {"T": int(shape[0]), "k": int(shape[1]), "N": n, "seconds": secs, "flop": flop, "gflops": flop / secs / 1e9,
            "checkpoint_sha256": man["checkpoint_sha256"], **extra}
    write_json(path, meta)
    return meta


def _shard(job: Job) -> int | None:
    """The job's shard index (wildcard 'shard' of a sharded exact search, config 'retrieval.exact_shards'), or None."""
    return int(job.wildcards["shard"]) if "shard" in job.wildcards else None


def _exact_into(job: Job, keys, queries, t: int, k: int, rows, span: tuple[int, int], man: dict, **extra) -> dict:
    """Exact top-k of scan positions span of keys (rows: the scan's datastore rows, or None for all keys) for the
    queries, written straight into the output memmaps: [t, min(k, keys in span)] (a shard smaller than k keeps all of
    its keys); the meta with the shard's span and time."""
    from ..search.exact import exact_topk

    r, width = job.cfg["retrieval"], min(k, span[1] - span[0])
    t0 = time.time()
    with create_npy(job.path("ids"), (t, width), np.int32) as ids, create_npy(job.path("dists"), (t, width),
                                                                              np.float32) as d:
        if width:
            exact_topk(keys, queries, width, job.wildcards["metric"], r["exact_key_chunk"], r["exact_query_chunk"],
                       r["exact_query_block"], rows=rows, out=[(ids, d)], span=span)
    secs = time.time() - t0
    flop = 2.0 * t * (span[1] - span[0]) * keys.shape[1]
    return _write_exact_meta(job.path("meta"), (t, width), int(keys.shape[0]), secs, flop, man, span=list(span),
                             machine=machine(job.threads), token_digest=scope_digest(job, job.wildcards["split"]),
                             **extra)


def exact_search(job: Job) -> dict:
    """Exact top-k over the store's keys (the real mask, knnlm.search.exact.exact_topk) for the scoped queries, written
    straight into the output memmaps. With wildcard 'shard' (config 'retrieval.exact_shards' > 1), the top-k of that
    shard's keys only (knnlm.datastore.stores.shard_spans, whole key chunks); exact_merge combines the shards."""
    from ..datastore.stores import shard_spans

    store, man = _store(job)
    q, queries, sc = _scoped(job, man)
    k, r, t = job.cfg["knn"]["k"], job.cfg["retrieval"], len(sc)
    shard, extra = _shard(job), {}
    span = (0, store.size)
    if shard is not None:
        span = shard_spans(store.size, r["exact_shards"], r["exact_key_chunk"])[shard]
        extra = {"shard": shard, "shards": r["exact_shards"]}
    queries = store.project(queries) if store.transform else queries
    meta = _exact_into(job, store.keys, queries, t, k, store.rows, span, man, **extra)
    return {"metrics": {"T": t, "seconds": meta["seconds"], "gflops": meta["gflops"], "keys": span[1] - span[0]}}


def _nested(job: Job):
    """(keys, manifest, scan rows, stops, opened stores) of a nested exact search's inputs
    (knnlm.datastore.stores.nested_scan over the stores of input 'stores'). Raises ArtifactError if a store is not a
    seeded subset of one seed or the full store, or two stores have the same size."""
    from ..datastore.stores import nested_scan, open_store

    keys, _, man = open_datastore(job)
    stores = job.paths("stores")
    opened = [open_store(p, keys, man) for p in stores]
    seeds = {st.meta["seed"] for st in opened if st.rows is not None}
    bad = [str(p) for p, st in zip(stores, opened) if st.transform is not None or st.meta.get("dim") != man["D"]
           or (st.rows is not None and "ratio" not in st.meta)]
    if bad or len(seeds) > 1:
        raise ArtifactError(f"nested exact search takes seeded subsets of one seed and the full store; found {bad or seeds}")
    ratios = [st.meta["ratio"] if st.rows is not None else 1.0 for st in opened]
    rows, stops = nested_scan(man["N"], ratios, seeds.pop() if seeds else 0)
    for p, st in zip(stores, opened):
        if not np.array_equal(np.sort(rows[:st.size]), np.arange(man["N"]) if st.rows is None else st.rows):
            raise ArtifactError(f"{p}: its rows are not the first {st.size} of the nested scan (another subset seed?)")
    if sorted(st.size for st in opened) != sorted(stops) or len(stops) != len(opened):
        raise ArtifactError(f"nested exact search needs one store per subset size; found sizes "
                            f"{[st.size for st in opened]} for the scan's stops {stops}")
    return keys, man, rows, stops, opened, ratios


def exact_search_nested(job: Job) -> dict:
    """Exact top-k over each of the nested datastore subsets (the stores of input 'stores': r<ratio> of one seed
    and the full one; Sec. 5, Figures 2 and 4) in one scan: the keys in an order where every subset is a prefix
    (knnlm.datastore.stores.nested_scan), the top-k taken as the scan passes each subset's end. Same results as
    exact_search per store, for the cost of the largest; each store's top-k is written straight into its output
    memmaps (memory: one query block per stop, not every stop's [T, k] results). With wildcard 'shard' (config
    'retrieval.exact_shards' > 1), the top-k of one shard of the scan (knnlm.datastore.stores.nested_shards: shards
    never straddle a subset's end) into outputs ids/dists/meta; exact_merge gives each store the merge of the shards up
    to its end. Raises ArtifactError if a store is not such a subset."""
    from ..search.exact import exact_topk
    from ..datastore.stores import nested_shards, shard_spans

    keys, man, rows, stops, opened, ratios = _nested(job)
    q, queries, sc = _scoped(job, man)
    k, r, t = job.cfg["knn"]["k"], job.cfg["retrieval"], len(sc)
    shard = _shard(job)
    if shard is not None:
        seg, part, parts = nested_shards(ratios, r["exact_shards"])[shard]
        start = ([0] + stops)[seg]
        a, b = shard_spans(stops[seg] - start, parts, r["exact_key_chunk"])[part]
        meta = _exact_into(job, keys, queries, t, k, rows, (start + a, start + b), man, shard=shard,
                           shards=r["exact_shards"], nested_scan={"stops": stops, "segment": seg})
        return {"metrics": {"T": t, "seconds": meta["seconds"], "gflops": meta["gflops"], "keys": b - a}}
    t0 = time.time()
    with contextlib.ExitStack() as outputs:  # every store's (ids, dists) memmaps, renamed into place on success
        by_size = {st.size: (outputs.enter_context(create_npy(job.paths("ids")[i], (t, k), np.int32)),
                             outputs.enter_context(create_npy(job.paths("dists")[i], (t, k), np.float32)))
                   for i, st in enumerate(opened)}
        exact_topk(keys, queries, k, job.wildcards["metric"], r["exact_key_chunk"], r["exact_query_chunk"],
                   r["exact_query_block"], rows=rows, stops=stops, out=[by_size[s] for s in stops])
    secs = time.time() - t0
    flop = 2.0 * t * stops[-1] * keys.shape[1]  # one scan of the largest store
    for i, st in enumerate(opened):
        meta = _write_exact_meta(job.paths("meta")[i], (t, k), int(keys.shape[0]), secs, flop, man,
                                 nested_scan={"stops": stops, "store_size": st.size}, machine=machine(job.threads),
                                 token_digest=scope_digest(job, job.wildcards["split"]))
    return {"metrics": {"T": len(sc), "seconds": secs, "gflops": meta["gflops"], "stores": len(opened)}}


def exact_merge(job: Job) -> dict:
    """The store's exact top-k (the real mask) from the top-k of its shards (inputs 'shard_ids', 'shard_dists',
    'shard_meta': lists, one per shard of config 'retrieval.exact_shards', from exact_search or exact_search_nested) by
    knnlm.search.exact.merge_topk: the same ids and distances as one scan. The meta adds up the shards' scan time and
    lists each shard's span and seconds. Raises ArtifactError when the shards disagree on queries (their number or
    their token indices: 'token_digest'), keys or checkpoint, or their spans do not tile the scan from its start
    without a gap or an overlap (shards of another 'retrieval.exact_shards')."""
    from ..search.exact import merge_topk

    metas = [read_json(p) for p in job.paths("shard_meta")]
    k, metric = job.cfg["knn"]["k"], job.wildcards["metric"]
    names = [str(p) for p in job.paths("shard_meta")]
    shapes = {(m["T"], m["N"], m["checkpoint_sha256"], m.get("token_digest", "")) for m in metas}
    if len(shapes) != 1:
        raise ArtifactError(f"shards {names} disagree on (queries, keys, checkpoint, token digest): {sorted(shapes)}: "
                            "rerun them")
    spans = sorted(tuple(m["span"]) for m in metas)
    counts = {m.get("shards") for m in metas}
    tiled = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if not tiled or len(counts) != 1 or ("nested_scan" not in metas[0] and counts != {len(metas)}):
        raise ArtifactError(f"shards {names}: spans {spans} of {sorted(counts, key=str)} shards do not tile the scan "
                            f"from 0 as the {len(metas)} shards of one search: rerun them")
    t, n, sha, _ = shapes.pop()
    parts = [(open_npy(i, (t, m["k"]), np.int32), open_npy(d, (t, m["k"]), np.float32))
             for i, d, m in zip(job.paths("shard_ids"), job.paths("shard_dists"), metas)]
    scanned = sum(m["span"][1] - m["span"][0] for m in metas)
    if scanned < k:
        raise ArtifactError(f"the shards {[str(p) for p in job.paths('shard_meta')]} hold {scanned} keys, fewer than k={k}")
    t0 = time.time()
    with create_npy(job.path("ids"), (t, k), np.int32) as ids, create_npy(job.path("dists"), (t, k), np.float32) as d:
        merge_topk(parts, k, metric, (ids, d))
    merge_secs = time.time() - t0
    secs = sum(m["seconds"] for m in metas)
    flop = sum(m["flop"] for m in metas)
    extra = {}
    if "nested_scan" in metas[0]:
        stops = metas[0]["nested_scan"]["stops"]
        extra["nested_scan"] = {"stops": stops, "store_size": stops[max(m["nested_scan"]["segment"] for m in metas)]}
    if "token_digest" in metas[0]:
        extra["token_digest"] = metas[0]["token_digest"]
    meta = _write_exact_meta(job.path("meta"), (t, k), n, secs, flop, {"checkpoint_sha256": sha}, merge_seconds=merge_secs,
                             shards=[{"span": m["span"], "seconds": m["seconds"]} for m in metas],
                             machine=metas[0].get("machine") or machine(), **extra)
    return {"metrics": {"T": t, "seconds": secs, "merge_seconds": merge_secs, "gflops": meta["gflops"],
                        "shards": len(metas)}}


# Caches of load_settings indexed by the FAISS search's rows (all tokens or the scope), not by scoped query: the FAISS
# neighbours and their FAISS distances. The others (exact ids/distances, real score) have one row per scoped query.
BY_FAISS_ROW = frozenset({"nb_ids", "faiss_mask_faiss_score"})
SETTINGS_CHUNK = 16384  # scoped queries per chunk in load_settings: the job's memory is flat in the scope's size


def load_settings(job: Job, taus: list[float], chunk: int = SETTINGS_CHUNK):
    """Per split, the base LM and the three mask/score settings on the retrieval scope, from the job's inputs, read
    `chunk` scoped queries at a time (the neighbour caches, [t, k] each, are never whole in RAM); FAISS mask + FAISS
    score alone when the job has no exact search among its inputs (rule settings_faiss; recall is then None).

    taus: the τ grid of the sweep (Figure 5; knnlm.config.temperatures). Returns (lp_lm {split: [t] float64},
    words {split: int}, lp_knn {setting: {split: [t] float64 log p_kNN(target) at the config τ 'knn.temperature', read
    off the sweep}},
    sweep {setting: {split: [len(taus), t] float64 log p_kNN(target) per τ
    (knnlm.scoring.interpolation.sweep_temperature)}}, docs {split: (doc [t] int document index 0..D-1 of each scoped
    token, doc_words [D], doc_ids [D] ids in the split)}, recall {split: recall@k of the FAISS neighbours against the
    exact ones}, sweep_seconds: time in sweep_temperature). Raises ArtifactError when a cache does not cover the scope.
    """
    from ..scoring.interpolation import neighbour_hits, scores_from_distances, sweep_temperature

    _, vals, man = open_datastore(job, with_keys=False)
    metric, tau = job.wildcards["metric"], job.cfg["knn"]["temperature"]
    grid = list(taus) if tau in taus else list(taus) + [tau]  # the config τ read off the sweep
    at_tau = grid.index(tau)
    exact = bool(job.input.get("exact_ids"))  # else FAISS mask + FAISS score alone (rule settings_faiss)
    settings = SETTINGS if exact else (FAISS_FAISS,)
    files = {name: by_split(job, name) for name in ("nb_ids", "nb_dists", "nb_meta", "documents")
             + (("real_dists", "exact_ids", "exact_dists", "exact_meta") if exact else ())}
    lp_lm, words, docs, recall = {}, {}, {}, {}
    lp_knn, sweep, sweep_seconds = {s: {} for s in settings}, {s: {} for s in settings}, 0.0
    digest = {split: scope_digest(job, split) for split in SPLITS}
    for split in SPLITS:
        f = {name: v[split] for name, v in files.items()}
        q = open_split(job, split, checkpoint_sha256=man["checkpoint_sha256"])
        sc = scope_indices(job, split, len(q["targets"]))
        t = len(sc)
        tg = np.asarray(q["targets"])[sc]
        lp_lm[split] = np.asarray(q["lm_logprobs"], dtype=np.float64)[sc]
        dd = np.load(f["documents"])
        docs[split] = scoped_documents(dd["doc"], dd["words"], sc)
        words[split] = int(docs[split][1].sum())
        meta = read_json(f["nb_meta"])
        rows = _rows_of(meta, sc, f["nb_meta"])
        k = meta["k"]
        caches = {"nb_ids": open_npy(f["nb_ids"], (meta["T"], k), np.int32),
                  FAISS_FAISS: open_npy(f["nb_dists"], (meta["T"], k), np.float32)}
        if exact:
            emeta = read_json(f["exact_meta"])
            if emeta["T"] != t:
                raise ArtifactError(f"{f['exact_meta']}: exact search of {emeta['T']} queries, the scope has {t}: "
                                    f"rerun it")
            if emeta.get("token_digest", digest[split]) != digest[split]:
                raise ArtifactError(f"{f['exact_meta']}: exact search of the tokens with digest "
                                    f"{emeta['token_digest']}, the scope's are {digest[split]} (another scope of the "
                                    f"same size): rerun it")
            caches.update({"exact_ids": open_npy(f["exact_ids"], (t, k), np.int32),
                           "faiss_mask_real_score": open_npy(f["real_dists"], (t, k), np.float32),
                           "real_mask_real_score": open_npy(f["exact_dists"], (t, k), np.float32)})
        for setting in settings:
            lp_knn[setting][split], sweep[setting][split] = np.empty(t), np.empty((len(taus), t))
        found = 0.0
        by_scope = [c for name, c in caches.items() if name not in BY_FAISS_ROW]
        for a, b in iter_chunks(t, chunk, *by_scope):  # the chunk's pages leave the RSS (all tokens: ~10 GB read)
            r = rows[a:b]  # rows of the FAISS caches (all tokens or the scope) of these scoped queries
            f_ids = np.asarray(caches["nb_ids"][r])
            hits = {"faiss": neighbour_hits(f_ids, vals, tg[a:b])}
            if exact:
                e_ids = np.asarray(caches["exact_ids"][a:b])
                found += recall_at_k(f_ids, e_ids) * (b - a)
                hits["real"] = neighbour_hits(e_ids, vals, tg[a:b])
            for setting in settings:
                d = caches[setting][r] if setting in BY_FAISS_ROW else caches[setting][a:b]
                c = (scores_from_distances(np.asarray(d), metric), *hits[SETTING_LABEL[setting][0].lower()])
                t0 = time.perf_counter()
                sw = sweep_temperature(*c, grid)
                sweep_seconds += time.perf_counter() - t0
                lp_knn[setting][split][a:b] = sw[at_tau]
                sweep[setting][split][:, a:b] = sw[:len(taus)]
            for name in BY_FAISS_ROW & caches.keys():
                release_rows(caches[name], int(r.min()), int(r.max()) + 1)
        recall[split] = (found / t if t else float("nan")) if exact else None  # no exact search: not measured
    return lp_lm, words, lp_knn, sweep, docs, recall, sweep_seconds


def tuned_intervals(lp_lm: dict, words: dict, lp_knn: dict, docs: dict, sweep: dict | None, st: dict,
                    lambda_steps: int) -> tuple[dict, dict, dict, dict]:
    """The three settings of one store tuned as Table 3 tunes them, and their paired intervals.

    lp_lm {split: [t] log p_LM}, words {split: words}, lp_knn {setting: {split: [t] log p_kNN at the config τ}},
    docs {split: (doc [t], doc_words, doc ids)} (load_settings), sweep: temperature_sweep's result (its 'lp_best',
    log p_kNN at τ*, is taken out of it) or None; st: config 'stats'; lambda_steps: config 'knn.lambda_steps'.
    Returns (ev {setting: evaluate() at the config τ, λ tuned on valid}, tuned {setting: {'tau', 'tau_edge',
    **evaluate() at τ*}}, doc_nll {split: {row: per-document NLL}}, ci {split: compare() of the base LM and every
    setting at both τ over SETTING_PAIRS}) (Xu et al. 2023, Sec. 5.1, Table 3; docs/statistics.md)."""
    from ..scoring.interpolation import interpolate
    from ..statistics.intervals import compare, per_document

    ev = {name: evaluate(lp_lm, by, words, lambda_steps) for name, by in lp_knn.items()}
    tuned, lp_tuned = {}, {}
    for name, v in (sweep or {}).items():
        lp_tuned[name] = v.pop("lp_best")
        tuned[name] = {"tau": v["best"]["tau"], "tau_edge": v["best"].get("tau_edge", ""),
                       **evaluate(lp_lm, lp_tuned[name], words, lambda_steps)}
    doc_nll, ci = {}, {}
    for split, (doc, doc_words, _) in docs.items():
        lps = {"base": lp_lm[split], **{n: interpolate(lp_lm[split], lp_knn[n][split], ev[n]["lambda"]) for n in ev}}
        lps.update({n + TUNED: interpolate(lp_lm[split], lp_tuned[n][split], v["lambda"]) for n, v in tuned.items()})
        nll = per_document(-np.stack(list(lps.values())), doc, len(doc_words))
        doc_nll[split] = dict(zip(lps, nll.tolist()))
        pairs = [(a, b) for a, b in SETTING_PAIRS if a in lps and b in lps]
        ci[split] = compare(nll, doc_words, list(lps), pairs, st)
    return ev, tuned, doc_nll, ci


def settings_result(job: Job, lp_lm, words, lp_knn, docs, recall, sweep: dict | None = None) -> dict:
    """The settings JSON of one (store, key, metric) on the scope: the base LM and the three settings at the
    config τ (evaluate); with `sweep` (temperature_sweep) also each setting at its tuned τ ('tuned', λ re-tuned on
    valid) and the sweep itself ('tau_sweep'); per-document NLL (doc_nll, for paired comparisons across stores)
    and the CIs over documents of each perplexity and of SETTING_PAIRS (knnlm.statistics.intervals.compare; config 'stats')."""
    from ..datastore.stores import scores_every_token

    from .common import stats_options

    meta = read_json(job.path("store") / "store.json")
    ev, tuned, doc_nll, ci = tuned_intervals(lp_lm, words, lp_knn, docs, sweep, stats_options(job),
                                             job.cfg["knn"]["lambda_steps"])
    return {"store": job.wildcards["store"], "ratio": meta.get("ratio", meta["size"] / meta["N"]),
            "size": meta["size"], "dim": meta["dim"], "store_meta": meta, "key_type": job.wildcards["key"],
            "metric": job.wildcards["metric"], "temperature": job.cfg["knn"]["temperature"],
            "scope": ("retrieval scope" if not scores_every_token(job.wildcards["store"]) else
                      every_token_label(job.cfg["retrieval"]["table3_fraction"] if job.input.get("table3_sample") else 1)),
            "tuning_sample": _tuning_sample_counts(job, docs),
            "scope_tokens": {s: len(v) for s, v in lp_lm.items()}, "words": words,
            "base": {s: summarize(lp_lm[s], words[s]) for s in lp_lm}, "settings": ev, "tuned": tuned,
            "tau_sweep": sweep or {}, "ci": ci, "recall": recall,
            "doc_ids": {s: d[2].tolist() for s, d in docs.items()}, "documents_scheme": documents_scheme(job),
            "token_digest": {s: scope_digest(job, s) for s in docs},
            "scan": _scan(job),
            "doc_words": {s: d[1].tolist() for s, d in docs.items()}, "doc_nll": doc_nll}


def _tuning_sample_counts(job: Job, docs: dict) -> dict | None:
    """{'valid': [sampled documents, all documents]} when the job's valid tokens are a tuning sample (scope_file),
    else None."""
    from ..datastore.stores import scores_every_token

    if not (scores_every_token(job.wildcards["store"]) and job.input.get("tuning_sample")):
        return None
    all_docs = len(np.load(by_split(job, "documents")["valid"])["tokens"])
    return {"valid": [len(docs["valid"][2]), all_docs]}


def _scan(job: Job) -> dict:
    """{split: {'nprobe', 'lists', 'keys_scanned_per_query', 'missing_neighbours', 'requeried_for_k'}} of the FAISS
    searches the job's settings read (input list 'nb_meta'; knnlm.search.index.search): how approximate the FAISS mask was."""
    keep = ("nprobe", "lists", "keys_scanned_per_query", "missing_neighbours", "requeried_for_k")
    return {s: {k: read_json(p).get(k) for k in keep} for s, p in by_split(job, "nb_meta").items()}


def settings(job: Job) -> dict:
    """The three mask/score settings of one (store, key, metric) on the retrieval scope, from one read of the
    neighbour caches: at the config τ, the τ × λ sweep of Figure 5 (config 'temperature'), and at each setting's
    tuned τ; λ tuned on the valid scope every time (Sec. 5, Table 3 and Figure 5)."""
    from ..config import extend_while_on_edge, tau_edge, temperatures

    t0 = time.time()
    taus = temperatures(job.cfg)
    lp_lm, words, lp_knn, per_tau, docs, recall, sweep_seconds = load_settings(job, taus)
    t1 = time.time()
    sweep = temperature_sweep(lp_lm, per_tau, words, taus, job.cfg["temperature"]["lambda_steps"], docs,
                              job.cfg["stats"])
    def best(grid):  # the largest τ* index of the settings: one on the edge extends the grid for all of them
        return max(grid.index(v["best"]["tau"]) for v in sweep.values())

    def add(more):
        nonlocal per_tau, sweep
        log.info("τ* on the grid's last value: extending the grid to %g", more[-1])
        per_more = load_settings(job, more)[3]
        per_tau = {st: {sp: np.concatenate([per_tau[st][sp], per_more[st][sp]]) for sp in per_tau[st]} for st in per_tau}
        grid = next(iter(sweep.values()))["tau"] + more
        sweep = temperature_sweep(lp_lm, per_tau, words, grid, job.cfg["temperature"]["lambda_steps"], docs,
                                  job.cfg["stats"])

    taus, _ = extend_while_on_edge(job.cfg, taus, best, add)
    for v in sweep.values():
        v["best"]["tau_edge"] = tau_edge(taus, taus.index(v["best"]["tau"]), job.cfg)
    sweep_seconds += time.time() - t1  # the per-τ log-probs (in load_settings), then λ tuning, curves and bands
    out = settings_result(job, lp_lm, words, lp_knn, docs, recall, sweep)
    out.update(tau_sweep_seconds=sweep_seconds, seconds=time.time() - t0)
    write_json(job.path("out"), out)
    metrics = {f"test_{st}_interp_ppl_word": v["test"]["interp"]["ppl_word"] for st, v in out["settings"].items()}
    for st, v in out["tuned"].items():
        metrics[f"best_tau_{st}"] = v["tau"]
        metrics[f"test_{st}_best_tau_interp_ppl_word"] = v["test"]["interp"]["ppl_word"]
    step = {f"{st}_test_ppl_vs_tau_x10": [(int(round(t * 10)), p) for t, p in zip(v["tau"], v["test_interp_ppl_word"])
                                          if np.isfinite(p)] for st, v in out["tau_sweep"].items()}
    return {"metrics": metrics, "step_metrics": step, "artifacts": [job.path("out")]}


def table3(job: Job) -> dict:
    """Table 3 (Sec. 5.1): FAISS vs real mask and score per (h_ds, ⊗) on the retrieval scope, from the full store's
    settings, with 95 % CIs over the scope's documents (knnlm.statistics.intervals), and the table of its comparisons;
    from the full store scored on every token ('full-alltokens', the paper's pair), 'table3_all'; from a subset scored
    on every token ('<r>-alltokens'), the same table on that store ('table3_small')."""
    import pandas as pd

    from ..statistics.captions import comparison_rows, flag_edges, fmt_ci
    from ..scoring.settings import tau_edges
    from ..datastore.stores import same_index_store
    from ..report.tables import write_comparisons, write_table

    cfg = job.cfg
    rows, metrics, comparisons = [], {}, []
    jsons = [read_checked_json(p, "settings") for p in job.paths("settings")]
    stores = sorted({s["store"] for s in jsons})
    on = ("" if [same_index_store(x) for x in stores] == ["full"] else
          f" on the {jsons[0]['ratio']:.0%} datastore subset ({', '.join(stores)})")
    scope = (tuning_caption(cfg, jsons[0].get("tuning_sample")) if all(s.get("scope") != "retrieval scope" for s in jsons)
             else scope_caption(cfg))
    for s in jsons:
        key, metric = s["key_type"], s["metric"]
        labels = {"h_ds": key, "⊗": METRIC_NAME[metric]}
        for split in ("test", "valid"):
            n = {"tokens": s["scope_tokens"][split], "words": s["words"][split], "documents": len(s["doc_ids"][split]),
                 f"FAISS recall@{cfg['knn']['k']}": s["recall"][split],
                 "keys scanned / query": s.get("scan", {}).get(split, {}).get("keys_scanned_per_query"),
                 "missing neighbours": s.get("scan", {}).get(split, {}).get("missing_neighbours")}
            c = s["ci"][split]
            base = result_row(split, {**labels, "mask": "-", "score": "-"}, base=s["base"])
            base.update({"interp PPL (word)": base["PPL (word)"], "interp PPL (token)": base["PPL (token)"]})
            rows.append({**base, "τ": "-", "τ* on grid edge": "", **n, "95% CI (word)": fmt_ci(c["ppl"]["base"]),
                         "vs base (95% CI)": "-"})
            for suffix, evs in (("", s["settings"]), (TUNED, s.get("tuned", {}))):
                for setting in (st for st in SETTINGS if st in evs):
                    mask, score = SETTING_LABEL[setting]
                    ev = evs[setting]
                    tau = ev.get("tau", s["temperature"])
                    rows.append({**result_row(split, {**labels, "mask": mask, "score": score}, ev),
                                 "τ": f"{tau:g}" + ("*" if suffix else ""), "τ* on grid edge": ev.get("tau_edge", ""), **n,
                                 "95% CI (word)": fmt_ci(c["ppl"][setting + suffix]),
                                 "vs base (95% CI)": fmt_ci(c["diff"][f"{setting}{suffix} vs base"], pct=True)})
                    tag = "_tuned_tau" if suffix else ""
                    metrics[f"{split}_{key}_{metric}_{setting}{tag}_interp_ppl_word"] = rows[-1]["interp PPL (word)"]
            comparisons += flag_edges(comparison_rows(c, split=split, **labels), tau_edges(s))
    cols = ["split", "h_ds", "⊗", "mask", "score", "τ", "τ* on grid edge", "λ", "interp PPL (word)", "oracle PPL (word)", "interp PPL (token)",
            "oracle PPL (token)", "tokens", "words", "documents", f"FAISS recall@{cfg['knn']['k']}",
            "keys scanned / query", "95% CI (word)", "vs base (95% CI)"]
    df = pd.DataFrame(rows)[cols]
    boot = settings_ci_caption(jsons, cfg["stats"]) + "."
    t = cfg["temperature"]
    cap = (f"Table 3 ({cfg['name']}; Xu et al. 2023, Sec. 5){on}: FAISS (IVFPQ) vs real (exact) mask and score, "
           f"at τ = {cfg['knn']['temperature']:g} (the paper's table) and at each setting's τ tuned on valid (τ*, "
           f"grid {t['start']:g} … {t['stop']:g} step {t['step']:g}, extended by its span while τ* is its last value, at most "
           f"{t['max_extensions']} times; 'τ* on grid edge' marks a τ* still on an edge; Sec. 5.2), k = {cfg['knn']['k']}, λ tuned on "
           f"valid every time; scope: {scope} "
           f"(rows with mask '-' are the base LM on the same scope). Word counts of a scope: tokens that start a word "
           f"('▁') plus <eos>. FAISS recall@k: the share of the exact top-k that the IVFPQ search found; keys scanned / "
           f"query: PQ distances faiss computed per query (nprobe 'auto' scans at least index.scan_factor = "
           f"{cfg['index']['scan_factor']:g} × k at every store size; the paper's index scans about 1,170 × k): how "
           f"approximate the approximation was. {boot} {cfg.get('profile', {}).get('caption', '')}")
    write_table(df, job.path("csv"), job.path("md"), f"Table 3: approximate vs exact retrieval{on}", cap, note=lm_training_label(job))
    write_comparisons(comparisons, job.path("cmp_csv"), job.path("cmp_md"), f"Table 3 comparisons with 95% CIs{on}",
                      f"Comparisons of Table 3 ({cfg['name']}{on}; interpolated PPL on the scope: {scope})", boot, note=lm_training_label(job))
    return {"metrics": metrics, "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv", "cmp_md")]}
