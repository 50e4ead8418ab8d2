"""The approximation regime of the FAISS mask (knnlm.search.index): stated relative to k and held at every store size,
measured (keys scanned per query), never short of k neighbours, and PCA stores at the full keys' code size."""
import math

import numpy as np
import pytest

from knnlm.config import load_config
from knnlm.search.index import build_ivfpq, resolve_index_params, search

from conftest import PROJECT_ROOT


@pytest.mark.parametrize("name", ["wikitext2", "tiny"])
def test_keys_scanned_per_query_at_least_c_times_k_at_every_swept_size(name):
    cfg = load_config(PROJECT_ROOT / "configs" / f"{name}.yaml")
    n_full = 2_600_000 if name == "wikitext2" else 20_000
    k, c = cfg["knn"]["k"], cfg["index"]["scan_factor"]
    for ratio in sorted(set(cfg["datastore_size"]["ratios"]) | set(cfg["temperature"]["ratios"])):
        n = round(ratio * n_full)
        p = resolve_index_params(cfg["index"], n, 256, k)
        # a configured nprobe is the user's; "auto" must reach c·k keys (or every key of a smaller store)
        if cfg["index"]["nprobe"] == "auto":
            assert p["expected_keys_scanned"] >= min(c * k, n) - 1e-9, (ratio, p)
        assert p["scan_factor"] == c and p["nprobe"] <= p["ncentroids"]
    # without a floor the 5 % store of wikitext2 would scan about k keys: the paper's fraction alone
    if name == "wikitext2":
        p = resolve_index_params(cfg["index"], 130_000, 256)  # no k: the probed fraction alone
        assert p["expected_keys_scanned"] < 1.1 * k


def test_pca_store_keeps_the_full_keys_code_size():
    cfg = load_config(PROJECT_ROOT / "configs" / "wikitext2.yaml")["index"]
    full = resolve_index_params(cfg, 2_600_000, 256, 1024)
    for d in (64, 128):
        assert resolve_index_params(cfg, 2_600_000, d, 1024, code_dim=256)["code_size"] == full["code_size"] == 16
    with pytest.raises(ValueError, match="index.code_size"):
        resolve_index_params(cfg, 2_600_000, 8, 1024, code_dim=256)  # 16 bytes cannot code 8 dims


def test_search_measures_keys_scanned_and_never_returns_fewer_than_k(tmp_path):
    """On uneven lists a small nprobe leaves some queries short of k neighbours; those are searched again with more
    lists until they have k, and the search reports the keys it scanned (faiss's own count)."""
    rng = np.random.default_rng(0)
    # clustered keys: a few big clusters and many small ones, so some IVF lists hold far fewer than k keys
    centres = rng.normal(0, 5, (64, 16)).astype(np.float32)
    sizes = np.r_[np.full(4, 1500), np.full(60, 40)]
    keys = np.concatenate([c + rng.normal(0, 0.3, (s, 16)) for c, s in zip(centres, sizes)]).astype(np.float32)
    params = {"ncentroids": 64, "code_size": 4, "train_size": len(keys), "nprobe": 1, "add_chunk": 4096, "seed": 1}
    build_ivfpq(keys, "l2", params, tmp_path / "index", threads=1)
    queries = (centres[4:] + rng.normal(0, 0.3, (60, 16))).astype(np.float32)  # near the small clusters
    k = 100
    st = search(tmp_path / "index", queries, k, 1, tmp_path / "ids.npy", tmp_path / "dists.npy", chunk=16, threads=1)
    ids = np.load(tmp_path / "ids.npy")
    assert st["requeried_for_k"] > 0 and st["missing_neighbours"] == 0 and (ids >= 0).all()
    assert all(len(set(row)) == k for row in ids)
    # keys scanned: at least the k found per query, at most every key
    assert k <= st["keys_scanned_per_query"] <= len(keys)
    # the distances are the PQ distances of the ids, sorted (the FAISS score of the FAISS mask)
    d = np.load(tmp_path / "dists.npy")
    assert (np.diff(d, axis=1) >= -1e-5).all()
    assert math.isfinite(st["keys_scanned_per_query"])
    # counted from the probed lists' sizes (any device) it equals faiss's own count of PQ distances (CPU only)
    assert st["keys_scanned_per_query"] == pytest.approx(st["keys_scanned_faiss"])
    # brute force: the lists the coarse quantizer picks for each query, their sizes summed (nprobe 1, no requery)
    import faiss

    index = faiss.read_index(str(tmp_path / "index"))
    ivf = faiss.extract_index_ivf(index)
    sizes = np.array([ivf.invlists.list_size(i) for i in range(ivf.nlist)])
    _, lists = ivf.quantizer.search(queries, 1)
    st1 = search(tmp_path / "index", queries, 1, 1, tmp_path / "i1.npy", tmp_path / "d1.npy", chunk=16, threads=1)
    assert st1["requeried_for_k"] == 0 and st1["keys_scanned_per_query"] == pytest.approx(sizes[lists].sum() / len(queries))


