"""Benchmark: exact search (the "real mask") on CUDA at the pipeline's shape, against the GPU's own GEMM and against the
brute force a GPU user would write (torch.mm of each query block with every key chunk, torch.topk of the chunk's
scores, merged with the running top-k). Prints rates, ratios and agreement.

  python benchmarks/bench_gpu.py [--n 2640000] [--d 128] [--t 32768] [--k 1024] [--cpu-check 256]
                                 [--query-block 16384 65536] [--chunks 4096x65536 ...] [--brute-force 0]

Data: random normal fp16 keys written as a .npy memmap (the datastore's layout, benchmarks/_data.py) and random
normal fp32 queries. For each metric (L2, IP):
1. exact_topk on CUDA with each --query-block (the queries searched per pass over the keys; every pass reads the
   whole key file from the host): seconds and GFLOP/s of the product 2·T·N·(D+1), over torch.mm's rate on the same
   blocks (query_chunk × key_chunk, fp32, TF32 off as exact search runs, keys already on the GPU).
   With --chunks, the same search with other query_chunk x key_chunk shapes (config retrieval.exact_query_chunk,
   exact_key_chunk), and its agreement with the first.
2. the brute force above on the same keys (already on the GPU, so it pays no host reads): seconds, and whether it
   finds the same neighbours (ids up to ties, distances to 1e-4 relative).
3. --cpu-check queries searched again by exact_topk on the CPU (the kernel the CPU jobs use): the same ids up to
   ties and distances to 1e-4 relative (the two GEMMs round their fp32 sums differently).
Needs CUDA; exits with a message where there is none.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.search.exact import exact_topk  # noqa: E402

from _data import make_keys  # noqa: E402  (benchmarks/_data.py, beside this script)


def sync_time(fn):
    """(result, seconds) of fn() with the GPU's queue drained before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def brute_force(xg: torch.Tensor, q: np.ndarray, k: int, metric: str, key_chunk: int, query_chunk: int):
    """Exact top-k by plain torch on the GPU: per query chunk, torch.mm with each key chunk (fp32), torch.topk of the
    chunk's scores merged with the running top-k. xg: [N, D] fp32 keys on the GPU. Returns (ids, dists) as numpy,
    closest first, faiss conventions."""
    t = q.shape[0]
    ids, dists = np.empty((t, k), np.int64), np.empty((t, k), np.float32)
    sq = (xg * xg).sum(1) if metric == "l2" else None
    for qs in range(0, t, query_chunk):
        qg = torch.as_tensor(q[qs:qs + query_chunk], device=xg.device)
        best_s = torch.full((qg.shape[0], k), -torch.inf, device=xg.device)
        best_i = torch.full((qg.shape[0], k), -1, dtype=torch.int64, device=xg.device)
        for ks in range(0, xg.shape[0], key_chunk):
            sc = qg @ xg[ks:ks + key_chunk].T
            if sq is not None:
                sc = sc - 0.5 * sq[ks:ks + key_chunk]
            s, i = sc.topk(min(k, sc.shape[1]), dim=1)
            best_s, p = torch.cat([best_s, s], 1).topk(k, dim=1)
            best_i = torch.cat([best_i, i + ks], 1).gather(1, p)
        if sq is not None:
            best_s = (qg * qg).sum(1, keepdim=True) - 2.0 * best_s
        ids[qs:qs + len(qg)], dists[qs:qs + len(qg)] = best_i.cpu().numpy(), best_s.cpu().numpy()
    return ids, dists


