"""Exact search and exact distances vs faiss IndexFlatL2 / IndexFlatIP on small data."""
import os

import faiss
import numpy as np
import pytest

from conftest import rss_mb
from knnlm.search.exact import exact_topk, recompute_distances


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(3000, 24)).astype(np.float16)
    queries = rng.normal(size=(70, 24)).astype(np.float32)
    return keys, queries


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_exact_topk_matches_faiss_flat(data, metric):
    keys, queries = data
    flat = faiss.IndexFlatL2(24) if metric == "l2" else faiss.IndexFlatIP(24)
    flat.add(keys.astype(np.float32))
    ref_d, ref_i = flat.search(queries, 50)
    # small chunks so that the per-chunk merge is exercised (3000 keys in 7 chunks, 70 queries in 3)
    ids, d = exact_topk(keys, queries, 50, metric, key_chunk=450, query_chunk=32, progress=False)
    assert ids.shape == (70, 50) and ids.dtype == np.int64 and d.dtype == np.float32
    np.testing.assert_allclose(d, ref_d, rtol=1e-4, atol=1e-4)
    agree = np.mean([len(set(ids[i]) & set(ref_i[i])) / 50 for i in range(70)])
    assert agree > 0.99  # equal up to ties at the k-th distance


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_both_cpu_gemms_give_the_same_neighbours(data, metric, monkeypatch):
    """The CPU GEMM of the exact search (exact.cpu_gemm: numpy's OpenBLAS or torch's MKL, by CPU vendor or
    KNNLM_CPU_GEMM) only changes float32 rounding: the same neighbours and distances either way."""
    from knnlm.search import exact

    keys, queries = data
    out = {}
    for lib in ("numpy", "torch"):
        monkeypatch.setenv("KNNLM_CPU_GEMM", lib)
        assert exact.cpu_gemm() == lib
        monkeypatch.setattr(exact, "_CPU_GEMM", lib)
        out[lib] = exact_topk(keys, queries, 50, metric, key_chunk=450, query_chunk=32, progress=False)
    np.testing.assert_allclose(out["numpy"][1], out["torch"][1], rtol=1e-5, atol=1e-5)
    assert np.mean(out["numpy"][0] == out["torch"][0]) > 0.99
    monkeypatch.setenv("KNNLM_CPU_GEMM", "blas")
    with pytest.raises(ValueError, match="KNNLM_CPU_GEMM"):
        exact.cpu_gemm()


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_exact_topk_subset_and_seeded_thresholds(data, metric, tmp_path):
    """A datastore subset (rows), a memmap read with pread, several query blocks, and the sampled thresholds."""
    keys, queries = data
    path = tmp_path / "keys.npy"
    np.save(path, keys)
    mm = np.load(path, mmap_mode="r")
    rows = np.sort(np.random.default_rng(2).choice(len(keys), size=1800, replace=False))
    for r, k in ((None, 10), (rows, 10), (rows, 40)):
        ref_d, ref_i = _flat_search(keys if r is None else keys[r], queries, k, metric)
        if r is not None:
            ref_i = rows[ref_i]  # exact_topk returns datastore row ids
        ids, d = exact_topk(mm, queries, k, metric, key_chunk=256, query_chunk=16, query_block=48, rows=r,
                            sample_runs=16, progress=False)
        np.testing.assert_allclose(d, ref_d, rtol=1e-4, atol=1e-4)
        agree = np.mean([len(set(ids[i]) & set(ref_i[i])) / k for i in range(len(queries))])
        assert agree > 0.99


