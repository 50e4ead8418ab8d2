"""Datastore variants ("stores"): every ablation that changes what is searched is a store.

A store is named by the value of the `{store}` wildcard and prepared once per key type into a directory
(`Layout 'store_prep'`) holding `store.json` and whatever the kind needs. One family of rules then serves
every store alike: IVFPQ index, FAISS search, real score, exact search, evaluations (knnlm.experiments.retrieval).

Kinds (name regex -> prepare function, registered with @store_kind):
  full        all datastore rows, keys as dumped
  r<ratio>    a seeded random subset of round(ratio × N) rows, kept as a sorted row-id list, never a copy of
              the keys (Xu et al. 2023, Sec. 5, Figures 2 and 4); r<ratio>-draw<k>: drawn with seed k
  pca<d>      keys and queries projected to d dims (He et al. 2021)
  <any>-ivf<k>  (full and subsets) the same store with its IVFPQ trained with seed k ('variance' table)
  <any>-np<n>  (full and subsets, after any '-ivf<k>') the same store and index searched with nprobe = n lists
              instead of config 'index.nprobe': one point of the approximation-strength sweep ('probe_sweep'
              table and figure); its exact search is the store's own
  <any>-alltokens  (full and subsets, after any '-ivf<k>') the same store, scored on every token of test and of valid
                   (of valid's tuning sample with config 'retrieval.tuning_documents')
              instead of the retrieval scope (exact search over the 5 % subset costs 1/20 of the full
              store's, so its claims can be tested on whole splits; 'retrieval.small_store_all_tokens')

A prepare function may write, next to store.json:
  rows.npy            sorted int64 datastore row ids: the store holds only these rows (ids stay datastore rows)
  keys.npy            [N, d] float16 keys replacing the datastore's (e.g. transformed keys)
  query_transform     a faiss VectorTransform file, applied to every query before search / scoring
and returns the metadata merged into store.json. open_store reads those files, whatever the kind.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..io import ArtifactError, create_npy, open_npy, read_json, save_npy, write_json

KINDS: list[tuple[re.Pattern, Callable]] = []


def store_kind(pattern: str):
    """Register `prepare(match, keys, manifest, cfg, out_dir) -> dict` for store names matching `pattern`."""
    def register(fn):
        KINDS.append((re.compile(f"^(?:{pattern})$"), fn))
        return fn
    return register


def store_name(ratio: float) -> str:
    """Name of a datastore subset: 'full' for ratio 1, else 'r<ratio>' (e.g. r0.05)."""
    return "full" if float(ratio) == 1.0 else f"r{float(ratio):g}"


def store_ratio(name: str) -> float:
    """Inverse of store_name; ValueError for other names."""
    if name == "full":
        return 1.0
    m = re.fullmatch(r"r([0-9.e-]+)", name)
    if not m:
        raise ValueError(f"datastore subset name must be 'full' or 'r<ratio>', found {name!r}")
    return float(m.group(1))


def subsample_rows(n: int, ratio: float, seed: int) -> np.ndarray:
    """A seeded random subset of round(ratio × N) datastore rows, sorted int64 [n_sub].

    An index list into the one datastore, never a copy of its keys. Subsets of different ratios with the same
    seed are nested (5 % ⊂ 10 % ⊂ … ⊂ full: prefixes of one seeded permutation), so a size curve compares
    datastores that differ only in the rows added. Raises ValueError unless 0 < ratio ≤ 1 and the subset is
    non-empty.
    """
    size = _subset_size(n, ratio)
    if size == n:
        return np.arange(n, dtype=np.int64)
    return np.sort(_permutation(n, seed)[:size]).astype(np.int64)


def training_subset_rows(n: int, train_tokens: int, seed: int) -> np.ndarray:
    """The datastore rows the parametric alternatives train on (config 'parametric.train_tokens' rows, seed
    'parametric.seed'; Xu et al. 2023, App. B-C): subsample_rows(n, min(1, train_tokens / n), seed), sorted int64.
    Store TRAINING_SUBSET holds exactly these rows, so a kNN-LM searches what they were trained on."""
    return subsample_rows(n, min(1.0, train_tokens / n), seed)


def training_subset_size(n: int, train_tokens: int) -> int:
    """len(training_subset_rows(n, train_tokens, seed)) for any seed, without drawing the rows."""
    return _subset_size(n, min(1.0, train_tokens / n))


def _subset_size(n: int, ratio: float) -> int:
    """round(ratio × n); ValueError unless 0 < ratio ≤ 1 and the subset is non-empty."""
    if not 0 < ratio <= 1:
        raise ValueError(f"datastore ratio must be in (0, 1], found {ratio}")
    size = int(round(ratio * n))
    if size < 1:
        raise ValueError(f"ratio {ratio} of a datastore of {n} keys is empty")
    return size


def _permutation(n: int, seed: int) -> np.ndarray:
    """The seeded permutation of the n datastore rows whose prefixes are the subsets of that seed."""
    return np.random.default_rng(seed).permutation(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64))


def nested_scan(n: int, ratios: list[float], seed: int) -> tuple[np.ndarray, list[int]]:
    """One scan order over the nested subsets of `ratios` (subsample_rows with this seed): (rows [n_max] int64,
    stops), where rows[:stops[i]] holds exactly the rows of the i-th smallest ratio's subset, each segment in
    ascending order (exact search of every size in one pass, knnlm.search.exact.exact_topk's `stops`).
    Raises ValueError as subsample_rows."""
    sizes = sorted({_subset_size(n, r) for r in ratios})
    perm = _permutation(n, seed)
    segs = [np.sort(perm[a:b]) for a, b in zip([0] + sizes[:-1], sizes)]
    return np.concatenate(segs).astype(np.int64), sizes


def shard_spans(n: int, shards: int, align: int) -> list[tuple[int, int]]:
    """`shards` consecutive (start, stop) spans covering positions 0..n of a scan, each of whole blocks of `align`
    positions (the exact search's key chunk) and about as many blocks each: a shard then scores its keys in the very
    chunks of one whole scan, so the merged top-k equals it bit for bit (measured: shards cut inside a chunk change
    float32 scores in the last bit, and so the order of near ties). A span is empty when the scan has fewer chunks
    than shards. Raises ValueError for shards < 1 or align < 1."""
    if shards < 1 or align < 1:
        raise ValueError(f"shards and align must be >= 1, found {shards} and {align}")
    chunks = -(-n // align)
    cuts = [min(n, -(-j * chunks // shards) * align) for j in range(shards + 1)]  # empty shards last
    return list(zip(cuts[:-1], cuts[1:]))


def nested_shards(ratios: list[float], shards: int) -> list[tuple[int, int, int]]:
    """The shards of a nested scan (knnlm.datastore.stores.nested_scan over subset ratios, the largest last): one
    (segment, part, parts) per shard, in scan order. Segment i holds the rows of the i-th smallest ratio's subset
    not in the smaller ones; it is cut into parts = max(1, round(shards × its share of the scan)) shards
    (shard_spans within the segment). The store of the i-th ratio is the merge of the shards of segments 0..i.
    Depends only on the ratios and `shards` (the DAG's shard wildcard). Raises ValueError for shards < 1."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, found {shards}")
    rs = sorted(set(ratios))
    lengths = [b - a for a, b in zip([0.0] + rs[:-1], rs)]
    return [(i, j, p) for i, ln in enumerate(lengths) for p in [max(1, round(shards * ln / rs[-1]))] for j in range(p)]


IVF_SUFFIX = r"(?:-ivf(?P<ivf>[0-9]+))?"  # '-ivf<k>': the IVFPQ index of the store is trained with seed k
PROBE_SUFFIX = r"(?:-np(?P<np>[0-9]+))?"  # '-np<n>': the store's index searched with nprobe = n
ALL_TOKENS = "-alltokens"  # a store named '<store>-alltokens' is scored on every token (valid: its tuning sample, if any)
SCOPE_SUFFIX = f"(?:{ALL_TOKENS})?"


def scores_every_token(name: str) -> bool:
    """True for a store scored on every token ('<store>-alltokens'; on valid, its tuning sample when config
    'retrieval.tuning_documents' sets one), False for one scored on the
    retrieval scope (knnlm.search.scope; config 'retrieval.max_queries'). The full store's FAISS search covers every
    token either way (Table 1 reads it)."""
    return name.endswith(ALL_TOKENS)


def _seeds(m) -> dict:
    """The store.json entries of the name's '-ivf<k>' and '-np<n>' suffixes."""
    out = {} if not m["ivf"] else {"index_seed": int(m["ivf"])}
    if m["np"]:
        if int(m["np"]) < 1:
            raise ValueError(f"store {m[0]}: '-np<n>' needs n >= 1 probed lists, found {m['np']}")
        out["nprobe"] = int(m["np"])
    return out


@store_kind("full" + IVF_SUFFIX + PROBE_SUFFIX + SCOPE_SUFFIX)
def _full(m, keys, man, cfg, out_dir: Path) -> dict:
    """All datastore rows; 'full-ivf<k>': the same keys with an IVFPQ trained with seed k (the spread of the FAISS
    settings over index seeds)."""
    return _seeds(m)


@store_kind(r"r(?P<ratio>[0-9.e-]+?)(?:-draw(?P<draw>[0-9]+))?" + IVF_SUFFIX + PROBE_SUFFIX + SCOPE_SUFFIX)
def _subset(m, keys, man, cfg, out_dir: Path) -> dict:
    """A seeded subset of round(ratio × N) rows (seed 'datastore_size.seed', or k for 'r<ratio>-draw<k>': the
    spread over subset draws); '-ivf<k>': its IVFPQ trained with seed k."""
    ratio = float(m["ratio"])
    seed = int(m["draw"]) if m["draw"] else cfg["datastore_size"]["seed"]
    rows = subsample_rows(man["N"], ratio, seed)
    save_npy(out_dir / "rows.npy", rows)
    return {"ratio": ratio, "seed": seed, **_seeds(m)}


TRAINING_SUBSET = "trainsubset"  # the store of the parametric alternatives' training rows (training_subset_rows)
# what the tables append to a name of something trained on or searching those rows: 'kNN-LM att/IP on the subset'
TRAINING_SUBSET_LABEL = " on the subset"


@store_kind(TRAINING_SUBSET)
def _training_subset(m, keys, man, cfg, out_dir: Path) -> dict:
    """The rows the parametric alternatives train on (training_subset_rows of config 'parametric.train_tokens' and
    'parametric.seed'): the kNN-LM they are held against at equal rows. Raises ValueError when
    'parametric.train_tokens' is null (they train on every row: the full store is that kNN-LM)."""
    p = cfg["parametric"]
    if p["train_tokens"] is None:
        raise ValueError(f"store {TRAINING_SUBSET!r} needs config key 'parametric.train_tokens' (the alternatives' "
                         f"training rows), found null: the full store holds every row")
    rows = training_subset_rows(man["N"], p["train_tokens"], p["seed"])
    save_npy(out_dir / "rows.npy", rows)
    return {"ratio": len(rows) / man["N"], "seed": p["seed"], "train_tokens": p["train_tokens"]}


def searches_every_token(name: str) -> bool:
    """True for the stores whose FAISS search covers every token of valid and test whatever the retrieval scope, and
    that Table 1's score job (knnlm.experiments.table1.score) reads: 'full' (Table 1) and TRAINING_SUBSET (the
    parametric tables' kNN-LM at equal rows)."""
    return name in ("full", TRAINING_SUBSET)


def same_keys_store(name: str) -> str:
    """The store whose keys (and so exact search) `name` shares: `name` without its '-ivf<k>' and '-np<n>' suffixes
    (an index seed or a probe count changes the FAISS neighbours, never the exact ones); an '-alltokens' store keeps
    its suffix (its scope differs)."""
    return re.sub(rf"(-ivf[0-9]+)?(-np[0-9]+)?(?={SCOPE_SUFFIX}$)", "", name, count=1)


def same_index_store(name: str) -> str:
    """The store whose IVFPQ index `name` searches: `name` without its '-np<n>' and '-alltokens' suffixes (the same
    rows, index seed and parameters, so the same index; only the probe count or the scope of queries differs)."""
    name = name[: -len(ALL_TOKENS)] if scores_every_token(name) else name
    return re.sub(r"-np[0-9]+$", "", name)


def same_search_store(name: str) -> str:
    """The store whose FAISS search `name` reads: 'full' for 'full-alltokens' (the full store's own search already
    covers every token of valid and test with the same index: Table 1 reads it), else `name` itself."""
    return "full" if name == f"full{ALL_TOKENS}" else name


def probe_store(name: str, nprobe: int) -> str:
    """The name of store `name` searched with nprobe = `nprobe` lists (suffix '-np<n>' before any '-alltokens')."""
    base, scope = (name[: -len(ALL_TOKENS)], ALL_TOKENS) if scores_every_token(name) else (name, "")
    return f"{base}-np{int(nprobe)}{scope}"


def store_kind_of(name: str) -> tuple[re.Match, Callable]:
    """(regex match, prepare function) of the kind store `name` belongs to; ValueError naming the kinds if none."""
    for pattern, prepare in KINDS:
        m = pattern.match(name)
        if m:
            return m, prepare
    raise ValueError(f"unknown datastore variant {name!r}; known kinds (name regexes): "
                     f"{[p.pattern[4:-2] for p, _ in KINDS]}")


def store_wildcard() -> str:
    """The regex of every store name (Snakemake wildcard constraint of {store})."""
    return "|".join(re.sub(r"\(\?P<\w+>", "(?:", p.pattern[4:-2]) for p, _ in KINDS)


def prepare_store(name: str, key: str, keys: np.ndarray, man: dict, cfg: dict, out_dir: str | Path) -> dict:
    """Prepare store `name` for key type `key` into out_dir (created; the caller makes it atomic).

    keys: the datastore's [N, D] float16 memmap; man: its manifest. Returns the store.json written.
    Raises ValueError for a name no kind matches.
    """
    m, prepare = store_kind_of(name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"store": name, "key_type": key, "N": man["N"], "D": man["D"], "checkpoint_sha256": man["checkpoint_sha256"],
            **prepare(m, keys, man, cfg, out_dir)}
    rows = out_dir / "rows.npy"
    meta["size"] = int(np.load(rows, mmap_mode="r").shape[0]) if rows.exists() else man["N"]
    own = out_dir / "keys.npy"
    meta["dim"] = int(np.load(own, mmap_mode="r").shape[1]) if own.exists() else man["D"]
    write_json(out_dir / "store.json", meta)
    return meta


@dataclass
class Store:
    """An opened store: keys [N, dim] float16 memmap (row ids = datastore rows), rows (sorted int64 [size] or
    None for all rows), meta (store.json) and project(queries [T, D] float32) -> [T, dim] float32."""

    keys: np.ndarray
    rows: np.ndarray | None
    meta: dict
    transform: object | None = None

    @property
    def size(self) -> int:
        return self.keys.shape[0] if self.rows is None else len(self.rows)

    def project(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        return q if self.transform is None else self.transform.apply(q)


def open_store(prep_dir: str | Path, keys: np.ndarray, man: dict) -> Store:
    """Open a prepared store over the datastore keys ([N, D] memmap) with manifest `man`.

    Raises ArtifactError naming the directory if the store was prepared from another datastore or a file is
    missing or truncated.
    """
    prep_dir = Path(prep_dir)
    meta = read_json(prep_dir / "store.json")
    if meta["N"] != man["N"] or meta["checkpoint_sha256"] != man["checkpoint_sha256"]:
        raise ArtifactError(f"{prep_dir}: store prepared from another datastore (N={meta['N']}, checkpoint "
                            f"{meta['checkpoint_sha256'][:12]}) than this one (N={man['N']}, {man['checkpoint_sha256'][:12]})")
    rows = open_npy(prep_dir / "rows.npy", (meta["size"],), np.int64) if (prep_dir / "rows.npy").exists() else None
    own = prep_dir / "keys.npy"
    if own.exists():
        keys = open_npy(own, (man["N"], meta["dim"]), np.float16)
    transform = None
    if (prep_dir / "query_transform").exists():
        import faiss

        transform = faiss.read_VectorTransform(str(prep_dir / "query_transform"))
    return Store(keys, None if rows is None else np.asarray(rows), meta, transform)


@store_kind(r"pca(?P<dim>[0-9]+)")
def _pca(m, keys, man, cfg, out_dir: Path) -> dict:
    """Keys projected to d dims by a PCA (He et al. 2021, Sec. 4.1) trained on a seeded sample of min(N, 100,000)
    keys (seed 'index.seed'); the queries get the same projection (query_transform)."""
    import faiss

    d, n = int(m["dim"]), man["N"]
    if not 0 < d < man["D"]:
        raise ValueError(f"store {m[0]}: the PCA dimension must be in [1, {man['D'] - 1}], found {d}")
    sample = np.sort(np.random.default_rng(cfg["index"]["seed"]).choice(n, size=min(n, 100_000), replace=False))
    pca = faiss.PCAMatrix(man["D"], d)
    pca.train(np.ascontiguousarray(keys[sample], dtype=np.float32))
    faiss.write_VectorTransform(pca, str(out_dir / "query_transform"))
    with create_npy(out_dir / "keys.npy", (n, d), np.float16) as out:
        for s in range(0, n, 65536):
            out[s:s + 65536] = pca.apply(np.ascontiguousarray(keys[s:s + 65536], dtype=np.float32))
    eig = faiss.vector_to_array(pca.eigenvalues)
    return {"pca_train_size": len(sample), "explained_variance": float(eig[:d].sum() / eig.sum())}
