"""Benchmark: a full τ × λ sweep over the neighbour cache vs one retrieval pass over the same queries. Prints ratios.

  python benchmarks/bench_sweep.py --results results --name wikitext2 [--lm base] [--key att] [--metric l2] [--split valid]
                                   [--t 8192] [--repeat 3] [--exact]

The sweep (31 temperatures 0..3 × 200 λ values, on valid, from cached ids and distances, no search) is what
replaces the paper's one evaluation run per τ. The retrieval pass is the IVFPQ search (k = 1024, the
config's nprobe) of the same queries; with --exact also the exact search ("real mask"). Each side is timed
--repeat times (the sweep after one cold run that compiles/loads the numba kernel) and the fastest of each is
compared, as timeit does; every time is printed. Goal: sweep / retrieval ≤ 0.05.
"""
from __future__ import annotations

# No OMP_WAIT_POLICY=PASSIVE here (bench_exact sets it). The sweep (numba threads) is timed before the faiss
# searches, so faiss's OpenMP pool is not spinning beside it.

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.datastore.dump import open_datastore, open_queries  # noqa: E402
from knnlm.io import read_json  # noqa: E402
from knnlm.paths import Layout  # noqa: E402
from knnlm.scoring.interpolation import (best_lambda_per_tau, lambda_grid, neighbour_hits, scores_from_distances,
                                         sweep_temperature)  # noqa: E402,E501


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="results", help="results_dir of the finished run")
    ap.add_argument("--name", default="wikitext2", help="config name of the finished run")
    ap.add_argument("--lm", default="base")
    ap.add_argument("--key", default="att")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--split", default="valid", help="the split whose neighbour cache is swept (the run's valid by default)")
    ap.add_argument("--t", type=int, default=8192)
    ap.add_argument("--nprobe", type=int, default=None, help="default: the run's (from the index's .json)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed runs of each side after the cold one; the fastest of each is compared (both sides alike)")
    ap.add_argument("--exact", action="store_true")
    a = ap.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    L = Layout(a.results, a.name)
    at = {"lm": a.lm, "store": "full", "key": a.key, "metric": a.metric, "split": a.split}
    keys, vals, man = open_datastore(L.path("datastore_manifest", **at), L.path("vals", **at), L.path("keys", **at), a.key)
    q = open_queries(L.path("queries_manifest", **at), L.path("targets", **at), L.path("lm_logprobs", **at),
                     L.path("queries", **at), man["checkpoint_sha256"])
    t = min(a.t, q["manifest"]["T"])
    queries = np.ascontiguousarray(q["queries"][:t], dtype=np.float32)
    meta = read_json(L.path("nb_meta", **at))
    ids = np.load(L.path("nb_ids", **at), mmap_mode="r")[:t]
    dists = np.load(L.path("nb_dists", **at), mmap_mode="r")[:t]
    k = meta["k"]

    taus, lams = [round(0.1 * i, 1) for i in range(31)], lambda_grid(200)
    lp_lm = np.asarray(q["lm_logprobs"][:t], dtype=np.float64)
    ids, dists, targets = np.asarray(ids), np.asarray(dists), np.asarray(q["targets"][:t])
    t_sweeps = []
    for _ in range(1 + a.repeat):  # cold (the numba kernel's first call in a process, ~0.5 s), then warm
        t0 = time.perf_counter()
        hit, valid = neighbour_hits(ids, vals, targets)
        sweep = sweep_temperature(scores_from_distances(dists, a.metric), hit, valid, taus)
        idx, nll = best_lambda_per_tau(lp_lm, sweep, lams)  # the argmin of the full 31 × 200 grid (convex in λ)
        t_sweeps.append(time.perf_counter() - t0)
    t_sweep = min(t_sweeps[1:])

    index = faiss.read_index(str(L.path("index", **at)))
    a.nprobe = a.nprobe or read_json(L.path("index_meta", **at))["nprobe"]
    faiss.extract_index_ivf(index).nprobe = a.nprobe
    t_searches = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        for s in range(0, t, 8192):
            index.search(queries[s:s + 8192], k)
        t_searches.append(time.perf_counter() - t0)
    t_search = min(t_searches)

    best = (int(np.argmin(nll)), int(idx[np.argmin(nll)]))
    print(f"{t} {a.split} queries ({a.key}/{a.metric}), k = {k}: τ × λ sweep ({len(taus)} × {len(lams)}) {t_sweep:.2f} s "
          f"(fastest of {a.repeat}, all {', '.join(f'{x:.2f}' for x in t_sweeps[1:])}; cold {t_sweeps[0]:.2f} s; best τ {taus[best[0]]}, λ {lams[best[1]]:.3f}); IVFPQ search (nprobe {a.nprobe}) {t_search:.2f} s "
          f"(fastest of {a.repeat}, all {', '.join(f'{x:.2f}' for x in t_searches)}); "
          f"ratio {t_sweep / t_search:.3f} (goal <= 0.05)")
    if a.exact:
        from knnlm.search.exact import exact_topk

        t0 = time.perf_counter()
        exact_topk(keys, queries, k, a.metric, progress=False)
        t_exact = time.perf_counter() - t0
        print(f"exact search {t_exact:.1f} s; sweep / exact search ratio {t_sweep / t_exact:.4f}")


if __name__ == "__main__":
    main()
