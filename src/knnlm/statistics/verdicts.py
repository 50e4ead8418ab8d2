"""Verdicts: what a confidence interval says, and what it says about a claim of the paper (one home for the rules
and the margins every table and the findings use).

  verdict        -- a difference: 'lower' / 'higher' when the CI excludes 0, 'inconclusive' otherwise, and
                    'inconclusive (N articles, n_eff E)' when the documents are too few as the interval counts them;
  paper_verdict  -- a claim's sign: 'reproduced' / 'contradicted' from verdict and the paper's sign;
  within_verdict -- "tuning gains less than m" (one-sided margin);
  band_verdict   -- "the value is about x" (the CI inside a stated band).
"""
from __future__ import annotations

from .documents import unit_count


def verdict(lo: float, hi: float, documents: int | None = None, min_documents: int = 0,
            effective: float | None = None, scheme: str = "") -> str:
    """'lower' / 'higher' when the interval of a difference excludes 0, else 'inconclusive'; whatever the interval,
    'inconclusive (N articles, n_eff E)' when the documents back it with fewer than `min_documents` (config
    'stats.min_documents') as the interval counts them: `effective` (Kish's effective number, effective_documents)
    when given, else `documents`. scheme: the documents scheme, naming the unit (unit_count)."""
    n = effective if effective is not None else documents
    if n is not None and n < min_documents:
        what = unit_count(int(documents), scheme) if documents is not None else unit_count(float(n), scheme)
        return f"inconclusive ({what}" + (f", n_eff {effective:.1f})" if effective is not None else ")")
    return "lower" if hi < 0 else "higher" if lo > 0 else "inconclusive"


def paper_verdict(ours: str, paper_sign: int) -> str:
    """'reproduced' / 'contradicted' / 'inconclusive' from our CI's verdict ('lower', 'higher', 'inconclusive',
    'inconclusive (N documents)', kept as it is) and the sign of the paper's difference (−1: a lower than b)."""
    if ours.startswith("inconclusive"):
        return ours
    if paper_sign == 0:
        return "inconclusive"
    return "reproduced" if (ours == "lower") == (paper_sign < 0) else "contradicted"


def within_verdict(lo: float, hi: float, margin: float) -> str:
    """Verdict of "tuning gains less than `margin`" from the CI [lo, hi] of a / b − 1 (a = tuned, b = default):
    reproduced if lo > −margin, contradicted if hi < −margin, else inconclusive."""
    return "reproduced" if lo > -margin else "contradicted" if hi < -margin else "inconclusive"


def band_verdict(lo: float, hi: float, low: float, high: float) -> str:
    """Verdict of "the value is about x" (a band [low, high] around x stated with the claim) from the CI [lo, hi]:
    reproduced when the CI lies inside the band, contradicted when it lies wholly outside, else inconclusive."""
    if low <= lo and hi <= high:
        return "reproduced"
    return "contradicted" if hi < low or lo > high else "inconclusive"


# The margins and bands of the findings' claims are data of the claims table (knnlm/experiments/claims.yaml:
# 'margins', 'bands'), derived from the effect they judge; these are the thresholds App. E's tables state.
CORRELATION_MARGIN = 0.05  # E.3: Pearson's r, reported beside the effect (a tiny r can hide a large trend)
