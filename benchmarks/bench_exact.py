"""Benchmark: exact search throughput vs plain torch.mm, and its memory scaling. Prints ratios.

  python benchmarks/bench_exact.py [--n 1000000] [--d 256] [--t 4096] [--k 1024] [--key-chunk 32768] [--query-chunk 1024]

1. exact_topk GFLOP/s over torch.mm GFLOP/s on the same shapes (goal >= 0.8): the streaming, fp16->fp32
   conversion and top-k merge should cost little next to the matmul itself.
2. peak RSS of exact search at 4x the datastore size over 1x (goal <= 1.2): memory is bounded by chunks.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.exact import exact_topk  # noqa: E402


def make_keys(path: Path, n: int, d: int) -> np.ndarray:
    keys = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, d))
    rng = np.random.default_rng(0)
    for s in range(0, n, 65536):
        keys[s:s + 65536] = rng.normal(size=(min(65536, n - s), d)).astype(np.float16)
    keys.flush()
    return np.load(path, mmap_mode="r")


def child(path: str, t: int, k: int) -> None:
    keys = np.load(path, mmap_mode="r")
    q = np.random.default_rng(1).normal(size=(t, keys.shape[1])).astype(np.float32)
    exact_topk(keys, q, k, "l2", progress=False)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec
    hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"max_rss_mb": hwm_kb / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--key-chunk", type=int, default=32768)
    ap.add_argument("--query-chunk", type=int, default=1024)
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], int(a.child[1]), int(a.child[2]))
    with tempfile.TemporaryDirectory() as tmp:
        keys = make_keys(Path(tmp) / "k1.npy", a.n, a.d)
        q = np.random.default_rng(1).normal(size=(a.t, a.d)).astype(np.float32)
        flops = 2.0 * a.t * a.n * a.d
        t0 = time.perf_counter()
        exact_topk(keys, q, a.k, "l2", key_chunk=a.key_chunk, query_chunk=a.query_chunk, progress=False)
        t_exact = time.perf_counter() - t0
        # the baseline: torch.mm alone on fp32 keys already in RAM, same blocks, output buffer reused
        x = torch.from_numpy(np.asarray(keys, dtype=np.float32))
        qt = torch.from_numpy(q)
        buf = torch.empty(min(a.query_chunk, a.t), a.key_chunk)
        t0 = time.perf_counter()
        for s in range(0, a.n, a.key_chunk):
            xs = x[s:s + a.key_chunk]
            for qs in range(0, a.t, a.query_chunk):
                qq = qt[qs:qs + a.query_chunk]
                torch.mm(qq, xs.T, out=buf[:len(qq), :len(xs)])
        t_mm = time.perf_counter() - t0
        del x, buf
        print(f"exact search: {flops / t_exact / 1e9:.1f} GFLOP/s; torch.mm: {flops / t_mm / 1e9:.1f} GFLOP/s; "
              f"ratio {t_mm / t_exact:.2f} (goal >= 0.8)")
        make_keys(Path(tmp) / "k4.npy", 4 * a.n, a.d)
        rss = {}
        for name in ("k1", "k4"):
            out = subprocess.run([sys.executable, __file__, "--child", str(Path(tmp) / f"{name}.npy"), str(a.t), str(a.k)],
                                 capture_output=True, text=True, check=True).stdout
            rss[name] = json.loads(out.strip().splitlines()[-1])["max_rss_mb"]
        print(f"peak RSS: 1x {rss['k1']:.0f} MB, 4x {rss['k4']:.0f} MB; ratio {rss['k4'] / rss['k1']:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
