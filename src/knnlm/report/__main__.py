"""`python -m knnlm.report results/<config> [--results page.md]`: a run's measured times (knnlm.report.times)."""
from .times import main

main()
