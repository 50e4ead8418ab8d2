"""A cost model for the other CPU kind: what each stage of a finished run would take on a CPU whose fp32 GEMM is
faster or slower, from the stage's GEMM work and the GEMM rates of the two kinds.

The GEMM-bound jobs of the main job are the exact searches (2·T·N·D flops, which each records in its meta) and the
parametric trainings (their row scores h·W_r, forward and backward, and their evaluations). The LM passes of the
dumps are left out (a few minutes of the main job), so their stage keeps its time. For a stage with
measured wall time W on this machine and F GEMM flops, the model takes F / R_here of W as GEMM time (never more
than W) and the rest as CPU-independent, so on the other kind

    W_other = W − min(W, F / R_here) + F / R_other,

with R_here the fp32 GEMM rate measured on this machine (gemm_rate: numpy's BLAS at the exact search's block shape,
as many threads as the jobs ran with) and R_other the reference rate of the other kind (REFERENCE_RATES). Stages
without GEMM flops keep their time. Names used: 'intel' and 'amd', the two CPU kinds these runs land on.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

# fp32 GEMM GFLOP/s of each CPU kind at the exact search's block shape (1,024 × 129 · 129 × 32,768), 2 threads,
# numpy's BLAS (OpenBLAS), the GEMM the exact search (on AMD) and the parametric trainings go through:
# 'amd' is the lower end of 122-137 GFLOP/s measured on a 2-core AMD EPYC (Zen 3, AVX2, 2.445 GHz);
# 'intel' is gemm_rate() on a 2-core Intel Xeon (AVX-512, AVX512-BF16), three rounds of 240.9-242.7 GFLOP/s
# (torch.mm, MKL, 270 GFLOP/s there).
REFERENCE_RATES = {
    "amd": {"gflops": 122.0, "cpu": "AMD EPYC (Zen 3, AVX2), 2 cores"},
    "intel": {"gflops": 241.0, "cpu": "Intel Xeon (AVX-512), 2 cores"},
}
SHAPE = (1024, 129, 32768)  # queries x (D + 1) x keys: one block of the main job's exact search


def cpu_kind(cpu: str) -> str | None:
    """'intel' or 'amd' from a CPU model name (/proc/cpuinfo's 'model name', knnlm.io.machine's 'cpu'); None for
    another."""
    low = cpu.lower()
    return "intel" if "intel" in low or "xeon" in low else "amd" if "amd" in low or "epyc" in low else None


def gemm_rate(threads: int = 2, repeats: int = 7, shape: tuple[int, int, int] = SHAPE) -> float:
    """This machine's fp32 GEMM rate in GFLOP/s: the best of `repeats` timed np.matmul of [m, d] · [d, n] into a
    reused output (shape (m, d, n), the exact search's block by default), numpy's BLAS held at `threads`."""
    from threadpoolctl import threadpool_limits

    m, d, n = shape
    rng = np.random.default_rng(0)
    a = rng.normal(size=(m, d)).astype(np.float32)
    b = rng.normal(size=(d, n)).astype(np.float32)
    out = np.empty((m, n), dtype=np.float32)
    best = np.inf
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, b, out=out)
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * m * d * n / best / 1e9


def exact_flops(root: Path) -> tuple[float, set[str]]:
    """(GEMM flops of the run's exact searches, the CPU models that ran them), from their metas (artifacts
    'exact_meta' and 'exact_shard_meta'; knnlm.experiments.retrieval). A nested scan writes one meta per datastore
    size with the flops of its one scan: metas of one (LM, key, metric, split) with the same flops and seconds count
    once."""
    from ..io import read_json
    from ..paths import Layout

    layout = Layout(Path(root).parent, Path(root).name)
    seen, total, cpus = set(), 0.0, set()
    for name in ("exact_meta", "exact_shard_meta"):
        for w, p in layout.find(name):
            meta = read_json(p)
            if "flop" not in meta:
                continue
            key = (w["lm"], w["key"], w["metric"], w["split"], w.get("shard"), meta["flop"], meta.get("seconds"))
            if key in seen:
                continue
            seen.add(key)
            total += float(meta["flop"])
            cpus.add((meta.get("machine") or {}).get("cpu", ""))
    return total, cpus - {""}


def parametric_flops(result: dict, dim: int, vocab: int, valid_tokens: int, scored_tokens: int) -> float:
    """GEMM flops of one parametric training (knnlm.experiments.parametric's result.json): per token, the row scores
    h·W_r cost 2·R·D forward and 2·R·D more backward (the gradient of W; h is an input), R = the variant's rows
    (info 'rows'), or for a mixture of softmaxes R·(V + D) per mixture (its projections and W_sm, W_sm's gradient
    too when it is trained); trained tokens ('history' 'train_tokens') forward and backward, `valid_tokens` at each
    evaluation ('history' 'evals'), and `scored_tokens` (valid + test) at each scored stage."""
    spec, info = result.get("spec", {}), result.get("info", {})
    if spec.get("kind") == "mos":
        r = int(info.get("mixtures", spec.get("mixtures", 1)))
        fwd = 2.0 * r * (vocab + dim) * dim
        bwd = fwd * (2.0 if spec.get("train_embed") else 1.0)
    else:
        fwd = 2.0 * int(info.get("rows", 0)) * dim
        bwd = fwd
    h = result.get("history", {})
    evals = int(h.get("evals", 0)) * valid_tokens + len(result.get("stages", {})) * scored_tokens
    return float(h.get("train_tokens", 0)) * (fwd + bwd) + evals * fwd


def run_parametric_flops(root: Path, valid_tokens: int | None = None) -> float:
    """GEMM flops of every parametric training of the run at root (artifact 'parametric_result'): D from the LM's
    datastore manifest, V from its word statistics, the scored valid and test tokens from its query manifests, the
    valid tokens of each evaluation from the result ('valid_tokens'), else `valid_tokens`, else all of valid's."""
    from ..io import read_json
    from ..paths import Layout

    layout = Layout(Path(root).parent, Path(root).name)
    total = 0.0
    for w, p in layout.find("parametric_result"):
        lm = w["lm"]
        dim = int(read_json(layout.path("datastore_manifest", lm=lm))["D"])
        stats = layout.path("word_stats", lm=lm)
        vocab = int(np.load(stats)["freq"].shape[0]) if stats.exists() else 0
        t = {v["split"]: int(read_json(q)["T"]) for v, q in layout.find("queries_manifest", lm=lm)}
        result = read_json(p)
        valid = int(result.get("valid_tokens") or valid_tokens or t.get("valid", 0))
        total += parametric_flops(result, dim, vocab, valid, sum(t.values()))
    return total


def other_kind_table(stages: pd.DataFrame, flops: dict[str, float], rate_here: float, kind_here: str,
                     rates: dict | None = None) -> pd.DataFrame:
    """Per stage of stages (knnlm.report.times.stage_shares: 'stage', 'wall (min)'), the measured minutes here,
    the stage's GEMM work (flops[stage], GFLOP; 0 where absent) and the estimate on the other CPU kind (module
    doc). rate_here: GFLOP/s here; kind_here: 'intel' | 'amd'; rates: REFERENCE_RATES by default. Raises ValueError
    for another kind or a rate ≤ 0."""
    rates = rates or REFERENCE_RATES
    if kind_here not in rates:
        raise ValueError(f"CPU kind must be one of {sorted(rates)}, found {kind_here!r}")
    other = next(k for k in rates if k != kind_here)
    r_other = float(rates[other]["gflops"])
    if not rate_here > 0 or not r_other > 0:
        raise ValueError(f"GEMM rates must be > 0, found here {rate_here}, {other} {r_other}")
    rows = []
    for _, s in stages.iterrows():
        if s["stage"] == "total":
            continue
        wall = float(s["wall (min)"]) * 60
        f = float(flops.get(s["stage"], 0.0))
        gemm_here = min(wall, f / (rate_here * 1e9))
        est = wall - gemm_here + f / (r_other * 1e9)
        rows.append({"stage": s["stage"], "measured here (min)": wall / 60, "GEMM work (GFLOP)": f / 1e9,
                     "GEMM share here": f"{100 * gemm_here / wall:.0f} %" if wall else "-",
                     f"estimate on {other} (min)": est / 60})
    df = pd.DataFrame(rows)
    total = {"stage": "total", "measured here (min)": df["measured here (min)"].sum(),
             "GEMM work (GFLOP)": df["GEMM work (GFLOP)"].sum(), "GEMM share here": "",
             f"estimate on {other} (min)": df[f"estimate on {other} (min)"].sum()}
    return pd.concat([df, pd.DataFrame([total])], ignore_index=True)


def stage_flops(root: Path, valid_tokens: int | None = None) -> tuple[dict[str, float], set[str]]:
    """{stage of knnlm.report.times.STAGES: GEMM flops} of the run at root (the exact searches' recorded flops, the
    parametric trainings' estimate; valid_tokens as run_parametric_flops), and the CPU models that ran its exact
    searches."""
    f_exact, cpus = exact_flops(root)
    return {"exact search and real score": f_exact,
            "parametric alternatives": run_parametric_flops(root, valid_tokens)}, cpus


def kind_of_this_machine() -> str | None:
    """cpu_kind of this machine's CPU model (knnlm.io.machine)."""
    from ..io import machine

    return cpu_kind(machine()["cpu"])