def agreement(ids, dists, ref_ids, ref_dists, k: int) -> str:
    same = float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ids, ref_ids)]))
    rel = float(np.max(np.abs(dists - ref_dists) / np.maximum(1.0, np.abs(ref_dists))))
    return f"same ids {100 * same:.3f} %, max relative distance difference {rel:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_640_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--t", type=int, default=32768)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--key-chunk", type=int, default=32768)
    ap.add_argument("--query-chunk", type=int, default=1024)
    ap.add_argument("--query-block", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--chunks", nargs="*", default=[],
                    help="further query_chunk x key_chunk shapes of exact search on CUDA to time, e.g. 4096x65536")
    ap.add_argument("--brute-force", type=int, default=1, help="0: skip the brute-force comparison")
    ap.add_argument("--cpu-check", type=int, default=256)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # as exact search runs (fp32 sums)
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; host {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        keys = make_keys(Path(tmp) / "keys.npy", a.n, a.d)
        q = np.random.default_rng(1).normal(size=(a.t, a.d)).astype(np.float32)
        print(f"keys [{a.n}, {a.d}] fp16 written in {time.perf_counter() - t0:.1f} s; {a.t} queries, k = {a.k}")
        flops = 2.0 * a.t * a.n * (a.d + 1)
        xg = torch.as_tensor(np.asarray(keys), device="cuda").float()
        qg = torch.as_tensor(q[:a.query_chunk], device="cuda")
        qg = torch.cat([qg, torch.ones((len(qg), 1), device="cuda")], 1)
        xa = torch.cat([xg[:a.key_chunk], torch.ones((a.key_chunk, 1), device="cuda")], 1)
        buf = torch.empty((len(qg), a.key_chunk), device="cuda")
        torch.mm(qg, xa.T, out=buf)
        reps = 50
        _, t_mm = sync_time(lambda: [torch.mm(qg, xa.T, out=buf) for _ in range(reps)])
        mm_rate = reps * 2.0 * len(qg) * a.key_chunk * (a.d + 1) / t_mm
        print(f"torch.mm fp32 [{len(qg)} x {a.d + 1}] · [{a.d + 1} x {a.key_chunk}]: {mm_rate / 1e9:.0f} GFLOP/s")
        del buf, xa
        for metric in ("l2", "ip"):
            exact_topk(keys[:200_000], q[:2048], a.k, metric, device="cuda", progress=False)  # warm-up
            results = {}
            for qb in a.query_block:
                (ids, dists), sec = sync_time(lambda: exact_topk(keys, q, a.k, metric, key_chunk=a.key_chunk,
                                                                 query_chunk=a.query_chunk, query_block=qb,
                                                                 device="cuda", progress=False))
                results[qb] = (ids, dists)
                print(f"[{metric}] exact search on CUDA, query_block {qb}: {sec:.2f} s, {flops / sec / 1e9:.0f} GFLOP/s, "
                      f"{flops / sec / mm_rate:.2f} of torch.mm's rate; {a.t / sec:.0f} queries/s")
            ids, dists = results[a.query_block[0]]
            for qb in a.query_block[1:]:
                assert np.array_equal(results[qb][1], dists), f"query_block {qb} changed the distances"
            for shape in a.chunks:
                qc, kc = (int(x) for x in shape.split("x"))
                (c_ids, c_d), sec = sync_time(lambda: exact_topk(keys, q, a.k, metric, key_chunk=kc, query_chunk=qc,
                                                                 query_block=max(a.query_block), device="cuda",
                                                                 progress=False))
                print(f"[{metric}] exact search on CUDA, query_chunk {qc} x key_chunk {kc}, query_block "
                      f"{max(a.query_block)}: {sec:.2f} s, {flops / sec / 1e9:.0f} GFLOP/s; "
                      f"{agreement(c_ids, c_d, ids, dists, a.k)}")
            if a.brute_force:
                (b_ids, b_d), sec = sync_time(lambda: brute_force(xg, q, a.k, metric, a.key_chunk, a.query_chunk))
                print(f"[{metric}] brute force (torch.mm + torch.topk, keys on the GPU): {sec:.2f} s, "
                      f"{flops / sec / 1e9:.0f} GFLOP/s; against exact search: {agreement(ids, dists, b_ids, b_d, a.k)}")
            if a.cpu_check:
                c = a.cpu_check
                t0 = time.perf_counter()
                c_ids, c_d = exact_topk(keys, q[:c], a.k, metric, key_chunk=a.key_chunk, device="cpu", progress=False)
                print(f"[{metric}] CPU exact search of {c} queries ({time.perf_counter() - t0:.1f} s) against CUDA: "
                      f"{agreement(ids[:c], dists[:c], c_ids, c_d, a.k)}")
                print(f"[{metric}] ids in the same position as the CPU's: {100 * np.mean(ids[:c] == c_ids):.3f} %")
        del xg


if __name__ == "__main__":
    main()
