"""A cost model for the other CPU kind: what each stage of a finished run would take on a CPU whose fp32 GEMM is
faster or slower, from the stage's GEMM work and the rates of the two kinds.

The GEMM-bound jobs of the main job are the exact searches (2·T·N·D flops, which each records in its meta with its
seconds) and the parametric trainings (their row scores h·W_r, forward and backward, and their evaluations). The
LM passes of the dumps are left out (a few minutes of the main job), so their stage keeps its time. For a stage
with measured wall time W on this machine, F GEMM flops that took S seconds of it here, and R_other the other
kind's rate for that work,

    W_other = W − min(W, S) + F / R_other.

The exact searches: S = their recorded seconds (the whole search: GEMM, selection and I/O), R_other = the other
kind's measured rate of the same search (EXACT_RATES: its flops over its seconds). The parametric trainings: S =
F / R_here, R_here the fp32 GEMM rate measured on this machine through the BLAS the jobs use (gemm_rate:
knnlm.search.exact.cpu_matmul at the exact search's block shape), R_other the other kind's (REFERENCE_RATES); the
rest of their time (softmax, optimizer) is taken as CPU-independent, so on a slower CPU this part is an
underestimate. Stages without GEMM work keep their time. Names used: 'intel' and 'amd', the two CPU kinds these
runs land on.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

# fp32 GEMM GFLOP/s of each CPU kind at the exact search's block shape (1,024 × 129 · 129 × 32,768), 2 threads,
# through knnlm.search.exact.cpu_matmul (the BLAS the parametric trainings use): 'amd' numpy's OpenBLAS, the lower end
# of 122-137 GFLOP/s measured on a 2-core AMD EPYC (Zen 3, AVX2, 2.445 GHz); 'intel' torch.mm (MKL) on a 2-core Intel
# Xeon (AVX-512), gemm_rate() 285 GFLOP/s (numpy's OpenBLAS there: 248).
REFERENCE_RATES = {
    "amd": {"gflops": 122.0, "cpu": "AMD EPYC (Zen 3, AVX2), 2 cores"},
    "intel": {"gflops": 285.0, "cpu": "Intel Xeon (AVX-512), 2 cores"},
}
# The exact search's own rate (flops over seconds) at the main job's shape (the full store's 2.64M att keys of D = 128,
# k = 1,024, 2 cores): 117 GFLOP/s on a 2-core AMD EPYC (Zen 3; the job over every test token), 213 on a 2-core Intel
# Xeon (AVX-512; exact_topk over 16,384 real test queries on an otherwise idle machine).
EXACT_RATES = {"amd": 117.0, "intel": 213.0}
SHAPE = (1024, 129, 32768)  # queries x (D + 1) x keys: one block of the main job's exact search


def cpu_kind(cpu: str) -> str | None:
    """'intel' or 'amd' from a CPU model name (/proc/cpuinfo's 'model name', knnlm.io.machine's 'cpu'); None for
    another."""
    low = cpu.lower()
    return "intel" if "intel" in low or "xeon" in low else "amd" if "amd" in low or "epyc" in low else None


def gemm_rate(threads: int = 2, repeats: int = 7, shape: tuple[int, int, int] = SHAPE) -> float:
    """This machine's fp32 GEMM rate in GFLOP/s: the best of `repeats` timed products [m, d] · [d, n] into a reused
    output (shape (m, d, n), the exact search's block by default) through the BLAS the jobs use
    (knnlm.search.exact.cpu_matmul: MKL by torch.mm on Intel, numpy's OpenBLAS elsewhere), at `threads` threads."""
    import torch
    from threadpoolctl import threadpool_limits

    from ..search.exact import cpu_matmul

    m, d, n = shape
    rng = np.random.default_rng(0)
    a = rng.normal(size=(m, d)).astype(np.float32)
    b = rng.normal(size=(d, n)).astype(np.float32)
    out = np.empty((m, n), dtype=np.float32)
    best = np.inf
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads, user_api="blas"):
            cpu_matmul(a, b, out)
            for _ in range(repeats):
                t0 = time.perf_counter()
                cpu_matmul(a, b, out)
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 2.0 * m * d * n / best / 1e9


def exact_flops(root: Path) -> tuple[float, set[str]]:
    """(GEMM flops of the run's exact searches, the CPU models that ran them): exact_work without the seconds."""
    total, _, cpus = exact_work(root)
    return total, cpus


def exact_work(root: Path) -> tuple[float, float, set[str]]:
    """(GEMM flops of the run's exact searches, their recorded seconds, the CPU models that ran them), from their metas
    (artifacts 'exact_meta' and 'exact_shard_meta'; knnlm.experiments.retrieval). A nested scan writes one meta per
    datastore size with the flops and seconds of its one scan: metas of one (LM, key, metric, split) with the same
    flops and seconds count once."""
    from ..io import read_json
    from ..paths import Layout

    layout = Layout(Path(root).parent, Path(root).name)
    seen, total, seconds, cpus = set(), 0.0, 0.0, set()
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
            seconds += float(meta.get("seconds") or 0.0)
            cpus.add((meta.get("machine") or {}).get("cpu", ""))
    return total, seconds, cpus - {""}


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
    from ..io import read_checked_json, read_json
    from ..paths import Layout

    layout = Layout(Path(root).parent, Path(root).name)
    total = 0.0
    for w, p in layout.find("parametric_result"):
        lm = w["lm"]
        dim = int(read_checked_json(layout.path("datastore_manifest", lm=lm), "datastore_manifest")["D"])
        stats = layout.path("word_stats", lm=lm)
        vocab = int(np.load(stats)["freq"].shape[0]) if stats.exists() else 0
        t = {v["split"]: int(read_checked_json(q, "queries_manifest")["T"]) for v, q in layout.find("queries_manifest", lm=lm)}
        result = read_json(p)
        valid = int(result.get("valid_tokens") or valid_tokens or t.get("valid", 0))
        total += parametric_flops(result, dim, vocab, valid, sum(t.values()))
    return total


EXACT_STAGE = "exact search and real score"
PARAMETRIC_STAGE = "parametric alternatives"


def other_kind_table(stages: pd.DataFrame, work: dict[str, tuple[float, float, float]], kind_here: str) -> pd.DataFrame:
    """Per stage of stages (knnlm.report.times.stage_shares: 'stage', 'wall (min)'), the measured minutes here,
    the stage's GEMM work and the estimate on the other CPU kind (module doc). work: {stage: (F flops, S seconds of
    that work here, R_other GFLOP/s of that work on the other kind)} (stage_work); a stage without an entry keeps its
    time. kind_here: 'intel' | 'amd'. Raises ValueError for another kind or a rate ≤ 0."""
    if kind_here not in REFERENCE_RATES:
        raise ValueError(f"CPU kind must be one of {sorted(REFERENCE_RATES)}, found {kind_here!r}")
    other = next(k for k in REFERENCE_RATES if k != kind_here)
    rows = []
    for _, s in stages.iterrows():
        if s["stage"] == "total":
            continue
        wall = float(s["wall (min)"]) * 60
        f, secs, r_other = work.get(s["stage"], (0.0, 0.0, 1.0))
        if not r_other > 0:
            raise ValueError(f"GEMM rates must be > 0, found {r_other} for stage {s['stage']!r} on {other}")
        gemm_here = min(wall, float(secs))
        est = wall - gemm_here + float(f) / (r_other * 1e9)
        rows.append({"stage": s["stage"], "measured here (min)": wall / 60, "GEMM work (GFLOP)": f / 1e9,
                     "GEMM share here": f"{100 * gemm_here / wall:.0f} %" if wall else "-",
                     f"estimate on {other} (min)": est / 60})
    df = pd.DataFrame(rows)
    total = {"stage": "total", "measured here (min)": df["measured here (min)"].sum(),
             "GEMM work (GFLOP)": df["GEMM work (GFLOP)"].sum(), "GEMM share here": "",
             f"estimate on {other} (min)": df[f"estimate on {other} (min)"].sum()}
    return pd.concat([df, pd.DataFrame([total])], ignore_index=True)


def stage_work(root: Path, rate_here: float, kind_here: str, valid_tokens: int | None = None
               ) -> tuple[dict[str, tuple[float, float, float]], set[str]]:
    """({stage: (F, S, R_other)} for other_kind_table, the CPU models that ran the exact searches) of the run at root:
    the exact searches' recorded flops and seconds with the other kind's EXACT_RATES, the parametric trainings'
    estimated flops (run_parametric_flops; valid_tokens as there) at rate_here (GFLOP/s of this machine's GEMM,
    gemm_rate) with the other kind's REFERENCE_RATES. Raises ValueError for a kind other than 'intel' or 'amd', or a
    rate ≤ 0."""
    if kind_here not in REFERENCE_RATES:
        raise ValueError(f"CPU kind must be one of {sorted(REFERENCE_RATES)}, found {kind_here!r}")
    if not rate_here > 0:
        raise ValueError(f"GEMM rates must be > 0, found here {rate_here}")
    other = next(k for k in REFERENCE_RATES if k != kind_here)
    f_exact, s_exact, cpus = exact_work(root)
    f_par = run_parametric_flops(root, valid_tokens)
    return {EXACT_STAGE: (f_exact, s_exact, EXACT_RATES[other]),
            PARAMETRIC_STAGE: (f_par, f_par / (rate_here * 1e9), float(REFERENCE_RATES[other]["gflops"]))}, cpus


def kind_of_this_machine() -> str | None:
    """cpu_kind of this machine's CPU model (knnlm.io.machine)."""
    from ..io import machine

    return cpu_kind(machine()["cpu"])
