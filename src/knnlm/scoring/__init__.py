"""kNN-LM scoring (Xu et al. 2023, Eq. 5): from neighbours to perplexity.

  interpolation -- p_kNN from neighbour scores at a temperature τ, interpolation with the LM (λ), the oracle,
                   perplexity per word and per token, λ and τ tuning, the τ × λ sweep;
  _sweep        -- the sweep's kernel (numba, sums in a fixed order);
  results       -- an alternative to the base LM evaluated (λ tuned on valid) into the row every table is built from;
  quality       -- per-token retrieval quality and what the LM knows (Drozdov et al. 2022, He et al. 2021);
  analysis      -- App. E's quantities (bigram statistics, argmax-able words, top-k softmax, mixture weights).
"""
