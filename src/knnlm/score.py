"""Tune and compare a run's kNN-LM on text files from the shell (knnlm.api.KNNLM.tune and compare).

    python -m knnlm.score --config configs/wikitext2.yaml --key att --metric l2 --tune valid.txt --text test.txt
    python -m knnlm.score --bundle my_bundle [--lm PATH] --text test.txt [--tune valid.txt] [--against lm|DIR]

prints, as a Markdown table, the kNN-LM's perplexity per word against its base LM (--against lm, the default) or
against the same LM's kNN-LM with other keys (--against ffn/l2, or another bundle's folder): the paired relative
difference, its 95 % interval
over the text's documents and the verdict, as the pipeline's Table 1 comparisons. --tune tunes τ and λ on a text
first (τ* and λ*; without it, Table 1's τ and λ of the run). --k, --temperature, --lam, --nprobe, --mask and --score
(or knn-transformers' --knn-temp, --lmbda, --probe, --recompute-dists) set the kNN-LM's settings. Every input (the
settings, the text files) is checked before the model loads. Several --config files are merged in order.
"""
from __future__ import annotations

import argparse
import sys

from .generate import cli_main, naming, read_text_file, run_arguments, run_knnlm, setting_arguments, settings_of


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.score", description=__doc__.split("\n")[0])
    run_arguments(ap, tuned=False)
    setting_arguments(ap)
    ap.add_argument("--tune", help="a text file to tune τ and λ on (τ* and λ*)")
    ap.add_argument("--text", required=True, help="the text file to score and compare on")
    ap.add_argument("--against", default="lm", help="'lm' (the base LM), key/metric of the run's other kNN-LM (e.g. "
                                                     "ffn/l2), or another bundle's folder")
    a = ap.parse_args(argv)
    import pandas as pd

    settings = settings_of(a)  # every input checked before the model loads
    text = read_text_file(a.text)
    valid = read_text_file(a.tune, "--tune text") if a.tune else None
    knn = run_knnlm(a, **settings)
    if a.tune:
        with naming(a.tune):
            t = knn.tune(valid)
        print(f"tuned on {a.tune}: τ* = {t['tuned_temperature']:g}, λ* = {t['tuned_lambda']:.2f} ({t['tokens']} "
              f"tokens)", file=sys.stderr)
    against = "lm"
    if a.against != "lm":
        from pathlib import Path

        if Path(a.against).is_dir():  # another bundle (of the same LM)
            against = run_knnlm(argparse.Namespace(**{**vars(a), "config": None, "bundle": a.against}), **settings)
        elif "/" in a.against and a.config:
            key, metric = a.against.split("/", 1)
            against = run_knnlm(argparse.Namespace(**{**vars(a), "key": key, "metric": metric.lower()}), **settings)
        else:
            raise ValueError(f"--against {a.against!r}: expected 'lm', key/metric (with --config) or a bundle folder")
        if a.tune:
            with naming(a.tune):
                against.tune(valid)
    with naming(a.text):
        c = knn.compare(text, against)
    row = {"comparison": c["comparison"], "τ": knn.temperature, "λ": round(knn.lam, 4),
           **{n: v["value"] for n, v in c["ppl"].items()},
           "relative difference": c["relative difference"], "CI low": c["CI low"], "CI high": c["CI high"],
           "verdict": c["verdict"], "units": f"{c['documents']} {c['unit']} (n_eff {c['effective']:.1f})"}
    print(pd.DataFrame([row]).to_markdown(index=False, floatfmt=".4g"))


if __name__ == "__main__":
    cli_main(main)
