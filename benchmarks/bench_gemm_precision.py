"""Benchmark: the GEMM libraries a low-precision first pass of exact search could use, against numpy's fp32 GEMM.
Prints each one's rate and its ratio to numpy's fp32 on this CPU.

  python benchmarks/bench_gemm_precision.py [--m 1024] [--d 128] [--n 32768] [--threads 2] [--repeat 5]

The shape is one block of the exact search (knnlm.search.exact.exact_topk: a query chunk × a key chunk, D the
keys' width). A first pass in lower precision pays only if its GEMM is well ahead of fp32's: its candidates must
then be re-scored in fp32, and every candidate whose approximate score is within the quantisation's error bound of
the threshold passes, so a pass ~1.5x faster than the fp32 search needs a GEMM clearly more than 1.5x faster than
fp32's. Measured here, each over the same product (2·m·n·d flops):
  numpy fp32           numpy's BLAS (OpenBLAS in this wheel), into a reused array (the exact search's path on AMD)
  torch fp32           torch.mm (MKL on x86), into a reused array
  torch fp16 / bf16    torch.mm in half precision (fast only where the CPU has fp16 / bf16 instructions: AVX-512
                       FP16, AVX512_BF16 or AMX)
  torch int8→int32     torch._int_mm (int8 × int8 → int32)
  fbgemm int8 → fp32   torch.ops.quantized.linear_dynamic (queries quantised per call, int8 keys, fp32 scores)
  fbgemm int8 → uint8  torch.ops.quantized.linear (uint8 queries, int8 keys, scores requantised to 8 bits: too coarse
                       to rank by, the library's fastest int8 path, an upper bound for fbgemm)
  faiss SQ8 top-k      faiss.IndexScalarQuantizer (8-bit keys) searched for the top-k of the same product: the scan a
                       library offers for quantised keys, k = 1,024 as the pipeline's
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import platform
import time

import numpy as np
import torch


def rate(fn, flops: float, repeat: int) -> float:
    """Best-of-`repeat` GFLOP/s of fn() after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=1024, help="queries per block (exact search's query chunk)")
    ap.add_argument("--d", type=int, default=128, help="key width (the wikitext2 LM's 128)")
    ap.add_argument("--n", type=int, default=32768, help="keys per block (exact search's key chunk)")
    ap.add_argument("--k", type=int, default=1024, help="top-k of the faiss scan")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(a.threads)
    m, d, n = a.m, a.d, a.n
    flops = 2.0 * m * n * d
    g = torch.Generator().manual_seed(0)
    q, x = torch.randn(m, d, generator=g), torch.randn(n, d, generator=g)
    out = torch.empty(m, n)
    qn, xt, on = q.numpy(), np.ascontiguousarray(x.numpy().T), out.numpy()
    rows = [("numpy fp32", rate(lambda: np.matmul(qn, xt, out=on), flops, a.repeat))]
    rows.append(("torch fp32", rate(lambda: torch.mm(q, x.T, out=out), flops, a.repeat)))
    for name, dt in (("torch fp16", torch.float16), ("torch bf16", torch.bfloat16)):
        qh, xh = q.to(dt), x.to(dt)
        rows.append((name, rate(lambda: torch.mm(qh, xh.T), flops, max(1, a.repeat // 2))))
    qi = torch.randint(-127, 128, (m, d), dtype=torch.int8, generator=g)
    xi = torch.randint(-127, 128, (n, d), dtype=torch.int8, generator=g)
    try:
        rows.append(("torch int8→int32", rate(lambda: torch._int_mm(qi, xi.T), flops, max(1, a.repeat // 2))))
    except RuntimeError as e:
        print(f"torch._int_mm: not available here ({str(e).splitlines()[0]})")
    try:
        packed = torch.ops.quantized.linear_prepack(torch.quantize_per_tensor(x, 0.05, 0, torch.qint8), None)
        rows.append(("fbgemm int8 → fp32", rate(lambda: torch.ops.quantized.linear_dynamic(q, packed), flops,
                                                 a.repeat)))
        qq = torch.quantize_per_tensor(q, 0.05, 128, torch.quint8)
        rows.append(("fbgemm int8 → uint8", rate(lambda: torch.ops.quantized.linear(qq, packed, 1.0, 0), flops,
                                                  a.repeat)))
    except RuntimeError as e:
        print(f"fbgemm: not available here ({str(e).splitlines()[0]})")
    import faiss

    faiss.omp_set_num_threads(a.threads)
    sq = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq.train(x.numpy())
    sq.add(x.numpy())
    rows.append((f"faiss SQ8 top-{a.k}", rate(lambda: sq.search(qn, a.k), flops, max(1, a.repeat // 2))))

    ref = rows[0][1]
    from threadpoolctl import threadpool_info

    blas = sorted({i["internal_api"] for i in threadpool_info() if i["user_api"] == "blas"})
    print(f"{cpu_name()}, {a.threads} threads; block {m} × {d} × {n} (queries × D × keys); BLAS loaded: "
          f"{', '.join(blas)}")
    print(f"{'GEMM':22s} {'GFLOP/s':>9s} {'× numpy fp32':>13s}")
    for name, r in rows:
        print(f"{name:22s} {r:9.1f} {r / ref:13.2f}")
    best = max(rows[1:], key=lambda row: row[1])
    print(f"fastest alternative: {best[0]}, {best[1] / ref:.2f}× numpy's fp32 "
          f"({'ahead' if best[1] > 1.5 * ref else 'not 1.5× ahead'} of the fp32 GEMM before any re-scoring)")


if __name__ == "__main__":
    main()
