"""Approximate retrieval with faiss IVFPQ ("FAISS mask" / "FAISS score", Xu et al. 2023 Sec. 5).

One index per (key type, metric). Training uses a seeded sample of keys; keys are added in chunks
read from the fp16 memmap, so the datastore is never whole in RAM (the index's PQ codes are).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..io import ArtifactError, atomic_path, create_npy, iter_chunks, release_rows, rerun_hint

log = logging.getLogger(__name__)


def auto_ncentroids(n: int) -> int:
    """Power of two nearest sqrt(N), at most N/39 (faiss k-means wants ≥ 39 training points per centroid), ≥ 1."""
    c = 2 ** round(math.log2(max(1.0, math.sqrt(n))))
    while c > 1 and c * 39 > n:
        c //= 2
    return max(1, c)


def auto_code_size(d: int, dims_per_byte: int = 16) -> int:
    """PQ bytes per vector: D/dims_per_byte (the kNN-LM paper: 1 byte per 16 dimensions, 64 B at D = 1024), at
    least 1, lowered until it divides D."""
    m = max(1, d // dims_per_byte)
    while d % m:
        m -= 1
    return m


PAPER_PROBE_FRACTION = 32 / 4096  # the kNN-LM paper: nprobe 32 of 4096 lists


def resolve_index_params(index_cfg: dict, n: int, d: int, k: int | None = None, code_dim: int | None = None) -> dict:
    """Turn config section 'index' ("auto" values) into concrete numbers for a store of N keys of dim D.

    The approximation's strength is a controlled variable (Xu et al. 2023, Sec. 5), stated relative to k: nprobe
    "auto" = the larger of probe_fraction × lists (the paper's 32/4096) and the fewest lists that hold
    scan_factor × k keys on average (capped at every list), so a small store is never searched with about k
    keys per query (where the FAISS mask would be nearly "every key probed"); code size D/16 bytes, of
    `code_dim` when given (a PCA store keeps the full keys' bytes, so dimension and code size are not mixed).
    Returns {'ncentroids', 'code_size', 'train_size', 'nprobe', 'probed_fraction', 'bytes_per_dim',
    'expected_keys_scanned' (nprobe × N / lists), 'scan_factor', 'add_chunk', 'seed'}. Raises ValueError when
    the code size does not divide D, when k exceeds the store's N keys (config 'knn.k': a search for more
    neighbours than keys would pad every row with missing ones), and when an explicit nprobe exceeds the lists.
    """
    if k and k > n:
        raise ValueError(f"config key 'knn.k': k = {k:,} neighbours, but this store has {n:,} keys; k must be at most "
                         "the smallest store it searches")
    nc = index_cfg["ncentroids"]
    nc = auto_ncentroids(n) if nc == "auto" else int(nc)
    cs = index_cfg["code_size"]
    cs = auto_code_size(code_dim or d, int(index_cfg.get("dims_per_code_byte", 16))) if cs == "auto" else int(cs)
    if d % cs:
        raise ValueError(f"config key 'index.code_size': {cs} bytes must divide the key dimension {d} (a PCA "
                         f"store keeps the full keys' code size; choose its dimension or index.code_size so)")
    ts = index_cfg["train_size"]
    ts = min(n, max(64 * nc, 65536)) if ts == "auto" else min(n, int(ts))
    npr = index_cfg["nprobe"]
    c = float(index_cfg.get("scan_factor", 16))
    if npr == "auto":
        npr = max(1, round(index_cfg["probe_fraction"] * nc))
        if k:
            npr = max(npr, math.ceil(c * k * nc / max(n, 1)))
    elif int(npr) > nc:
        raise ValueError(f"config key 'index.nprobe': {int(npr):,} lists probed per query, but the index has {nc:,} "
                         "lists (index.ncentroids); nprobe must be at most that")
    npr = min(int(npr), nc)
    return {"ncentroids": nc, "code_size": cs, "train_size": ts, "nprobe": npr, "probed_fraction": npr / nc,
            "bytes_per_dim": cs / d, "expected_keys_scanned": npr * n / nc, "scan_factor": c,
            "add_chunk": int(index_cfg["add_chunk"]), "seed": int(index_cfg["seed"])}


def check_index_matches(meta: dict, params: dict, index_path: str | Path) -> None:
    """Raise ArtifactError when an index's recorded build (`meta`, from its .json) is not what the config now
    resolves to (`params`, from resolve_index_params): a stale index must be rebuilt, never searched silently."""
    from ..io import ArtifactError

    stale = {k: (meta.get(k), params[k]) for k in ("ncentroids", "code_size", "seed") if meta.get(k) != params[k]}
    if stale:
        found = ", ".join(f"{k}: built with {b}, config resolves to {c}" for k, (b, c) in stale.items())
        raise ArtifactError(f"{index_path} is stale ({found}); delete it (or run snakemake with "
                            f"--forcerun build_index) to rebuild it")


def gpu_resources():
    """faiss StandardGpuResources when faiss is a GPU build and sees a GPU (faiss-gpu on clusters), else None."""
    import faiss

    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return None
    return faiss.StandardGpuResources()


def _to_gpu(index, res):
    """A GPU copy of a CPU IVFPQ index (float16 lookup tables, which GPU IVFPQ needs for large codes), or None when
    faiss refuses this index on the GPU (then the CPU index is used: same API, same answers up to float rounding)."""
    import faiss

    opts = faiss.GpuClonerOptions()
    opts.useFloat16 = True
    try:
        return faiss.index_cpu_to_gpu(res, 0, index, opts)
    except RuntimeError as e:  # e.g. a code size or nprobe the GPU kernels do not support
        log.warning("faiss GPU refused the index (%s); staying on the CPU", e)
        return None


def faiss_metric(metric: str):
    import faiss

    if metric == "l2":
        return faiss.METRIC_L2
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")


def metric_name(index) -> str | None:
    """The metric of a faiss index by this project's name ('l2' | 'ip'; faiss_metric's inverse), None for another."""
    import faiss

    return {faiss.METRIC_L2: "l2", faiss.METRIC_INNER_PRODUCT: "ip"}.get(index.metric_type)


SAMPLE_BLOCK = 4096  # training-sample rows read per block (build_ivfpq)


def build_ivfpq(keys: np.ndarray, metric: str, params: dict, out_path: str | Path, threads: int = 2,
                rows: np.ndarray | None = None) -> dict:
    """Train an IVFPQ index on a seeded sample of `keys` ([N, D] fp16 memmap), add all keys in chunks, save it.

    rows: optional sorted int64 datastore row ids — index only that subset (the datastore-size ablation,
    Figures 2 and 4), with no copy of the keys. Either way the ids in the index are datastore row numbers,
    so neighbours map to vals unchanged. Returns build statistics. Atomic write.
    """
    import faiss

    faiss.omp_set_num_threads(threads)
    d = keys.shape[1]
    n = keys.shape[0] if rows is None else len(rows)
    rng = np.random.default_rng(params["seed"])
    sample = np.sort(rng.choice(n, size=params["train_size"], replace=False))
    picked = sample if rows is None else rows[sample]  # ascending datastore rows
    x = np.empty((len(picked), d), dtype=np.float32)
    for a in range(0, len(picked), SAMPLE_BLOCK):  # a memmap: each block's pages leave the RSS once read (a whole
        r = picked[a:a + SAMPLE_BLOCK]  # random sample faults in most pages of the file: 8.8 GB at 20M x 256 keys)
        x[a:a + len(r)] = keys[r]
        release_rows(keys, int(r[0]), int(r[-1]) + 1)
    quantizer = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
    index = faiss.IndexIVFPQ(quantizer, d, params["ncentroids"], params["code_size"], 8, faiss_metric(metric))
    index.cp.seed = params["seed"]
    index.pq.cp.seed = params["seed"]
    log.info("training IVFPQ(%d lists, %d bytes, %s) on %d keys", params["ncentroids"], params["code_size"], metric, len(x))
    res = gpu_resources()  # k-means of the lists and of the PQ codebooks on the GPU when there is one
    gpu = _to_gpu(index, res) if res is not None else None
    if gpu is not None:
        gpu.train(x)
        index = faiss.index_gpu_to_cpu(gpu)  # keys are added to the CPU index: it is the one saved and reconstructed
        del gpu
    else:
        index.train(x)
    del x
    chunk = params["add_chunk"]
    # each chunk's pages of a memmap leave the RSS once added: the job holds the index and one chunk, not the file
    for s in tqdm(range(0, n, chunk), desc=f"add keys ({metric})", unit=" chunk", mininterval=10):
        if rows is None:
            index.add(np.ascontiguousarray(keys[s:s + chunk], dtype=np.float32))
            release_rows(keys, s, min(n, s + chunk))
        else:
            ids = rows[s:s + chunk]
            index.add_with_ids(np.ascontiguousarray(keys[ids], dtype=np.float32), ids.astype(np.int64))
            release_rows(keys, int(ids.min()), int(ids.max()) + 1)
    index.nprobe = params["nprobe"]
    with atomic_path(out_path) as tmp:
        faiss.write_index(index, str(tmp))
    return {"ntotal": int(index.ntotal), "trained_on": "gpu" if res is not None else "cpu", **params}


def read_index(path: str | Path):
    """faiss.read_index of an IVFPQ index file, or ArtifactError naming the file when it is missing, truncated or not
    a faiss index with inverted lists (a copy cut short, another file under its name)."""
    import faiss

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"missing index file {path}")
    try:
        index = faiss.read_index(str(path))
        faiss.extract_index_ivf(index)
    except RuntimeError as e:
        raise ArtifactError(f"{path}: not a complete faiss IVF index ({str(e).strip().splitlines()[-1][:200]}); "
                            f"{rerun_hint(path)}") from e
    return index


# check_index_fits: the least share of sampled entries' stored code bytes that must equal the code the index's own
# encoder gives the key each entry claims, in its list, for the index to count as one of those keys (a deterministic
# encoding: 100 % for an index of these keys; the other key type's keys of the same rows, strongly correlated with
# them, share 21 % (L2) and 54 % (IP) of their bytes at the wikitext2 shape, 8-byte PQ codes at D = 128, and no whole
# code). A byte may differ where the index was encoded elsewhere (a GPU's near-ties), hence not 100 %
FIT_CODES = 0.9


def check_index_fits(index, index_path, metric: str, keys: np.ndarray, key: str, samples: int = 64,
                     seed: int = 0) -> dict:
    """Check that a faiss IVF index is one of these keys before it is searched: its metric is `metric` ('l2' | 'ip',
    read from the index itself), its dimension the keys' ([N, D] array or memmap, indexed by the index's ids), and
    the vectors it stores are these keys: for `samples` entries of a few seeded inverted lists, the code it stores
    must be the code its own encoder gives keys[id] in that list (IndexIVF.encode_vectors: deterministic, so every
    byte matches for an index of these keys) for at least FIT_CODES of their bytes; an index of other vectors (the
    other key type's index under this one's name, or one whose ids index other rows) matches far fewer. The median
    relative reconstruction error (reconstruct_from_offset: the centroid plus the decoded code) on the keys and on
    the same keys in shuffled order is reported beside it (a ratio that depends on the metric: an IP quantizer
    assigns a key to a centroid far from it, so its residual codes reconstruct it loosely). Returns
    {'code_agreement', 'reconstruction_error', 'unrelated_error', 'ratio', 'samples'}. Raises ArtifactError naming
    the index file and what it holds instead."""
    import faiss

    got = metric_name(index) or str(index.metric_type)
    if got != metric:
        raise ArtifactError(f"{index_path}: an index of metric {got}, where this job searches {metric} (another "
                            f"metric's index under this name?); {rerun_hint(index_path)}")
    if index.d != keys.shape[1]:
        raise ArtifactError(f"{index_path}: an index of dimension {index.d}, the {key} keys have {keys.shape[1]}")
    ivf = faiss.extract_index_ivf(index)
    inv = ivf.invlists
    size = inv.code_size
    rng = np.random.default_rng(seed)
    lists = [lst for lst in range(ivf.nlist) if inv.list_size(lst) > 0]
    ids, vecs, list_nos, stored = [], [], [], []
    for lst in rng.permutation(lists):
        n = inv.list_size(int(lst))
        list_ids = faiss.rev_swig_ptr(inv.get_ids(int(lst)), n)
        codes = faiss.rev_swig_ptr(inv.get_codes(int(lst)), n * size).reshape(n, size)
        for o in rng.choice(n, min(n, 16), replace=False):
            v = np.empty(ivf.d, dtype=np.float32)
            ivf.reconstruct_from_offset(int(lst), int(o), faiss.swig_ptr(v))
            ids.append(int(list_ids[o]))
            vecs.append(v)
            list_nos.append(int(lst))
            stored.append(np.array(codes[o], dtype=np.uint8))
        if len(ids) >= samples:
            break
    if len(ids) < 2:
        return {"code_agreement": None, "reconstruction_error": None, "unrelated_error": None, "ratio": None,
                "samples": len(ids)}
    ids, vecs = np.asarray(ids), np.asarray(vecs)
    if ids.max() >= keys.shape[0]:
        raise ArtifactError(f"{index_path}: holds id {int(ids.max())}, but there are {keys.shape[0]} {key} keys")
    order = np.argsort(ids)  # a memmap reads ascending rows fastest
    k = np.empty_like(vecs)
    k[order] = np.asarray(keys[ids[order]], dtype=np.float32)
    nos = np.asarray(list_nos, dtype=np.int64)
    codes = np.empty((len(ids), size), dtype=np.uint8)
    ivf.encode_vectors(len(ids), faiss.swig_ptr(k), faiss.swig_ptr(nos), faiss.swig_ptr(codes), False)
    agreement = float(np.mean(codes == np.asarray(stored)))
    norm = np.maximum(np.linalg.norm(k, axis=1), 1e-6)
    own = float(np.median(np.linalg.norm(vecs - k, axis=1) / norm))
    perm = np.roll(np.arange(len(ids)), 1 + int(rng.integers(len(ids) - 1)))
    other = float(np.median(np.linalg.norm(vecs - k[perm], axis=1) / norm[perm]))
    ratio = own / max(other, 1e-12)
    if agreement < FIT_CODES:
        raise ArtifactError(f"{index_path}: the vectors it holds are not these {key} keys ({agreement:.0%} of the "
                            f"code bytes of {len(ids)} sampled entries are those its encoder gives these keys in "
                            f"their lists, under {FIT_CODES:.0%}; median reconstruction error {own:.3g} on them, "
                            f"{other:.3g} on unrelated keys of the store); an index of other keys (the other key "
                            f"type's, another store's) under this name? "
                            f"{rerun_hint(index_path)[0].upper()}{rerun_hint(index_path)[1:]}")
    return {"code_agreement": agreement, "reconstruction_error": own, "unrelated_error": other, "ratio": ratio,
            "samples": int(len(ids))}


def search(index_path: str | Path, queries: np.ndarray, k: int, nprobe: int, out_ids: str | Path, out_dists: str | Path,
           chunk: int = 8192, threads: int = 2, id_limit: int | None = None, expect: dict | None = None) -> dict:
    """Top-k search of `queries` ([T, D] float32) in a saved faiss index; writes the neighbour cache.

    A query whose probed lists hold fewer than k keys is searched again with nprobe doubled until it has k
    neighbours (or every list is probed), so the FAISS mask has k neighbours unless the store has fewer keys.
    out_ids: [T, k] int32 datastore row ids (−1 only where fewer than k exist); out_dists: [T, k] float32 faiss
    distances (squared L2 for 'l2', inner product for 'ip'), both .npy, atomic. Returns stats: 'missing_neighbours'
    (−1 ids left), 'requeried_for_k' (queries searched again), 'keys_scanned_per_query' (keys in the inverted lists
    each query probed, the searches again for k included: from the coarse quantizer's probes and the lists' sizes,
    on CPU and GPU alike), 'keys_scanned_faiss' (PQ distances faiss counted; None on GPU), 'nprobe', 'T', 'k',
    'ntotal', 'device'. id_limit: the ids the index may hold are 0 … id_limit − 1 (the datastore's rows, for an
    index of a store subset whose ids are datastore rows; default the index's size); an id outside, or a non-finite
    distance, raises ArtifactError naming the index (check_neighbours). expect: {'metric', 'keys', 'key'}: the index
    is checked to be of these keys and this metric before the search (check_index_fits; stats 'fit').
    """
    import faiss

    faiss.omp_set_num_threads(threads)
    index = read_index(index_path)
    fit = check_index_fits(index, index_path, expect["metric"], expect["keys"], expect["key"]) if expect else None
    faiss.extract_index_ivf(index).nprobe = nprobe
    cpu_ivf = faiss.extract_index_ivf(index)  # the coarse quantizer and list sizes: keys scanned on any device
    list_sizes = np.array([cpu_ivf.invlists.list_size(i) for i in range(cpu_ivf.nlist)], dtype=np.int64)

    def probed_keys(q: np.ndarray, n: int) -> int:
        _, lists = cpu_ivf.quantizer.search(q, n)
        return int(list_sizes[lists[lists >= 0]].sum())

    if index.ntotal >= 2**31:
        raise ValueError(f"{index_path}: {index.ntotal} keys do not fit int32 ids")
    res = gpu_resources()
    gpu = _to_gpu(index, res) if res is not None and k <= 2048 and nprobe <= 2048 else None  # faiss GPU limits
    if gpu is not None:
        faiss.GpuParameterSpace().set_index_parameter(gpu, "nprobe", nprobe)
        index = gpu
    t = queries.shape[0]
    ivf = faiss.extract_index_ivf(index) if gpu is None else None
    nlist = ivf.nlist if ivf is not None else nprobe
    missing = refilled = 0
    scanned = from_lists = 0.0
    with create_npy(out_ids, (t, k), np.int32) as ids, create_npy(out_dists, (t, k), np.float32) as dists:
        for s, e in tqdm(iter_chunks(t, chunk, ids, dists, queries), total=-(-t // chunk),  # RSS flat in T
                         desc=f"search {Path(index_path).stem}", unit=" chunk", mininterval=10):
            q = np.ascontiguousarray(queries[s:e], dtype=np.float32)
            faiss.cvar.indexIVF_stats.reset()
            dd, ii, more, keys = search_filled(index, ivf, q, k, nprobe, nlist, probed_keys)
            check_neighbours(ii, dd, int(id_limit or index.ntotal), index_path, s)
            refilled += more
            from_lists += keys
            scanned += faiss.cvar.indexIVF_stats.ndis
            ids[s:e] = ii
            dists[s:e] = dd
            missing += int((ii < 0).sum())
    return {"T": t, "k": k, "nprobe": nprobe, "lists": int(nlist), "missing_neighbours": missing, "requeried_for_k": refilled,
            "keys_scanned_per_query": from_lists / t if t else None,
            "keys_scanned_faiss": scanned / t if t and gpu is None else None, "ntotal": int(index.ntotal),
            "device": "gpu" if gpu is not None else "cpu", **({"fit": fit} if fit else {})}


def check_neighbours(ids: np.ndarray, dists: np.ndarray, ntotal: int, index_path: str | Path, first_row: int = 0) -> None:
    """Raise ArtifactError naming the index if a search returned an id outside 0..ntotal-1 (ntotal: the rows its ids
    may name; −1, FAISS's "no neighbour", allowed) or a non-finite distance for a found neighbour: what a damaged
    index gives instead of an error. ids, dists: [B, k] from index.search; first_row: the batch's first query (for
    the message)."""
    bad = (ids < -1) | (ids >= ntotal)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ArtifactError(f"{index_path}: the search returned neighbour id {int(ids[r, c])} for query "
                            f"{first_row + int(r)}, outside the {ntotal} rows its ids may name ({int(bad.sum())} such "
                            f"ids in this batch): the index is damaged; {rerun_hint(index_path)}")
    nonfinite = (ids >= 0) & ~np.isfinite(dists)
    if nonfinite.any():
        r, c = np.argwhere(nonfinite)[0]
        raise ArtifactError(f"{index_path}: the search returned distance {float(dists[r, c])} for query "
                            f"{first_row + int(r)}: the index is damaged; {rerun_hint(index_path)}")


def search_filled(index, ivf, q: np.ndarray, k: int, nprobe: int, nlist: int, probed_keys=None):
    """index.search(q, k) at `nprobe` lists, then the queries with fewer than k neighbours again with nprobe doubled
    until they have k (or all nlist lists are probed; ivf None, a GPU index: no second search).

    q: [B, D] float32. Returns (dists [B, k] float32, ids [B, k] int64, queries searched again, keys scanned per
    probed_keys(q, n) summed (0 without it)). Leaves the index at `nprobe`."""
    dd, ii = index.search(q, k)
    scanned = probed_keys(q, nprobe) if probed_keys else 0
    refilled = 0
    short = np.flatnonzero((ii < 0).any(1))  # fewer than k neighbours in the probed lists
    wider = nprobe
    while len(short) and ivf is not None and wider < nlist:  # probe more lists for those queries only
        wider = min(nlist, 2 * wider)
        ivf.nprobe = wider
        d2, i2 = index.search(q[short], k)
        scanned += probed_keys(q[short], wider) if probed_keys else 0
        dd[short], ii[short] = d2, i2
        refilled += len(short)
        short = short[(i2 < 0).any(1)]
    if ivf is not None:
        ivf.nprobe = nprobe
    return dd, ii, refilled, scanned
