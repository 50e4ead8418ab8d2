"""Tune and compare a run's kNN-LM on text files from the shell (knnlm.api.KNNLM.tune and compare).

    python -m knnlm.score --config configs/wikitext2.yaml --key att --metric l2 --tune valid.txt --text test.txt
    python -m knnlm.score --bundle my_bundle [--lm PATH] --text test.txt [--tune valid.txt] [--against lm|DIR]

prints, as a Markdown table, the kNN-LM's perplexity per word against its base LM (--against lm, the default) or
against the same LM's kNN-LM with other keys (--against ffn/l2, or another bundle's folder): the paired relative
difference, its 95 % interval
over the text's documents and the verdict, as the pipeline's Table 1 comparisons. --tune tunes τ and λ on a text
first (τ* and λ*; without it, Table 1's τ and λ of the run). Several --config files are merged in order.
"""
from __future__ import annotations

import argparse
import sys

from .generate import cli_main, run_arguments, run_knnlm


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.score", description=__doc__.split("\n")[0])
    run_arguments(ap, tuned=False)
    ap.add_argument("--tune", help="a text file to tune τ and λ on (τ* and λ*)")
    ap.add_argument("--text", required=True, help="the text file to score and compare on")
    ap.add_argument("--against", default="lm", help="'lm' (the base LM), key/metric of the run's other kNN-LM (e.g. "
                                                     "ffn/l2), or another bundle's folder")
    a = ap.parse_args(argv)
    import pandas as pd

    knn = run_knnlm(a)
    if a.tune:
        t = knn.tune(open(a.tune, encoding="utf-8").read())
        print(f"tuned on {a.tune}: τ* = {t['tuned_temperature']:g}, λ* = {t['tuned_lambda']:.2f} ({t['tokens']} "
              f"tokens)", file=sys.stderr)
    against = "lm"
    if a.against != "lm":
        from pathlib import Path

        if Path(a.against).is_dir():  # another bundle (of the same LM)
            against = run_knnlm(argparse.Namespace(**{**vars(a), "config": None, "bundle": a.against}))
        elif "/" in a.against and a.config:
            key, metric = a.against.split("/", 1)
            against = run_knnlm(argparse.Namespace(**{**vars(a), "key": key, "metric": metric.lower()}))
        else:
            raise ValueError(f"--against {a.against!r}: expected 'lm', key/metric (with --config) or a bundle folder")
        if a.tune:
            against.tune(open(a.tune, encoding="utf-8").read())
    c = knn.compare(open(a.text, encoding="utf-8").read(), against)
    row = {"comparison": c["comparison"], "τ": knn.temperature, "λ": round(knn.lam, 4),
           **{n: v["value"] for n, v in c["ppl"].items()},
           "relative difference": c["relative difference"], "CI low": c["CI low"], "CI high": c["CI high"],
           "verdict": c["verdict"], "units": f"{c['documents']} {c['unit']} (n_eff {c['effective']:.1f})"}
    print(pd.DataFrame([row]).to_markdown(index=False, floatfmt=".4g"))


if __name__ == "__main__":
    cli_main(main)
