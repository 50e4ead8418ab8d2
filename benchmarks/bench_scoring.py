"""Benchmark: the per-neighbour work of the settings jobs (Xu et al. 2023, Sec. 5) against what a user would write.

  python benchmarks/bench_scoring.py [--n 1000000] [--d 256] [--t 2048] [--k 1024] [--real results/wikitext2]

1. "Real score" (exact distances of given neighbours, knnlm.search.exact.recompute_distances: a numba kernel reading
   each neighbour's fp16 row from the memmap) vs numpy (gather the rows, then einsum) and vs faiss
   (IndexFlatL2.compute_distance_subset, fp32 keys already in RAM). Goal: faster than both; same distances.
2. recall@k of approximate vs exact neighbours (knnlm.experiments.retrieval.recall_at_k: a marker array per block of
   rows in numba, O(k) per row) vs numpy's isin over row-offset ids. Goal: faster; same value.
Random normal keys (a memmap in a temp dir) and queries; ids drawn uniformly (the worst case for locality). With
--real <run>: the real score once more on a finished run's own att keys (its datastore's memmap), its first t test
queries and their FAISS att/L2 neighbours on the full store, the case the settings jobs see (a key file the kernel
did not just write: random rows cost more there, and the kernel's prefetching matters most).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.search.exact import recompute_distances  # noqa: E402
from knnlm.experiments.retrieval import recall_at_k  # noqa: E402

from _data import make_keys  # noqa: E402  (benchmarks/_data.py, beside this script)


def best_of(fn, reps: int = 3) -> tuple[float, object]:
    out, best = None, float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def numpy_gather(keys, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[t, k] squared L2 distances of the queries q [t, d] to their neighbours' key rows (ids [t, k]) the way numpy
    would: gather 64 queries' rows at a time from the memmap, then einsum (the reference the real score is timed
    against)."""
    out = np.empty(ids.shape, dtype=np.float32)
    for s in range(0, len(ids), 64):
        diff = np.asarray(keys[ids[s:s + 64]], dtype=np.float32) - q[s:s + 64, None, :]  # [64, k, d]
        out[s:s + 64] = np.einsum("tkd,tkd->tk", diff, diff)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--t", type=int, default=2048)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--real", help="a finished run's results dir (results/<name>): its att keys, test queries and "
                                   "their FAISS att/L2 neighbours on the full store")
    a = ap.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        keys = make_keys(Path(tmp) / "keys.npy", a.n, a.d)
        q = rng.normal(size=(a.t, a.d)).astype(np.float32)
        ids = rng.integers(0, a.n, size=(a.t, a.k)).astype(np.int32)
        recompute_distances(keys, q[:8], ids[:8], "l2")  # the numba kernel's first call (compile or cache load)

        t_ours, ours = best_of(lambda: recompute_distances(keys, q, ids, "l2"))

        t_np, ref = best_of(lambda: numpy_gather(keys, q, ids), 1)
        flat = faiss.IndexFlatL2(a.d)
        flat.add(np.asarray(keys, dtype=np.float32))
        lab = ids.astype(np.int64)

        def faiss_subset():
            out = np.empty((a.t, a.k), dtype=np.float32)
            flat.compute_distance_subset(a.t, faiss.swig_ptr(q), a.k, faiss.swig_ptr(out), faiss.swig_ptr(lab))
            return out

        t_faiss, ref_f = best_of(faiss_subset)
        del flat
        rel = float(np.max(np.abs(ours - ref) / np.maximum(ref, 1e-6)))
        print(f"real score, {a.t} queries x {a.k} neighbours, N = {a.n:,}, D = {a.d}: ours {t_ours:.2f} s (fp16 memmap); "
              f"numpy gather + einsum {t_np:.2f} s, ratio {t_np / t_ours:.1f}x; faiss compute_distance_subset (fp32 in "
              f"RAM) {t_faiss:.2f} s, ratio {t_faiss / t_ours:.1f}x (goal > 1); max relative difference {rel:.1e}")

        exact = ids.copy()
        exact[:, ::3] = rng.integers(0, a.n, size=exact[:, ::3].shape)
        recall_at_k(ids[:4], exact[:4])
        t_rec, r_ours = best_of(lambda: recall_at_k(ids, exact))

        def numpy_isin():
            off = (np.arange(a.t, dtype=np.int64) * (a.n + 2))[:, None]
            return float(np.isin(ids + off, exact + off).sum(1).mean() / a.k)

        t_isin, r_np = best_of(numpy_isin, 1)
        print(f"recall@{a.k} of {a.t} rows: ours {t_rec:.3f} s; numpy isin {t_isin:.2f} s, ratio {t_isin / t_rec:.0f}x "
              f"(goal > 1); values {r_ours:.6f} / {r_np:.6f}")
    if a.real:
        real_run(Path(a.real), a.t)


def real_run(root: Path, t: int) -> None:
    """The real score on a finished run's att keys, first t test queries and their FAISS att/L2 neighbours (full
    store), against numpy's gather + einsum on the same rows."""
    from knnlm.paths import Layout

    lay = Layout(root.parent, root.name)
    keys = np.load(lay.path("keys", lm="base", key="att"), mmap_mode="r")
    ids = np.load(lay.path("nb_ids", lm="base", store="full", key="att", metric="l2", split="test"), mmap_mode="r")
    q = np.load(lay.path("queries", lm="base", split="test", key="att"), mmap_mode="r")
    t = min(t, ids.shape[0])
    q, ids = np.ascontiguousarray(q[:t], dtype=np.float32), np.ascontiguousarray(ids[:t])
    recompute_distances(keys, q[:8], ids[:8], "l2")
    t_ours, ours = best_of(lambda: recompute_distances(keys, q, ids, "l2"))
    t_np, ref = best_of(lambda: numpy_gather(keys, q, ids), 1)
    rel = float(np.max(np.abs(ours - ref) / np.maximum(ref, 1e-6)))
    print(f"real score on {root}'s att keys ({keys.shape[0]:,} x {keys.shape[1]}), its first {t} test queries x "
          f"{ids.shape[1]} FAISS neighbours: ours {t_ours:.2f} s ({ids.size / t_ours / 1e6:.1f}M distances/s); numpy "
          f"gather + einsum {t_np:.2f} s, ratio {t_np / t_ours:.1f}x (goal > 1); max relative difference {rel:.1e}")


if __name__ == "__main__":
    main()
