"""Benchmark: exact search (the "real mask") vs plain torch.mm and vs faiss brute force; memory scaling. Prints ratios.

  python benchmarks/bench_exact.py [--n 1000000] [--d 256] [--t 4096] [--k 1024] [--real results/wikitext2]
                                   [--key-chunk 32768] [--query-chunk 1024] [--skip-rss] [--repeat 3]

Data: random normal keys and queries, and (with --real <run>) the first n att keys of a finished run's datastore
with the first t of its valid att queries -- the threshold filter behaves differently on real data. For each:
1. exact_topk GFLOP/s over numpy's matmul GFLOP/s (its OpenBLAS, all threads) on the same product in blocks of
   --query-chunk x --key-chunk, fp32 keys in RAM, output buffer reused (goal >= 0.8): streaming, fp16->fp32
   conversion and top-k selection should cost little next to the matmul. Also over torch.mm (MKL on Intel CPUs),
   the GEMM exact_topk calls there (knnlm.search.exact.cpu_gemm).
2. exact_topk time over faiss brute force (faiss.knn on the same fp32 keys already in RAM, same k, same threads;
   goal > 1: faster than the library a user would otherwise pick), and whether the two agree (ids up to ties,
   distances to 1e-4 relative, and each one's error against float64 distances over |q|² + |x|², the scale of fp32
   rounding in |q|² + |x|² − 2 q·x, which both compute). The two run --repeat times in turn (default 3); the ratio
   is the median of the pairs' ratios, so a load that comes and goes on a shared machine moves both members of a
   pair.
3. peak RSS of exact search at 4x the datastore size over 1x (goal <= 1.2): memory is bounded by chunks.
"""
from __future__ import annotations

import os

# faiss and torch each keep an OpenMP pool; with the default (active) wait policy one library's idle threads spin
# while the other computes, which slowed the second stage ~3-10x when both ran in one process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# as knnlm/__init__.py: OpenBLAS threads stop spinning soon after each GEMM (before numpy loads OpenBLAS)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.search.exact import exact_topk  # noqa: E402

from _data import make_keys  # noqa: E402  (benchmarks/_data.py, beside this script)


def child(path: str, t: int, k: int) -> None:
    keys = np.load(path, mmap_mode="r")
    q = np.random.default_rng(1).normal(size=(t, keys.shape[1])).astype(np.float32)
    exact_topk(keys, q, k, "l2", progress=False)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec
    hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"max_rss_mb": hwm_kb / 1024}))


def time_gemm(mm, x: np.ndarray, q: np.ndarray, buf: np.ndarray, key_chunk: int, query_chunk: int) -> float:
    """Seconds for mm(q_block, x_block, out) over every (key chunk, query chunk) block, output buffer reused."""
    t0 = time.perf_counter()
    for s in range(0, x.shape[0], key_chunk):
        xs = x[s:s + key_chunk]
        for qs in range(0, q.shape[0], query_chunk):
            qq = q[qs:qs + query_chunk]
            mm(qq, xs, buf[:len(qq), :len(xs)])
    return time.perf_counter() - t0


