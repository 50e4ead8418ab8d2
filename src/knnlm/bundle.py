"""Export a run's kNN-LM as a bundle (knnlm.api.KNNLM.save_pretrained): its datastore, index and settings in one
folder that KNNLM.from_pretrained loads anywhere, verified against the LM.

    python -m knnlm.bundle --config configs/wikitext2.yaml --lm base --key att --metric l2 --out bundles/wt2-att-l2

τ and λ are Table 1's for (key, metric) (the config τ and its λ tuned on valid; --tuned: τ* and λ tuned on valid).
Several --config files are merged in order, as Snakemake's --configfile.
"""
from __future__ import annotations

import argparse
import sys

from .generate import cli_main, run_arguments, run_knnlm


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.bundle", description=__doc__.split("\n")[0])
    run_arguments(ap, bundle=False)
    ap.add_argument("--out", required=True, help="the bundle folder to write")
    a = ap.parse_args(argv)
    knn = run_knnlm(a)
    out = knn.save_pretrained(a.out)
    v = knn.verify()
    s = knn.settings()
    print(f"{out}: kNN-LM {a.lm or 'base'} {s['key']}/{s['metric']}, k={s['k']} τ={s['temperature']:g} λ={s['lambda']:.3f} "
          f"nprobe={s['nprobe']}; verified on {v['rows']} rows (median relative key error {v[a.key]:.1e})",
          file=sys.stderr)


if __name__ == "__main__":
    cli_main(main)
