"""knnlm: a pipeline reproducing "Why do Nearest Neighbor Language Models Work?" (Xu, Alon, Neubig, ICML 2023).

Modules:
  config    -- load + validate experiment configs (JSON schema in workflow/schemas/)
  io        -- atomic writes, memmap arrays with integrity checks, manifests
  data      -- WikiText splits, word counts, sentencepiece BPE
  lm        -- fairseq-preprocess / fairseq-train wrappers
  dump      -- one pass of the LM: datastore keys (att, ffn) + vals, and valid/test queries
  index     -- faiss IVFPQ build and top-k search, cached neighbours
  scoring   -- p_kNN (Eq. 2/6), interpolation, λ tuning, oracle, perplexity
  tables    -- Table 1 (CSV + Markdown)
  tracking  -- MLflow logging (sqlite store by default)
  api       -- KNNLM: score text, generate, build a datastore from Python (also `from knnlm import KNNLM`)
  generate  -- `python -m knnlm.generate`: continue a prompt with a run's kNN-LM
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
