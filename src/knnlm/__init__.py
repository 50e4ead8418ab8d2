"""knnlm: a pipeline reproducing "Why do Nearest Neighbor Language Models Work?" (Xu, Alon, Neubig, ICML 2023).

The package in layers, lowest first (a module imports its own layer and lower ones; tests/test_layers.py):
  io, paths      -- atomic writes, memmaps, manifests; the artifact layout (its one owner)
  datastore/     -- keys, vals and queries on disk (dump), the store kinds (stores), imported stores (importer)
  config, job, data, tracking, slurm -- the validated config, one job, the corpus and BPE, MLflow, SLURM
  statistics/    -- documents, intervals over them, verdicts and margins, captions, coverage
  search/        -- IVFPQ (index), exact top-k (exact), selection kernels, the retrieval scope
  scoring/       -- p_kNN and Eq. 5 (interpolation), the τ sweep, the mask/score settings, per-token quality
  lm/            -- the LM interface and its backends (fairseq, hf), sliding windows, training, shipped LMs
  parametric     -- W_ds and the parametric alternatives (Sec. 4)
  report/        -- tables, figures, the report's front page, a run's times (`python -m knnlm.report`)
  experiments/, cli, api, generate, bundle, score -- the jobs Snakemake runs, their dispatcher, and the Python API
    (`from knnlm import KNNLM`; `python -m knnlm.generate` continues a prompt with a run's kNN-LM;
    `python -m knnlm.bundle` saves one as a bundle that KNNLM.from_pretrained loads; `python -m knnlm.score` tunes
    and compares one on text files)
"""
__version__ = "0.1.0"

import os as _os

# numpy's OpenBLAS keeps its threads spinning for 2^28 cycles (~0.1 s) after every GEMM; the exact search's
# numba selection pass, which follows each GEMM, then shares the 2 cores with them. Measured (N = 500k, D = 256,
# T = 4,096, k = 1,024): selection 3.3 s with the default, 2.1 s with 2^4 cycles. Read when OpenBLAS loads,
# so it takes effect where knnlm is imported before numpy (every `python -m knnlm` job); a user's setting wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def __getattr__(name: str):
    """`from knnlm import KNNLM` without importing torch at `import knnlm` (every pipeline job imports knnlm)."""
    if name in ("KNNLM", "KNNLogitsProcessor"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'knnlm' has no attribute {name!r}")
