"""Rehearsal of the paper's scale: the real mask of a synthetic datastore of 20M keys through the pipeline's own rules.

  python benchmarks/rehearsal.py [--keys 20000000] [--dim 256] [--queries 2048] [--k 1024] [--shards 1 4 8]
                                 [--index-shards 4] [--executor slurm|local] [--results-dir results/rehearsal]

1. Writes a synthetic datastore (fp16 keys from a mixture of Gaussians, D = --dim, ~N·D·2 bytes on disk) and the
   queries of a test split into one run layout (knnlm.paths), once; each run below links to it.
2. For each shard count S: `snakemake` with configs derived from configs/tiny.yaml (name rehearsal-s<S>, key type
   att, L2, k = --k, retrieval.exact_shards = S) on the target of the full store's exact search of the test split,
   with --allowed-rules prepare_store exact_search exact_merge build_index: the DAG's real jobs, nothing upstream.
   --executor slurm submits them through profiles/slurm to a SLURM cluster (scripts/local_slurm.sh start gives one
   on this machine), one job at a time so that each job's time is its own. The run with S = --index-shards also
   builds the store's IVFPQ index (train on a sample, add in chunks: rule build_index).
3. Prints, from each job's Snakemake benchmark: per-shard seconds (the job's, and the scan's own from its meta) and
   peak RSS, the merge's seconds and RSS, the index build's; the GFLOP/s of each shard; and checks that every S gives
   the same merged ids and distances bit for bit (S = 1 is one unsharded scan through the same rule), and how one
   in-process scan (knnlm.search.exact.exact_topk) of the first --check queries agrees with them. Writes <results-dir>/rehearsal.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from knnlm.io import create_npy, write_json  # noqa: E402
from knnlm.paths import Layout  # noqa: E402

SHA = "synthetic-rehearsal"


# the files of the synthetic base LM's run that the allowed rules read (knnlm.paths names)
READ = ("datastore_manifest", "vals", "keys", "queries_manifest", "targets", "lm_logprobs", "queries", "scope")


def write_store(data: Layout, n: int, d: int, t: int, seed: int = 0, chunk: int = 1_000_000) -> None:
    """Synthetic keys [n, d] fp16 (256 Gaussian clusters, unit spread), vals, manifests, and t test queries near the
    keys, as the datastore and test queries of LM 'base' in layout `data` (skipped when its manifest exists)."""
    path = lambda name: data.path(name, lm="base", key="att", split="test")  # noqa: E731
    if path("datastore_manifest").exists():
        return
    for name in READ:
        path(name).parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(256, d)).astype(np.float32)
    with create_npy(path("keys"), (n, d), np.float16) as keys:
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            keys[s:e] = centres[rng.integers(0, 256, e - s)] + rng.standard_normal((e - s, d), dtype=np.float32)
            print(f"keys {e:,}/{n:,}", end="\r", flush=True)
    with create_npy(path("vals"), (n,), np.int32) as vals:
        vals[:] = rng.integers(0, 32000, n)
    with create_npy(path("queries"), (t, d), np.float32) as qa:
        qa[:] = centres[rng.integers(0, 256, t)] + rng.standard_normal((t, d), dtype=np.float32)
    np.save(path("targets"), rng.integers(0, 32000, t).astype(np.int32))
    np.save(path("lm_logprobs"), np.full(t, -3.0, np.float32))
    np.save(path("scope"), np.arange(t))
    write_json(path("queries_manifest"), {"T": t, "D": d, "key_types": ["att"], "checkpoint_sha256": SHA,
                                          "split": "test"})
    write_json(path("datastore_manifest"), {"N": n, "D": d, "key_types": ["att"], "keys_dtype": "float16",
                                            "vals_dtype": "int32", "checkpoint_sha256": SHA, "source": "synthetic",
                                            "split": "train"})
    print()


def link_run(layout: Layout, data: Layout) -> None:
    """Symlink the synthetic datastore and queries of layout `data` into the run's layout (the files the allowed
    rules read)."""
    for name in READ:
        src, dst = (lay.path(name, lm="base", key="att", split="test") for lay in (data, layout))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.is_symlink():
            dst.symlink_to(src.resolve())


def config(results_dir: Path, shards: int, k: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg.update(name=f"rehearsal-s{shards}", results_dir=str(results_dir))
    cfg["data"]["archive"] = str(ROOT / "corpora" / "wikitext-2-v1.tar.xz")  # validated, never read here
    cfg["index"] = {"metrics": ["l2"]}
    cfg["knn"]["k"] = k
    cfg["retrieval"] = {"key_types": ["att"], "metrics": ["l2"], "max_queries": None, "exact_shards": shards}
    cfg["datastore_size"] = {"ratios": [1.0], "key_types": ["att"], "metrics": ["l2"]}
    cfg["temperature"] = {"ratios": [1.0]}
    for section in ("stores", "variance", "parametric", "hypotheses"):
        cfg.pop(section, None)
    path = results_dir / f"rehearsal-s{shards}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cfg: Path, targets: list[str], executor: str) -> float:
    cmd = [sys.executable, "-m", "snakemake", "--configfile", str(cfg), "--jobs", "1",
           "--allowed-rules", "prepare_store", "exact_search", "exact_merge", "build_index",
           "--set-threads", "exact_search=2", "exact_merge=2", "build_index=2", "prepare_store=2"]
    if executor == "slurm":
        cmd += ["--profile", "profiles/slurm", "--slurm-no-account", "--slurm-status-command", "squeue",
                "--slurm-init-seconds-before-status-checks", "5", "--latency-wait", "10"]
    else:
        cmd += ["--profile", "profiles/local", "--cores", "2"]
    t0 = time.time()
    r = subprocess.run(cmd + targets, cwd=ROOT, text=True, capture_output=True)
    if r.returncode:
        sys.exit(f"snakemake failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return time.time() - t0


def bench(layout: Layout, job: str) -> dict:
    df = pd.read_csv(layout.path("benchmark", job=job), sep="\t")
    return {"seconds": float(df["s"].iloc[-1]), "max_rss_mb": float(df["max_rss"].iloc[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--queries", type=int, default=2048)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--index-shards", type=int, default=4, help="the run that also builds the IVFPQ index (0: none)")
    p.add_argument("--check", type=int, default=128, help="queries of the in-process unsharded scan")
    p.add_argument("--executor", choices=["slurm", "local"], default="slurm")
    p.add_argument("--results-dir", type=Path, default=ROOT / "results" / "rehearsal")
    a = p.parse_args()
    a.results_dir = a.results_dir.resolve()
    data = Layout(a.results_dir, "synthetic")
    t0 = time.time()
    write_store(data, a.keys, a.dim, a.queries)
    report = {"keys": a.keys, "dim": a.dim, "queries": a.queries, "k": a.k, "executor": a.executor,
              "keys_gb": a.keys * a.dim * 2 / 1e9, "write_seconds": time.time() - t0, "runs": {}}
    wc = dict(lm="base", store="full", key="att", metric="l2", split="test")
    merged = {}
    for s in a.shards:
        cfg = config(a.results_dir, s, a.k)
        layout = Layout(a.results_dir, f"rehearsal-s{s}")
        link_run(layout, data)
        targets = [str(layout.path("exact_ids", **wc))]
        if s == a.index_shards:
            targets.append(str(layout.path("index", **wc)))
        wall = run(cfg, targets, a.executor)
        tag = "base_full_att_l2_test"
        out = {"snakemake_wall_seconds": wall, "prepare_store": bench(layout, "prepare_store_base_full_att")}
        if s == 1:
            out["exact_search"] = [bench(layout, f"exact_search_{tag}")]
        else:
            out["exact_search"] = [bench(layout, f"exact_search_{tag}_{i}") for i in range(s)]
            out["exact_merge"] = bench(layout, f"exact_merge_{tag}")
        meta = json.loads(layout.path("exact_meta", **wc).read_text())
        shards = meta.get("shards", [{"span": [0, a.keys], "seconds": meta["seconds"]}])
        for job, sh in zip(out["exact_search"], shards):  # wall time of the job vs time in the scan itself
            job["keys"], job["scan_seconds"] = sh["span"][1] - sh["span"][0], sh["seconds"]
            job["gflops"] = 2.0 * a.queries * job["keys"] * a.dim / job["scan_seconds"] / 1e9
        if "exact_merge" in out:
            out["exact_merge"]["merge_seconds"] = meta["merge_seconds"]
        if s == a.index_shards:
            out["build_index"] = bench(layout, "build_index_base_full_att_l2")
            out["index_meta"] = json.loads(layout.path("index_meta", **wc).read_text())
        report["runs"][s] = out
        merged[s] = (np.load(layout.path("exact_ids", **wc)), np.load(layout.path("exact_dists", **wc)))
        print(json.dumps({s: out}, indent=1, default=str)[:3000], flush=True)
    # every shard count gives the same real mask, and it equals one in-process scan of the first queries
    from knnlm.search.exact import exact_topk

    base = merged[a.shards[0]]
    report["shard_counts_agree"] = {s: bool(np.array_equal(m[0], base[0]) and np.array_equal(m[1], base[1]))
                                    for s, m in merged.items()}
    keys = np.load(data.path("keys", lm="base", key="att"), mmap_mode="r")
    q = np.load(data.path("queries", lm="base", key="att", split="test"))[:a.check]
    t1 = time.time()
    ids, d = exact_topk(keys, q, a.k, "l2", progress=False)
    # a scan of fewer queries multiplies other matrix shapes, so float32 sums may differ in the last bit: ids agree up
    # to the order of near ties, distances to float32 rounding
    report["check"] = {"queries": a.check, "seconds": time.time() - t1,
                       **{f"s{s}": {"ids_agree": float((m[0][:a.check] == ids).mean()),
                                    "max_abs_dist_diff": float(np.abs(m[1][:a.check] - d).max()),
                                    "max_rel_dist_diff": float((np.abs(m[1][:a.check] - d) / np.abs(d).clip(1e-6)).max())}
                          for s, m in merged.items()}}
    write_json(a.results_dir / "rehearsal.json", report)
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    rows = []
    for s, out in report["runs"].items():
        for i, j in enumerate(out["exact_search"]):
            rows.append({"shards": s, "job": f"exact_search {i}", "keys": j["keys"], "job s": round(j["seconds"], 1),
                         "scan / merge s": round(j["scan_seconds"], 1), "GFLOP/s": round(j["gflops"], 1),
                         "peak RSS MB": round(j["max_rss_mb"])})
        for name in ("exact_merge", "build_index"):
            if name in out:
                rows.append({"shards": s, "job": name, "keys": a.keys if name == "build_index" else None,
                             "job s": round(out[name]["seconds"], 1),
                             "scan / merge s": round(out[name].get("merge_seconds", float("nan")), 1), "GFLOP/s": None,
                             "peak RSS MB": round(out[name]["max_rss_mb"])})
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
