"""Benchmark: one learned-W_ds training step (Xu et al. 2023, Sec. 4: V x D rows, Adam, batch of keys) against the
GEMMs it cannot avoid, timed side by side in one run. Prints the ratios.

  python benchmarks/bench_wds.py [--batch 4096] [--d 128] [--v 8000] [--threads 2] [--repeat 5]

A step's unavoidable work is two GEMMs, the scores h · W_dsᵀ (2·B·D·V flops) and the gradient of W_ds (2·B·D·V; the
keys need none): 'step GEMM share' = (numpy's time for those two GEMMs) / (the step's time), the fraction of the
step the GEMMs take (goal: most of it; the rest is the softmax over V and Adam). Also the step with a fresh scores
array each step instead of the model's reused one (knnlm.parametric.ScoresBuffer), and the step with torch's own
matmul (the autograd path knnlm.parametric.row_scores replaces on the CPU), so the ratio of the two shows what the
BLAS path buys on this machine.
"""
from __future__ import annotations

import os

# as knnlm/__init__.py: OpenBLAS threads stop spinning soon after each GEMM (before numpy loads OpenBLAS), and torch's
# OpenMP threads sleep when idle, so the two pools do not take turns spinning on the same cores
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm import parametric  # noqa: E402
from knnlm.parametric import Aggregation, AggregatedSoftmax  # noqa: E402


def timed(fn, repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--v", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    h, y = torch.randn(a.batch, a.d, generator=g), torch.randint(0, a.v, (a.batch,), generator=g)

    def step_fn(reuse: bool = True):
        model = AggregatedSoftmax(Aggregation.from_counts(np.ones(a.v, dtype=np.int64)), a.d)
        if not reuse:
            model._scores_buffer = None  # a fresh [B, V] scores array every step
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            loss = -model.log_prob(h, y).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    w = np.random.default_rng(0).standard_normal((a.v, a.d)).astype(np.float32)
    gr = np.random.default_rng(1).standard_normal((a.batch, a.v)).astype(np.float32)
    hn = h.numpy()
    gemms = timed(lambda: (np.matmul(hn, w.T), np.matmul(gr.T, hn)), a.repeat)
    blas = timed(step_fn(), a.repeat)
    fresh = timed(step_fn(reuse=False), a.repeat)
    original = parametric.row_scores
    parametric.row_scores = lambda x, m, buffer=None: x @ m.to(x.dtype).T  # torch's own matmul
    try:
        torch_mm = timed(step_fn(), a.repeat)
    finally:
        parametric.row_scores = original
    flop = 4.0 * a.batch * a.d * a.v
    print(f"W_ds step, B = {a.batch}, D = {a.d}, V = {a.v}, {a.threads} threads ({torch.get_num_threads()} torch)")
    print(f"  numpy GEMMs of a step : {gemms * 1e3:8.1f} ms  ({flop / gemms / 1e9:6.1f} GFLOP/s)")
    print(f"  step, BLAS scores     : {blas * 1e3:8.1f} ms  step GEMM share {gemms / blas:.2f}")
    print(f"  step, fresh scores    : {fresh * 1e3:8.1f} ms  step GEMM share {gemms / fresh:.2f}  "
          f"(a new [B, V] array each step: {fresh / blas:.2f}x the step)")
    print(f"  step, torch matmul    : {torch_mm * 1e3:8.1f} ms  step GEMM share {gemms / torch_mm:.2f}")
    print(f"  speed-up of the BLAS path: {torch_mm / blas:.2f}x")


if __name__ == "__main__":
    main()
