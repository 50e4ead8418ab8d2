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
"""
__version__ = "0.1.0"