def test_search_cache_rows_are_faiss_rows_in_order(tmp_path):
    """The neighbour cache, written chunk by chunk by a second thread while the next chunk is searched, holds row for
    row what one faiss search of every query gives (chunks of 7 rows over 50 queries, the last one short)."""
    import faiss

    rng = np.random.default_rng(1)
    keys = rng.normal(size=(3000, 16)).astype(np.float32)
    params = {"ncentroids": 16, "code_size": 4, "train_size": len(keys), "nprobe": 8, "add_chunk": 1024, "seed": 1}
    build_ivfpq(keys, "l2", params, tmp_path / "index", threads=1)
    queries = rng.normal(size=(50, 16)).astype(np.float32)
    st = search(tmp_path / "index", queries, 20, 8, tmp_path / "ids.npy", tmp_path / "dists.npy", chunk=7, threads=1)
    index = faiss.read_index(str(tmp_path / "index"))
    faiss.extract_index_ivf(index).nprobe = 8
    d, i = index.search(queries, 20)
    assert st["requeried_for_k"] == 0
    np.testing.assert_array_equal(np.load(tmp_path / "ids.npy"), i)
    np.testing.assert_array_equal(np.load(tmp_path / "dists.npy"), d)


def test_tau_grid_is_extended_while_its_optimum_is_on_the_edge():
    """A valid NLL curve with its minimum at τ = 7.5 beyond a 0 … 3 grid: the grid grows by its own span (3.5 …
    6, 6.5 … 9) until τ* is inside it; with too few extensions τ* stays on the upper edge and is flagged."""
    from knnlm.config import extend_while_on_edge, extended_temperatures, tau_edge, temperatures

    cfg = {"temperature": {"start": 0.0, "stop": 3.0, "step": 0.5, "max_extensions": 3}}
    nll = lambda t: (t - 7.5) ** 2
    computed = []

    def add(more):
        computed.extend(more)

    best = lambda grid: int(np.argmin([nll(t) for t in grid]))
    taus, i = extend_while_on_edge(cfg, temperatures(cfg), best, add)
    assert extended_temperatures(cfg, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]) == [3.5, 4.0, 4.5, 5.0, 5.5, 6.0]
    assert taus[i] == 7.5 and taus[-1] == 9.0 and computed == taus[7:] and tau_edge(taus, i, cfg) == ""
    short = {"temperature": {**cfg["temperature"], "max_extensions": 1}}
    taus, i = extend_while_on_edge(short, temperatures(short), best, lambda more: None)
    assert taus[i] == 6.0 and tau_edge(taus, i, short) == "upper"
    # an optimum inside the grid: nothing is extended; τ* = 0 on a grid starting at 0 is the limit, not an edge
    taus, i = extend_while_on_edge(cfg, temperatures(cfg), lambda grid: 0, add)
    assert taus == temperatures(cfg) and tau_edge(taus, 0, cfg) == ""


def test_settings_that_cannot_work_are_refused_before_the_search():
    """k beyond the store's keys and an explicit nprobe beyond the index's lists are refused naming the config key
    (never a search padded with missing neighbours, nor a silent clamp); 'auto' nprobe is capped at the lists."""
    from knnlm.config import section_defaults
    from knnlm.search.index import resolve_index_params

    cfg = section_defaults("index")
    with pytest.raises(ValueError, match=r"config key 'knn.k': k = 50,000 neighbours, but this store has 38,579 keys"):
        resolve_index_params(cfg, 38_579, 128, 50_000)
    with pytest.raises(ValueError, match=r"config key 'index.nprobe': 600 lists probed per query, but the index has "
                                         r"512 lists"):
        resolve_index_params({**cfg, "ncentroids": 512, "nprobe": 600}, 38_579, 128, 16)
    assert resolve_index_params({**cfg, "ncentroids": 512}, 38_579, 128, 38_579)["nprobe"] == 512


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_an_index_fits_its_own_correlated_keys_and_no_others(metric):
    """check_index_fits takes an IVFPQ index of keys that share a large common component (as a layer's states do:
    an IP quantizer's residuals then reconstruct them loosely, and the reconstruction error on them is not far below
    that on unrelated keys of the store) under either metric, and refuses the index for keys correlated with its own
    (the other key type's of the same rows) and for an index whose ids point at other rows."""
    import faiss

    from knnlm.io import ArtifactError
    from knnlm.search.index import check_index_fits

    rng = np.random.default_rng(0)
    n, d = 20_000, 64
    mean = 3 * rng.normal(0, 1, d).astype(np.float32)
    keys = (mean + rng.normal(0, 1, (n, d))).astype(np.float32)
    other = (0.8 * keys + 0.6 * (mean + rng.normal(0, 1, (n, d)))).astype(np.float32)  # correlation ~0.8 per entry
    kind = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    quantizer = faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d)
    ix = faiss.IndexIVFPQ(quantizer, d, 64, 4, 8, kind)
    ix.train(keys)
    ix.add(keys)
    fit = check_index_fits(ix, "own.faiss", metric, keys, "att")
    assert fit["code_agreement"] == 1.0 and fit["samples"] == 64
    assert fit["ratio"] > 0.45  # the reconstruction ratio alone would have refused it
    with pytest.raises(ArtifactError, match=r"other.faiss: the vectors it holds are not these ffn keys \(\d+% of"):
        check_index_fits(ix, "other.faiss", metric, other, "ffn")
    shuffled = faiss.IndexIVFPQ(faiss.IndexFlatIP(d) if metric == "ip" else faiss.IndexFlatL2(d), d, 64, 4, 8, kind)
    shuffled.train(keys)
    shuffled.add(keys[rng.permutation(n)])
    with pytest.raises(ArtifactError, match="not these att keys"):
        check_index_fits(shuffled, "shuffled.faiss", metric, keys, "att")