def compare(name: str, keys: np.ndarray, q: np.ndarray, a) -> None:
    """Print exact_topk vs torch.mm and vs faiss.knn on one data set (keys: [n, d] fp16 memmap, q: [t, d] fp32)."""
    import faiss

    n, d, t = keys.shape[0], keys.shape[1], q.shape[0]
    flops = 2.0 * t * n * d
    x = np.ascontiguousarray(keys, dtype=np.float32)  # the baselines get fp32 keys already in RAM
    faiss.omp_set_num_threads(torch.get_num_threads())
    pairs = []  # (ours, faiss) seconds, interleaved: a busy machine slows both members of a pair alike
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        ids, dist = exact_topk(keys, q, a.k, "l2", key_chunk=a.key_chunk, query_chunk=a.query_chunk, progress=False)
        t1 = time.perf_counter()
        f_dist, f_ids = faiss.knn(q, x, a.k, faiss.METRIC_L2)
        pairs.append((t1 - t0, time.perf_counter() - t1))
    t_exact, t_faiss = (float(np.median([p[i] for p in pairs])) for i in (0, 1))
    ratio = float(np.median([f / o for o, f in pairs]))
    buf = np.empty((min(a.query_chunk, t), a.key_chunk), dtype=np.float32)
    t_mm = time_gemm(lambda qq, xs, out: torch.mm(torch.from_numpy(qq), torch.from_numpy(xs).T, out=torch.from_numpy(out)),
                     x, q, buf, a.key_chunk, a.query_chunk)
    t_np = time_gemm(lambda qq, xs, out: np.matmul(qq, xs.T, out=out), x, q, buf, a.key_chunk, a.query_chunk)
    del buf
    same_ids = float(np.mean([len(np.intersect1d(i, j)) / a.k for i, j in zip(ids, f_ids)]))
    rel = float(np.max(np.abs(dist - f_dist) / np.maximum(1.0, np.abs(f_dist))))
    # both compute |q|² + |x|² − 2 q·x in fp32, whose rounding error is ~1e-7 of |q|² + |x|² whatever the distance:
    # near-duplicate keys (real data) give distances near 0 where the two differ by more than 1e-4 relative. So the
    # error of each against float64 distances of its own neighbours, over the scale |q|² + |x|² (a sample of rows)
    rows = np.linspace(0, t - 1, min(t, 64)).astype(np.int64)
    q64 = q[rows].astype(np.float64)

    def err(i, dd):
        x64 = x[i[rows]].astype(np.float64)  # [rows, k, d]
        exact = ((x64 - q64[:, None, :]) ** 2).sum(-1)
        scale = (q64 ** 2).sum(-1)[:, None] + (x64 ** 2).sum(-1)
        return float(np.max(np.abs(dd[rows] - exact) / scale))
    e_ours, e_faiss = err(ids, dist), err(f_ids, f_dist)
    print(f"[{name}] n={n} d={d} t={t} k={a.k} threads={torch.get_num_threads()}")
    print(f"[{name}] exact search {flops / t_exact / 1e9:.1f} GFLOP/s ({t_exact:.2f} s); numpy's BLAS "
          f"{flops / t_np / 1e9:.1f} GFLOP/s, ratio {t_np / t_exact:.2f} (goal >= 0.8); torch.mm "
          f"{flops / t_mm / 1e9:.1f} GFLOP/s, ratio {t_mm / t_exact:.2f}")
    print(f"[{name}] faiss.knn (brute force) {t_faiss:.2f} s; exact search is {ratio:.2f}x faster (goal > 1; median of "
          f"{a.repeat} interleaved pairs: {', '.join(f'{o:.2f}/{f:.2f} s' for o, f in pairs)}); "
          f"same ids {100 * same_ids:.2f} %, max relative distance difference {rel:.1e}; max error against float64 "
          f"over |q|²+|x|² (64 queries): ours {e_ours:.1e}, faiss {e_faiss:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--key-chunk", type=int, default=32768)
    ap.add_argument("--query-chunk", type=int, default=1024)
    ap.add_argument("--real", help="a finished run's results dir (results/<name>): its att keys and valid queries")
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved (ours, faiss) pairs; the medians are printed")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], int(a.child[1]), int(a.child[2]))
    print(f"CPU: {platform.processor() or platform.machine()}; torch {torch.__version__}, threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        keys = make_keys(Path(tmp) / "k1.npy", a.n, a.d)
        q = np.random.default_rng(1).normal(size=(a.t, a.d)).astype(np.float32)
        compare("random", keys, q, a)
        if a.real:
            from knnlm.paths import Layout

            root = Path(a.real)
            lay = Layout(root.parent, root.name)
            real = np.load(lay.path("keys", lm="base", key="att"), mmap_mode="r")[:a.n]
            man = json.loads(lay.path("queries_manifest", lm="base", split="valid").read_text())
            rq = np.load(lay.path("queries", lm="base", split="valid", key="att"), mmap_mode="r")
            rq = np.ascontiguousarray(rq[:min(a.t, man["T"])], dtype=np.float32)
            compare("real", real, rq, a)
        if a.skip_rss:
            return
        make_keys(Path(tmp) / "k4.npy", 4 * a.n, a.d)
        rss = {}
        for name in ("k1", "k4"):
            out = subprocess.run([sys.executable, __file__, "--child", str(Path(tmp) / f"{name}.npy"), str(a.t), str(a.k)],
                                 capture_output=True, text=True, check=True).stdout
            rss[name] = json.loads(out.strip().splitlines()[-1])["max_rss_mb"]
        print(f"peak RSS: 1x {rss['k1']:.0f} MB, 4x {rss['k4']:.0f} MB; ratio {rss['k4'] / rss['k1']:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