def _flat_search(keys, queries, k, metric):
    flat = faiss.IndexFlatL2(keys.shape[1]) if metric == "l2" else faiss.IndexFlatIP(keys.shape[1])
    flat.add(keys.astype(np.float32))
    return flat.search(queries, k)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_recompute_distances_matches_bruteforce(data, metric):
    keys, queries = data
    rng = np.random.default_rng(1)
    ids = rng.integers(0, len(keys), size=(70, 9))
    ids[3, 4:] = -1
    ids[5, :] = -1  # a row with no neighbour: nothing to prefetch
    ids[6, 0] = -1  # a missing neighbour inside the first prefetch window
    got = recompute_distances(keys, queries, ids, metric, query_chunk=16)
    # fewer neighbours than the kernel prefetches ahead (PREFETCH_AHEAD = 8): the same distances
    assert np.array_equal(recompute_distances(keys, queries, ids[:, :3], metric), got[:, :3])
    x = keys.astype(np.float64)
    for t in range(70):
        for j in range(9):
            if ids[t, j] < 0:
                assert got[t, j] == (np.inf if metric == "l2" else -np.inf)
                continue
            v = x[ids[t, j]]
            want = ((queries[t] - v) ** 2).sum() if metric == "l2" else (queries[t] * v).sum()
            assert got[t, j] == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_exact_bad_arguments(data):
    keys, queries = data
    with pytest.raises(ValueError, match="metric"):
        exact_topk(keys, queries, 5, "cos")
    with pytest.raises(ValueError, match="k must be"):
        exact_topk(keys, queries, 5000, "l2")


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_fp16_keys_near_their_range_never_overflow(metric, tmp_path):
    """Keys stored fp16 with entries near fp16's maximum (65504): their squared norms (~1e10) and inner products
    overflow fp16 but not the fp32 accumulation; exact search and the real score agree with float64 brute force."""
    rng = np.random.default_rng(5)
    n, d, t, k = 3000, 16, 40, 10
    keys = np.lib.format.open_memmap(tmp_path / "k.npy", mode="w+", dtype=np.float16, shape=(n, d))
    keys[:] = (rng.uniform(-1, 1, (n, d)) * 60000).astype(np.float16)
    keys.flush()
    keys = np.load(tmp_path / "k.npy", mmap_mode="r")
    q = (rng.uniform(-1, 1, (t, d)) * 60000).astype(np.float32)
    x = np.asarray(keys, dtype=np.float64)
    full = ((q[:, None, :] - x[None]) ** 2).sum(-1) if metric == "l2" else q.astype(np.float64) @ x.T
    order = np.argsort(full if metric == "l2" else -full, axis=1, kind="stable")[:, :k]
    ids, dists = exact_topk(keys, q, k, metric, key_chunk=1024, query_chunk=16, progress=False)
    assert np.isfinite(dists).all() and np.abs(dists).max() > 1e10
    want = np.take_along_axis(full, order, 1)
    np.testing.assert_allclose(dists, want, rtol=1e-4)
    np.testing.assert_allclose(recompute_distances(keys, q, ids, metric), np.take_along_axis(full, ids, 1), rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_recompute_distances_every_fp16_class(tmp_path, dtype, metric):
    """The CPU kernel converts fp16 keys in registers: zeros, subnormals, negatives and the largest fp16 values all
    give the fp64 brute-force distance (read from a memmap, as in the pipeline)."""
    rng = np.random.default_rng(5)
    n, d = 300, 40
    x = rng.normal(size=(n, d)) * rng.choice([1e-6, 3e-5, 1.0, 100.0], size=(n, 1))  # 1e-6, 3e-5: fp16 subnormals
    x[0] = 0.0
    x[1, :3] = [65504.0, -65504.0, -0.0]
    keys = np.lib.format.open_memmap(tmp_path / "k.npy", "w+", dtype, (n, d))
    keys[:] = x
    keys.flush()
    keys = np.load(tmp_path / "k.npy", mmap_mode="r")
    assert dtype == np.float32 or (np.abs(np.asarray(keys[2:], dtype=np.float64)) < 6.1e-5).any()  # subnormals present
    q = rng.normal(size=(30, d)).astype(np.float32)
    ids = rng.integers(0, n, size=(30, 25))
    ids[:, 0], ids[:, 1], ids[2, 5:] = 0, 1, -1
    got = recompute_distances(keys, q, ids, metric)
    kx, qx = np.asarray(keys, dtype=np.float64), q.astype(np.float64)
    full = ((qx[:, None] - kx[None]) ** 2).sum(-1) if metric == "l2" else qx @ kx.T
    want = np.where(ids >= 0, np.take_along_axis(full, np.maximum(ids, 0), 1), np.inf if metric == "l2" else -np.inf)
    assert np.array_equal(np.isinf(got), ids < 0)
    ok = ids >= 0
    mag = np.take_along_axis((np.abs(qx) + 1) @ (np.abs(kx) + 1).T, np.maximum(ids, 0), 1)  # Σ|q_c k_c|-like scale
    assert (np.abs(got - want)[ok] <= (2e-6 * np.abs(want) + 1e-6 * mag)[ok]).all()  # fp32 sums of exact products
    with pytest.raises(IndexError, match="out of range"):
        recompute_distances(keys, q, np.full((2, 2), n), metric)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_nested_subsets_in_one_scan_equal_separate_searches(metric):
    """exact_topk with stops over knnlm.datastore.stores.nested_scan rows gives, at each stop, the exact search of that
    subset alone (Sec. 5's datastore sizes in one pass); the first chunk seeds every subset's threshold."""
    from knnlm.datastore.stores import nested_scan, subsample_rows

    rng = np.random.default_rng(3)
    keys = rng.normal(size=(6000, 16)).astype(np.float16)
    q = rng.normal(size=(50, 16)).astype(np.float32)
    ratios = [0.25, 1.0, 0.5]
    rows, stops = nested_scan(len(keys), ratios, seed=7)
    assert stops == [1500, 3000, 6000]
    got = exact_topk(keys, q, 20, metric, key_chunk=512, query_chunk=16, rows=rows, stops=stops, progress=False)
    for r, (ids, d) in zip(sorted(ratios), got):
        sub = subsample_rows(len(keys), r, 7)
        assert set(rows[:len(sub)].tolist()) == set(sub.tolist())
        want_i, want_d = exact_topk(keys, q, 20, metric, key_chunk=512, query_chunk=16, rows=sub, progress=False)
        np.testing.assert_allclose(d, want_d, rtol=1e-5)
        assert (np.sort(ids, 1) == np.sort(want_i, 1)).mean() > 0.99  # ids up to ties
        assert np.isin(ids, sub).all()
    with pytest.raises(ValueError, match="stops"):
        exact_topk(keys, q, 20, metric, rows=rows, stops=[3000, 1500, 6000], progress=False)


def test_kth_bound_is_a_lower_bound_that_filters():
    """The first key chunk seeds each query's threshold with _kth_bound: at least k scores of a row reach it (so it
    never exceeds the k-th best and exact search stays exact), also when a row's best scores sit in a few groups,
    and on normal scores it lets through under 1.5x the exact k-th best's share (3.5 % vs 3.1 % measured)."""
    import torch

    from knnlm.search.exact import _kth_best, _kth_bound

    rng = np.random.default_rng(0)
    k = 64
    for n in (64 * k, 8 * k, 2 * k, 1000):  # groups of 8, of 2, none (exact), n not a multiple of 2
        sc = torch.from_numpy(rng.standard_normal((50, n), dtype=np.float32))
        sc[0] = torch.arange(n, dtype=torch.float32)  # the best scores in consecutive groups
        sc[1] = torch.arange(n, dtype=torch.float32).flip(0)
        sc[2] = 0.0  # all tied
        g = max(1, n // (4 * k))
        if n % g == 0:  # group j of the bound = scores j, j + n/g, ...: here it holds the g consecutive values j*g..
            sc[3] = torch.arange(n, dtype=torch.float32).view(n // g, g).T.reshape(-1)
        bound, kth = _kth_bound(sc, k), _kth_best(sc, k)
        assert ((sc >= bound[:, None]).sum(1) >= k).all() and (bound <= kth).all()
        if n == 64 * k:
            assert (sc[4:] >= bound[4:, None]).float().mean() < 1.5 * k / n


def test_first_chunk_is_seeded_by_kth_bound(monkeypatch):
    """exact_topk (CPU) seeds the thresholds of the first key chunk with _kth_bound (once per query chunk) when the
    chunk holds ≥ 4k keys, also when the chunk is narrower than the score buffer (a strided view of it), and stays
    exact (faiss Flat's distances). Fails if the first chunk is seeded by anything else (e.g. np.partition)."""
    import faiss

    import knnlm.search.exact as ex

    calls = []
    real = ex._kth_bound
    monkeypatch.setattr(ex, "_kth_bound", lambda sc, k: calls.append(tuple(sc.shape)) or real(sc, k))
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((5000, 16)).astype(np.float32)
    q = rng.standard_normal((70, 16)).astype(np.float32)
    ids, d = ex.exact_topk(keys, q, 50, "l2", key_chunk=8192, query_chunk=32, progress=False)
    assert calls == [(32, 5000), (32, 5000), (6, 5000)]
    index = faiss.IndexFlatL2(16)
    index.add(keys)
    want_d, _ = index.search(q, 50)
    np.testing.assert_allclose(d, want_d, rtol=1e-5, atol=1e-5)


def test_kth_largest_radix_select():
    """_select.kth_largest (the merge's radix select on float32 order keys) equals the k-th value of a sort, on
    normal values, values of both signs with ties, −inf padding (an unfilled top-k), denormals and ±0, for every
    split of the values between its two arrays. Fails if the order key mishandles negatives or a bucket walk is
    off by one."""
    from knnlm.search._select import kth_largest

    rng = np.random.default_rng(5)
    cases = [rng.standard_normal(300).astype(np.float32),
             np.round(rng.standard_normal(300), 1).astype(np.float32),
             np.concatenate([np.full(150, -np.inf), rng.standard_normal(150)]).astype(np.float32),
             np.array([0.0, -0.0, 1e-40, -1e-40, 3.0, -3.0] * 50, dtype=np.float32)]
    for v in cases:
        want = np.sort(v)[::-1]
        for na in (0, 1, 150, 300):
            a, b = v[:na].copy(), v[na:].copy()
            for k in (1, 2, 77, 150, 299, 300):
                got = kth_largest(a, len(a), b, len(b), k)
                assert got == want[k - 1], (na, k, got, want[k - 1])


def test_subset_key_reads_keep_the_rss_flat(tmp_path):
    """Exact search over a subset of a 64 MB fp16 key memmap (every 4th row: every page of the file is touched) and
    over its queries as a memmap ends with the file pages in its RSS grown by far less than the file (KeyReader and the
    query blocks release their pages), and finds what a search over the same rows in RAM finds; so does the real score
    of random neighbours (recompute_distances releases the key pages it read)."""
    from knnlm.io import open_npy, release_rows, save_npy

    n, d, t = 131072, 256, 4096
    rng = np.random.default_rng(0)
    save_npy(tmp_path / "keys.npy", rng.standard_normal((n, d)).astype(np.float16))
    save_npy(tmp_path / "q.npy", rng.standard_normal((t, d)).astype(np.float32))
    keys, q = open_npy(tmp_path / "keys.npy", (n, d), np.float16), open_npy(tmp_path / "q.npy", (t, d), np.float32)
    rows = np.arange(0, n, 4)

    sub, qq = np.array(keys[rows]), np.array(q)  # the reference, in RAM; its search maps the code's pages
    want_i, want_d = exact_topk(sub, qq, 8, "l2", key_chunk=4096, query_chunk=256, progress=False)
    del sub, qq
    for a in (keys, q):  # the copies' pages leave the RSS
        release_rows(a, 0, len(a))
    before = rss_mb("RssFile")
    ids, dists = exact_topk(keys, q, 8, "l2", key_chunk=4096, query_chunk=256, query_block=1024, rows=rows,
                            progress=False)
    grown = rss_mb("RssFile") - before
    assert grown < 16, grown  # the key file is 64 MB and the queries 4 MB
    before = rss_mb("RssFile")  # real score of random neighbours: most pages of the key file are read, then released
    nb = rng.integers(0, n, size=(256, 512))
    got = recompute_distances(keys, np.asarray(q[:256]), nb, "l2")
    assert rss_mb("RssFile") - before < 16
    np.testing.assert_allclose(got, ((np.asarray(keys, dtype=np.float32)[nb] - np.asarray(q[:256])[:, None]) ** 2).sum(-1),
                               rtol=1e-4)
    assert (ids == rows[want_i]).all() and np.allclose(dists, want_d)


def _shards_then_merge(keys, q, k, metric, key_chunk, spans, rows=None):
    """The sharded exact search as the DAG runs it: exact_topk per span (k capped at the span's keys, empty spans
    give no candidates), then merge_topk."""
    from knnlm.search.exact import merge_topk

    parts = []
    for a, b in spans:
        w = min(k, b - a)
        if w == 0:
            parts.append((np.empty((len(q), 0), np.int32), np.empty((len(q), 0), np.float32)))
            continue
        i, d = exact_topk(keys, q, w, metric, key_chunk=key_chunk, query_chunk=16, rows=rows, span=(a, b),
                          progress=False)
        parts.append((i.astype(np.int32), d))  # int32 as the DAG's shard files
    out = (np.empty((len(q), k), np.int32), np.empty((len(q), k), np.float32))
    return merge_topk(parts, k, metric, out, block=23, progress=False)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_sharded_exact_search_equals_one_scan_ties_included(metric):
    """Shards of whole key chunks (knnlm.datastore.stores.shard_spans) searched apart and merged give the very ids and
    distances of one scan over every key, with exact ties (a third of the keys duplicated, so equally distant keys
    straddle shard ends and the k-th place): ids in canonical order (closest first, ties by ascending id). Also over a
    subset (rows) and with more shards than chunks (empty shards)."""
    from knnlm.datastore.stores import shard_spans

    rng = np.random.default_rng(5)
    keys = rng.normal(size=(5000, 16)).astype(np.float16)
    keys[3000:4600] = keys[:1600]  # duplicates: exact ties across shards
    q = rng.normal(size=(60, 16)).astype(np.float32)
    q[:5] = keys[[10, 20, 3010, 4700, 100]]  # queries on a key (and its duplicate)
    rows = np.sort(rng.choice(5000, 3100, replace=False))
    for sub, chunk, shards in ((None, 512, 4), (None, 512, 3), (rows, 256, 5), (None, 4096, 3)):
        n = 5000 if sub is None else len(sub)
        spans = shard_spans(n, shards, chunk)
        assert spans[0][0] == 0 and spans[-1][1] == n and all(a % chunk == 0 or a == n for a, _ in spans)
        want_i, want_d = exact_topk(keys, q, 40, metric, key_chunk=chunk, query_chunk=16, rows=sub, progress=False)
        got_i, got_d = _shards_then_merge(keys, q, 40, metric, chunk, spans, rows=sub)
        np.testing.assert_array_equal(got_d, want_d)
        kth = want_d[:, -1:]
        inside = want_d != kth  # up to which of the keys tied at the k-th distance is kept
        np.testing.assert_array_equal(got_i[inside], want_i[inside])
        assert (want_d == kth).sum() > 0 and (np.diff(want_d, axis=1) == 0).sum() > 50  # ties were exercised
    assert shard_spans(5000, 3, 4096) == [(0, 4096), (4096, 5000), (5000, 5000)]


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_merge_lifts_k_and_keeps_ties_by_id(metric):
    """merge_topk takes any k up to the shards' candidates (here k = 2,500, above faiss-GPU's 2,048 limit, from shards
    of 1,000 keys that each return all of theirs) and equals faiss Flat on all keys; among equal distances it keeps
    the smallest ids; shapes it cannot merge raise."""
    from knnlm.search.exact import merge_topk

    rng = np.random.default_rng(9)
    keys = rng.normal(size=(4000, 8)).astype(np.float32)
    keys[2000:2100] = keys[0:100]
    q = rng.normal(size=(10, 8)).astype(np.float32)
    flat = faiss.IndexFlatL2(8) if metric == "l2" else faiss.IndexFlatIP(8)
    flat.add(keys)
    ref_d, _ = flat.search(q, 2500)
    parts = [exact_topk(keys, q, 1000, metric, key_chunk=512, span=(a, a + 1000), progress=False)
             for a in range(0, 4000, 1000)]
    out = (np.empty((10, 2500), np.int64), np.empty((10, 2500), np.float32))
    ids, d = merge_topk(parts, 2500, metric, out, progress=False)
    np.testing.assert_allclose(d, ref_d, rtol=1e-4, atol=1e-4)
    assert (np.sort(d, 1) == (d if metric == "l2" else np.sort(d, 1))).all()
    # ties by ascending id: key j and its duplicate 2000 + j are equally distant, j comes first
    pos = {int(i): j for j, i in enumerate(ids[0])}
    pairs = [(j, 2000 + j) for j in range(100) if j in pos and 2000 + j in pos]
    assert len(pairs) > 20 and all(pos[a] < pos[b] and d[0, pos[a]] == d[0, pos[b]] for a, b in pairs)
    # a tie at the k-th place keeps the smaller id
    two = (np.array([[7, 1]]), np.array([[0.5, 0.5]], np.float32))
    got = merge_topk([two], 1, "l2", (np.empty((1, 1), np.int64), np.empty((1, 1), np.float32)), progress=False)
    assert got[0][0, 0] == 1
    with pytest.raises(ValueError, match="k must be"):
        merge_topk(parts, 4001, metric, (np.empty((10, 4001), np.int64), np.empty((10, 4001), np.float32)))


def test_nested_shards_plan():
    """nested_shards cuts each segment of the nested scan by its share; no shard straddles a subset's end."""
    from knnlm.datastore.stores import nested_shards

    assert nested_shards([1.0], 3) == [(0, 0, 3), (0, 1, 3), (0, 2, 3)]
    assert nested_shards([0.2, 1.0], 2) == [(0, 0, 1), (1, 0, 2), (1, 1, 2)]
    assert nested_shards([0.05, 0.1, 1.0], 4) == [(0, 0, 1), (1, 0, 1), (2, 0, 4), (2, 1, 4), (2, 2, 4), (2, 3, 4)]
    with pytest.raises(ValueError, match="shards"):
        nested_shards([1.0], 0)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_tiles_match_faiss_flat(metric, threads, monkeypatch):
    """Chunks after the first go through the CPU's tiles (_scan_tiles): several key tiles per chunk and a short last
    one, several row tiles per worker and a short last one, one or two worker threads; the neighbours are faiss
    Flat's, and the GEMM's thread count is restored afterwards. Fails if the tiles are skipped or drop a score."""
    import faiss
    import torch

    import knnlm.search.exact as ex

    calls = []
    real = ex._scan_tiles
    monkeypatch.setattr(ex, "_scan_tiles", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((12003, 16)).astype(np.float16)
    q = rng.standard_normal((300, 16)).astype(np.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ids, d = ex.exact_topk(keys, q, 64, metric, key_chunk=4992, query_chunk=300, progress=False)
        if threads > 1:  # the one-thread GEMM's setting is undone (numba's parallel kernels reset OpenMP's count to
            assert torch.get_num_threads() == threads  # their own, so threads = 1 cannot be checked this way)
    finally:
        torch.set_num_threads(before)
    assert calls == [4992, 2019]  # key chunks 2 and 3 (the first seeds the thresholds); 2,019 = 126 groups + 3
    want_d, want_i = _flat_search(keys, q, 64, metric)
    np.testing.assert_allclose(d, want_d, rtol=1e-5, atol=1e-5)
    assert np.mean([len(set(ids[i]) & set(want_i[i])) / 64 for i in range(len(q))]) > 0.999


def test_cpu_tile_follows_the_l2_cache(tmp_path):
    """cpu_l2_bytes reads the level-2 data/unified cache of Linux's cache directory (not L1 or L3, not the
    instruction cache) and falls back to 1 MiB; the tile width is that size over 128 rows of fp32, in 1,024..4,096."""
    from knnlm.search.exact import TILE_KEYS, TILE_QUERIES, cpu_l2_bytes

    for name, level, kind, size in (("index0", 1, "Data", "48K"), ("index1", 2, "Instruction", "64K"),
                                    ("index2", 2, "Unified", "2048K"), ("index3", 3, "Unified", "260M")):
        (tmp_path / name).mkdir()
        for f, text in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / f).write_text(f"{text}\n")
    assert cpu_l2_bytes(str(tmp_path)) == 2 << 20
    assert cpu_l2_bytes(str(tmp_path / "missing")) == 1 << 20
    assert TILE_KEYS in (1024, 2048, 4096) and TILE_KEYS * TILE_QUERIES * 4 <= max(cpu_l2_bytes(), 1 << 19)


@pytest.mark.parametrize("buffer", [8, 1024])
def test_running_topk_both_kinds_equal_torch_topk(buffer):
    """The running top-k (the GPU kind _RunningTopK, run here on CPU tensors, and the CPU kind _RunningTopKCPU) over
    several blocks of scores, a small candidate buffer forcing merges and a threshold seeded from a sample as
    _seed_thresholds does: the same scores and ids as torch.topk over all the scores at once."""
    import torch

    from knnlm.search.exact import CPU_GROUP, GROUP, _RunningTopK, _RunningTopKCPU

    g = torch.Generator().manual_seed(0)
    m, k, blocks, width = 6, 20, 5, 4 * max(GROUP, CPU_GROUP) * 8
    scores = torch.randn(m, blocks * width, generator=g)
    ids = torch.arange(blocks * width, dtype=torch.int64) * 7 + 3  # datastore ids, not positions
    want_s, want_p = scores.topk(k, dim=1)
    sample = scores[:, torch.randperm(blocks * width, generator=g)[:4 * k]]
    for top in (_RunningTopK(m, k, "cpu", buffer=buffer), _RunningTopKCPU(m, k, buffer=buffer)):
        top.thr = torch.maximum(top.thr, sample.topk(k, dim=1).values.amin(1))  # a safe lower bound
        for b in range(blocks):
            top.add_block(scores[:, b * width:(b + 1) * width].contiguous(), ids[b * width:(b + 1) * width])
        s, i = top.result()
        s, i = torch.as_tensor(np.asarray(s)), torch.as_tensor(np.asarray(i))
        torch.testing.assert_close(s, want_s)
        assert torch.equal(i, ids[want_p]), type(top).__name__


def test_merge_job_refuses_shards_of_another_search(tmp_path):
    """experiments.retrieval.exact_merge merges shards that tile the scan into the one-scan top-k, and refuses, naming
    the shard files and leaving no output, shards of another 'retrieval.exact_shards' (spans that overlap or leave a
    gap) and shards that searched other tokens of the same number (token digests differ)."""
    import json

    from knnlm.experiments.retrieval import exact_merge
    from knnlm.io import ArtifactError
    from knnlm.job import Job

    rng = np.random.default_rng(5)
    n, t, k = 3000, 20, 16
    keys = rng.standard_normal((n, 8)).astype(np.float16)
    q = rng.standard_normal((t, 8)).astype(np.float32)

    def shard(name, a, b, shards, digest="d0"):
        i, d = exact_topk(keys, q, k, "l2", key_chunk=500, query_chunk=8, span=(a, b), progress=False)
        np.save(tmp_path / f"{name}_ids.npy", i.astype(np.int32))
        np.save(tmp_path / f"{name}_dists.npy", d)
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"T": t, "k": k, "N": n, "seconds": 1.0, "flop": 1.0, "checkpoint_sha256": "c", "span": [a, b],
             "shard": 0, "shards": shards, "token_digest": digest}))
        return name

    def merge(names, out):
        job = Job(cfg={"knn": {"k": k}}, wildcards={"metric": "l2"}, rule="exact_merge", threads=1,
                  input={"shard_ids": [str(tmp_path / f"{m}_ids.npy") for m in names],
                         "shard_dists": [str(tmp_path / f"{m}_dists.npy") for m in names],
                         "shard_meta": [str(tmp_path / f"{m}.json") for m in names]},
                  output={"ids": str(tmp_path / f"{out}_ids.npy"), "dists": str(tmp_path / f"{out}_dists.npy"),
                          "meta": str(tmp_path / f"{out}.json")})
        exact_merge(job)
        return np.load(tmp_path / f"{out}_ids.npy"), np.load(tmp_path / f"{out}_dists.npy")

    halves = [shard("h0", 0, 1500, 2), shard("h1", 1500, 3000, 2)]
    thirds = [shard("t0", 0, 1000, 3), shard("t1", 1000, 2000, 3), shard("t2", 2000, 3000, 3)]
    want_i, want_d = exact_topk(keys, q, k, "l2", key_chunk=500, query_chunk=8, progress=False)
    got_i, got_d = merge(halves, "ok")
    # queries of 8 rows: a BLAS may round such a product by its shape (OpenBLAS on an AMD EPYC, in some process
    # states), so the distances are compared to fp32 rounding here (the bitwise check:
    # test_sharded_exact_search_equals_one_scan_ties_included)
    np.testing.assert_allclose(got_d, want_d, rtol=2e-6, atol=0)
    near = np.isclose(want_d[:, 1:], want_d[:, :-1], rtol=2e-6, atol=0)
    tied = np.zeros(want_d.shape, dtype=bool)
    tied[:, 1:] |= near
    tied[:, :-1] |= near
    np.testing.assert_array_equal(got_i[~tied], want_i[~tied])
    assert json.loads((tmp_path / "ok.json").read_text())["token_digest"] == "d0"
    for names, what in (([halves[0], thirds[1], thirds[2]], "overlap"), ([thirds[0], halves[1]], "gap"),
                        ([halves[1], thirds[0]], "no start"), ([thirds[0], thirds[1]], "a shard missing"),
                        ([shard("x0", 0, 2000, 2), halves[1]], "overlap, one count")):
        with pytest.raises(ArtifactError, match=r"h\d.json|t\d.json") as e:
            merge(names, "bad")
        assert "do not tile the scan" in str(e.value), what
    other = shard("o1", 1500, 3000, 2, digest="d1")
    with pytest.raises(ArtifactError, match=r"disagree on \(queries, keys, checkpoint, token digest\)"):
        merge([halves[0], other], "bad")
    assert not list(tmp_path.glob("bad*"))


def test_key_reader_names_the_file_on_a_short_read(tmp_path):
    """KeyReader reads a key file with pread; a file cut after it was opened (a copy still being written, a full
    disk) gives OSError naming the file and the byte where the read stopped, not rows of zeros."""
    from knnlm.search.exact import KeyReader

    keys = np.arange(4000 * 16, dtype=np.float16).reshape(4000, 16)
    np.save(tmp_path / "keys.npy", keys)
    mm = np.load(tmp_path / "keys.npy", mmap_mode="r")
    reader = KeyReader(mm)
    np.testing.assert_array_equal(reader.read(3000, 4000), keys[3000:])
    os.truncate(tmp_path / "keys.npy", mm.offset + 3500 * 16 * 2)
    np.testing.assert_array_equal(reader.read(0, 3500), keys[:3500])
    with pytest.raises(OSError, match=r"keys.npy: short read at byte " + str(mm.offset + 3500 * 32)):
        reader.read(3000, 4000)
    reader.close()


def test_exact_search_under_inference_mode_in_worker_threads():
    """Called under torch.inference_mode (KNNLM.next_token_log_probs and generation with mask 'exact'), the CPU scan's
    worker threads still write their tile buffers: the same neighbours as outside it, with two worker threads."""
    import torch

    rng = np.random.default_rng(3)
    keys = rng.normal(size=(6000, 16)).astype(np.float16)
    q = rng.normal(size=(40, 16)).astype(np.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = exact_topk(keys, q, 8, "l2", key_chunk=1024, device="cpu", progress=False)
        with torch.inference_mode():
            got = exact_topk(keys, q, 8, "l2", key_chunk=1024, device="cpu", progress=False)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
