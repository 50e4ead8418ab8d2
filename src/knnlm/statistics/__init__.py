"""Statistics of every comparison: documents, paired intervals over them, verdicts, and their measured coverage.

  intervals -- documents of a split (the resampling unit), per-document sums, the intervals (jackknife-t, BCa,
               percentile) and the verdict of a paired comparison;
  coverage  -- the intervals' coverage measured in simulations of realistic splits (docs/coverage.md).
"""
