"""Continue a prompt with a run's kNN-LM (knnlm.api.KNNLM.generate: Eq. 5 over the whole vocabulary).

    python -m knnlm.generate --config configs/wikitext2.yaml --prompt "The castle was" --max-new-tokens 30
    python -m knnlm.generate --bundle bundles/wt2-att-l2 --prompt "The castle was"

Prints the prompt and its continuation on stdout, the settings (k, τ, λ, mask) on stderr. Several --config files
are merged in order, as Snakemake's --configfile.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import yaml


def merged_config(paths: list[str]) -> tuple[str, dict]:
    """(first config file, the later ones merged into one overrides dict)."""
    from .config import ConfigError, deep_merge

    over: dict = {}
    for p in paths[1:]:
        if not Path(p).is_file():
            raise ConfigError(f"config file not found: {p}")
        over = deep_merge(over, yaml.safe_load(Path(p).read_text()) or {})
    return paths[0], over


def run_arguments(ap: argparse.ArgumentParser, tuned: bool = True, bundle: bool = True) -> None:
    """The arguments naming a kNN-LM: a run's (--config ..., --lm NAME, --key, --metric, and --tuned unless `tuned` is
    False) or, with `bundle`, a saved one (--bundle DIR, and --lm a Hugging Face model folder or Hub id in place of
    the bundle's own). Shared by python -m knnlm.generate, knnlm.bundle and knnlm.score (run_knnlm reads them)."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", action="append", help="a run's config file(s), merged in order")
    if bundle:
        src.add_argument("--bundle", help="a bundle folder (KNNLM.save_pretrained; python -m knnlm.bundle writes one)")
    ap.add_argument("--lm", help="with --config: the run's base LM (default: base); with --bundle: a Hugging Face model "
                                 "folder or Hub id to use instead of the bundle's (the same weights)")
    ap.add_argument("--key", default="att", choices=["att", "ffn"], help="with --config: the key type")
    ap.add_argument("--metric", default="l2", choices=["l2", "ip"], help="with --config: the metric")
    if tuned:
        ap.add_argument("--tuned", action="store_true", help="with --config: τ* and λ tuned on valid (Table 1's 'τ "
                                                             "tuned' row)")


def setting_arguments(ap: argparse.ArgumentParser) -> None:
    """The kNN-LM's settings as flags, each also by knn-transformers' name: --k, --temperature (--knn-temp), --lam
    (--lmbda), --nprobe (--probe), --mask faiss|exact, --score faiss|real (--recompute-dists: real). Unset flags keep
    the run's or the bundle's values (settings_of reads them)."""
    ap.add_argument("--k", type=int, help="neighbours (default: the run's config 'knn.k' or the bundle's)")
    ap.add_argument("--temperature", "--knn-temp", "--knn_temp", dest="temperature", type=float,
                    help="τ (default: Table 1's, or the bundle's)")
    ap.add_argument("--lam", "--lmbda", dest="lam", type=float, help="λ (default: Table 1's tuned on valid, or the "
                                                                     "bundle's)")
    ap.add_argument("--nprobe", "--probe", dest="nprobe", type=int, help="IVF lists probed per query")
    ap.add_argument("--mask", choices=["faiss", "exact"], help="faiss (IVFPQ top-k, the default) or exact")
    ap.add_argument("--score", choices=["faiss", "real"], help="faiss (PQ distances, the default) or real (recomputed)")
    ap.add_argument("--recompute-dists", "--recompute_dists", dest="score", action="store_const", const="real",
                    help="knn-transformers' name of --score real")


def settings_of(a: argparse.Namespace) -> dict:
    """The settings given as flags (setting_arguments), checked before any model loads (knnlm.api.check_settings).
    Raises ValueError naming the setting."""
    from .api import check_settings

    given = {n: getattr(a, n, None) for n in ("k", "temperature", "lam", "nprobe", "mask", "score")}
    given = {n: v for n, v in given.items() if v is not None}
    check_settings(**given)
    return given


def read_text_file(path: str, what: str = "text") -> str:
    """The UTF-8 text of file `path`, read and checked before any model loads. Raises ArtifactError naming the file
    when it is missing, not UTF-8, or has no words."""
    from .io import ArtifactError

    f = Path(path)
    if not f.is_file():
        raise ArtifactError(f"{path}: {what} file not found")
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: {what} file is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not text.split():
        raise ArtifactError(f"{path}: {what} file has no words")
    return text


@contextlib.contextmanager
def naming(path: str):
    """A context manager that names the file `path` in an input error raised inside it (the tokenizer's '<text>')."""
    from .io import ArtifactError

    try:
        yield
    except (ArtifactError, ValueError) as e:
        if path in str(e):
            raise
        raise type(e)(f"{path}: {str(e).replace('<text>: ', '')}") from None


def run_knnlm(a: argparse.Namespace, **settings):
    """The kNN-LM the run_arguments in `a` name, with `settings`: KNNLM.from_run of its config files (merged in order),
    or KNNLM.from_pretrained of its bundle (with a Hugging Face LM given as --lm)."""
    from .api import KNNLM, HuggingFaceLM

    if getattr(a, "bundle", None):
        return KNNLM.from_pretrained(a.bundle, lm=HuggingFaceLM(a.lm) if a.lm else None, **settings)
    first, over = merged_config(a.config)
    return KNNLM.from_run(first, lm=a.lm or "base", key=a.key, metric=a.metric, tuned=getattr(a, "tuned", False),
                          overrides=over, **settings)


def cli_main(main) -> None:
    """Run a command-line `main()`: an error of the input (a file, a config key, a setting) is one line on stderr
    naming it, and exit status 2; no traceback. Other errors propagate."""
    from .config import ConfigError
    from .io import ArtifactError

    try:
        main()
    except (ArtifactError, ConfigError, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.generate", description=__doc__.split("\n")[0])
    run_arguments(ap)
    setting_arguments(ap)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=30)
    ap.add_argument("--sample", action="store_true", help="sample (default: greedy)")
    ap.add_argument("--top-k", type=int, default=0, help="sample among the top k tokens (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    knn = run_knnlm(a, **settings_of(a))
    s = knn.settings()
    print(f"kNN-LM {a.lm or a.bundle or 'base'} {s['key']}/{s['metric']}: k={s['k']} τ={s['temperature']:g} λ={s['lambda']:.2f} "
          f"mask={s['mask']} nprobe={s['nprobe']}", file=sys.stderr)
    ids = [int(i) for i in knn.lm.encode_prompt(a.prompt)]
    print(knn.lm.decode(ids + knn.generate_ids(ids, a.max_new_tokens, a.sample, a.top_k, a.seed)))


if __name__ == "__main__":
    cli_main(main)
