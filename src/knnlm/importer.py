"""Import a knn-transformers or urvashik/knnlm datastore (headerless memmaps) from the shell, verified with its LM
(knnlm.datastore.importer.import_memmap, then knnlm.api.KNNLM.verify).

    python -m knnlm.importer --keys dstore_gpt2_116988150_768_keys.npy --vals dstore_gpt2_116988150_768_vals.npy \\
        --block-size 1024 --stride 512 --lm gpt2 --out my_datastore

The windows the keys were dumped in, in either tool's names: knn-transformers' --block-size B --stride S (theirs;
defaults 1024 and 512: tokens_per_sample = B, context_window = B − S) or urvashik/knnlm's --tokens-per-sample T
--context-window C (fairseq-eval-lm's; their README: 3072 and 2560); --unknown-windows imports without them (checked
only loosely). --lm verifies the keys at import and refuses another LM's (nothing is left); --no-verify imports
them marked unverified. An input error is one line on stderr (exit 2).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .datastore.importer import import_memmap
from .generate import cli_main
from .io import ArtifactError, sha256_file, write_json
from .paths import DatastoreLayout


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m knnlm.importer", description=__doc__.split("\n")[0])
    ap.add_argument("--keys", required=True)
    ap.add_argument("--vals", required=True)
    ap.add_argument("--out", required=True, help="the datastore folder to write (keys, vals, manifest)")
    ap.add_argument("--size", type=int, help="N (default: from a knn-transformers file name)")
    ap.add_argument("--dim", type=int, help="D (default: from a knn-transformers file name)")
    ap.add_argument("--keys-dtype", default="float16", help="float16 (default) or float32")
    ap.add_argument("--vals-dtype", default="int32", help="int32 (knn-transformers), int16 or int64 (urvashik/knnlm)")
    ap.add_argument("--key-type", default="att", choices=["att", "ffn"],
                    help="att = the tools' last_ffn_input (their default), ffn = last_ffn_output")
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--checkpoint", help="the LM checkpoint the keys came from (its sha256 is recorded)")
    ap.add_argument("--tokens-per-sample", type=int,
                    help="urvashik/knnlm (fairseq-eval-lm): the window length the keys were dumped with (README: 3072)")
    ap.add_argument("--context-window", type=int,
                    help="urvashik/knnlm: the context tokens each window carried before its targets (README: 2560)")
    ap.add_argument("--block-size", type=int, help="knn-transformers: --block_size of the dump (default 1024)")
    ap.add_argument("--stride", type=int, help="knn-transformers: --stride of the dump (default 512)")
    ap.add_argument("--unknown-windows", action="store_true", help="import without the windows (checked loosely)")
    ap.add_argument("--lm", help="a Hugging Face model (folder or hub id) whose keys these are: verified at import")
    ap.add_argument("--no-verify", action="store_true", help="import without verifying (the store is marked so)")
    a = ap.parse_args(argv)
    if not a.lm and not a.no_verify:
        raise ValueError("give --lm (the Hugging Face model whose keys these are) to verify them at import, or "
                         "--no-verify to import them unverified")
    man = import_memmap(a.keys, a.vals, a.out, size=a.size, dim=a.dim, keys_dtype=a.keys_dtype,
                        vals_dtype=a.vals_dtype, key_type=a.key_type, vocab_size=a.vocab_size,
                        checkpoint_sha256=sha256_file(a.checkpoint) if a.checkpoint else None,
                        tokens_per_sample=a.tokens_per_sample, context_window=a.context_window,
                        block_size=a.block_size, stride=a.stride, unknown_windows=a.unknown_windows)
    if a.lm:
        verify_import(a.out, a.lm, a.key_type)
    else:
        write_json(DatastoreLayout(a.out).path("manifest"), {**man, "verified": False})
    print(f"imported {man['N']} keys of dim {man['D']} ({man['key_types'][0]}) into {a.out}"
          + ("" if a.lm else " (unverified: --no-verify)"))


def verify_import(out_dir: str | Path, lm_path: str, key_type: str) -> dict:
    """KNNLM.verify of an imported store with the Hugging Face LM at lm_path (knnlm.api.KNNLM.from_datastore); on
    success the manifest records 'verified' (the errors and the LM), else the imported files are removed and the
    ArtifactError (naming the keys file and both LMs) is raised."""
    import shutil

    from .api import KNNLM
    from .lm.hf import HuggingFaceLM

    ds = DatastoreLayout(out_dir)
    try:
        knn = KNNLM.from_datastore(HuggingFaceLM(lm_path), out_dir, key=key_type, mask="exact", k=1, verify=False)
        v = knn.verify()
        if not v["windows"] and not (v["matches"] and v["matches"][0] == key_type):
            raise ArtifactError(f"{ds.path('keys', key=key_type)}: the keys are not {lm_path}'s {key_type} states in "
                                f"the LM's own windows (median relative error att {v['att']:.3g}, ffn {v['ffn']:.3g});"
                                " give the windows they were dumped in (--block-size/--stride or --tokens-per-sample/"
                                "--context-window), or --no-verify")
    except Exception:
        for kind in ("keys", "vals", "manifest"):
            p = ds.path(kind, key=key_type) if kind == "keys" else ds.path(kind)
            p.unlink(missing_ok=True)
        if Path(out_dir).is_dir() and not any(Path(out_dir).iterdir()):
            shutil.rmtree(out_dir)
        raise
    man = {**knn.manifest, "verified": {"lm": lm_path, "rows": v["rows"], "att": v["att"], "ffn": v["ffn"],
                                        "windows": v["windows"]}}
    write_json(ds.path("manifest"), man)
    return v


if __name__ == "__main__":
    cli_main(main)
