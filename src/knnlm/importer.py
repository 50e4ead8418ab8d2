"""Import a knn-transformers or urvashik/knnlm datastore (headerless memmaps) from the shell, verified with its LM
(knnlm.datastore.importer.import_memmap, then knnlm.api.KNNLM.verify).

    python -m knnlm.importer --keys dstore_gpt2_116988150_768_keys.npy --vals dstore_gpt2_116988150_768_vals.npy \\
        --block-size 1024 --stride 512 --lm gpt2 --out my_datastore

The windows the keys were dumped in, in either tool's names: knn-transformers' --block-size B --stride S (theirs;
defaults 1024 and 512: tokens_per_sample = B, context_window = B − S) or urvashik/knnlm's --tokens-per-sample T
--context-window C (fairseq-eval-lm's; their README: 3072 and 2560); --unknown-windows imports without them (checked
only loosely: logged, never refused). --lm verifies the keys at import and refuses another LM's (nothing is left),
and records its identity (weights', tokenizer's, vocabulary's sha256); --index imports a prebuilt FAISS index of the
keys (knn-transformers' index_<model>_<N>_<D>.indexed) without training it, checked against them; --no-verify imports
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
    ap.add_argument("--link", action="store_true", help="read float16 keys in place instead of copying them (the "
                                                         "keys file must stay where it is)")
    ap.add_argument("--index", help="a prebuilt FAISS IVF index of these keys (knn-transformers' index_<model>_<N>_<D>"
                                    ".indexed): imported without training, checked against the keys")
    ap.add_argument("--probe", type=int, help="with --index: lists probed per query (default: the index's own)")
    a = ap.parse_args(argv)
    if not a.lm and not a.no_verify:
        raise ValueError("give --lm (the Hugging Face model whose keys these are) to verify them at import, or "
                         "--no-verify to import them unverified")
    lm = None
    if a.lm:
        from .lm.hf import HuggingFaceLM

        lm = HuggingFaceLM(a.lm)
    man = import_memmap(a.keys, a.vals, a.out, size=a.size, dim=a.dim, keys_dtype=a.keys_dtype,
                        vals_dtype=a.vals_dtype, key_type=a.key_type,
                        vocab_size=a.vocab_size or (lm.vocab_size if lm else None),
                        checkpoint_sha256=sha256_file(a.checkpoint) if a.checkpoint else None,
                        tokens_per_sample=a.tokens_per_sample, context_window=a.context_window,
                        block_size=a.block_size, stride=a.stride, unknown_windows=a.unknown_windows,
                        lm_identity=lm.identity if lm else None, link_keys=a.link)
    if lm:
        verify_import(a.out, lm, a.key_type)
    else:
        write_json(DatastoreLayout(a.out).path("manifest"), {**man, "verified": False})
    print(f"imported {man['N']} keys of dim {man['D']} ({man['key_types'][0]}) into {a.out}"
          + ("" if a.lm else " (unverified: --no-verify)"))
    if a.index:
        meta = import_index(a.out, a.index, a.key_type, a.probe)
        print(f"imported the {meta['metric']} index {a.index} ({meta['ncentroids']} lists, {meta['code_size']} bytes "
              f"per key, nprobe {meta['nprobe']}; {meta['fit']['code_agreement']:.0%} of sampled code bytes those of the keys)")


def verify_import(out_dir: str | Path, lm, key_type: str) -> dict:
    """KNNLM.verify of an imported store with the Hugging Face LM `lm` (a HuggingFaceLM, or its folder or hub id;
    knnlm.api.KNNLM.from_datastore). With the windows recorded, every sampled row must reproduce (the largest
    relative error within the tolerance); without them (--unknown-windows) the store is checked loosely: its
    recomputed states are logged, never refused, and the manifest says 'loose'. On success the manifest records
    'verified' (the LM, the rows checked, their largest and median errors), else the imported files are removed and
    the ArtifactError (naming the keys file, the worst row and both LMs) is raised."""
    import shutil

    from .api import KNNLM
    from .lm.hf import HuggingFaceLM

    ds = DatastoreLayout(out_dir)
    if not isinstance(lm, HuggingFaceLM):
        lm = HuggingFaceLM(str(lm))
    try:
        knn = KNNLM.from_datastore(lm, out_dir, key=key_type, mask="exact", k=1, verify=False)
        v = knn.verify()
    except Exception:
        for kind in ("keys", "vals", "manifest"):
            p = ds.path(kind, key=key_type) if kind == "keys" else ds.path(kind)
            p.unlink(missing_ok=True)
        if Path(out_dir).is_dir() and not any(Path(out_dir).iterdir()):
            shutil.rmtree(out_dir)
        raise
    man = {**knn.manifest, "verified": {"lm": lm.identity["model"], "rows": v["rows"], "att": v["att"],
                                        "ffn": v["ffn"], "median": v["median"], "windows": v["windows"],
                                        **({} if v["windows"] else {"loose": True})}}
    write_json(ds.path("manifest"), man)
    return v


def import_index(out_dir: str | Path, index_file: str | Path, key_type: str = "att", nprobe: int | None = None) -> dict:
    """Import a prebuilt FAISS IVF index of the keys of an imported store (knn-transformers' index_<model>_<N>_<D>
    .indexed, urvashik/knnlm's knn.index) into out_dir (DatastoreLayout 'index' of its key type and metric) without
    training it again: its metric, lists, code size and nprobe are read from the index itself, and it is checked
    against the store's keys before it is taken (ntotal = N, the keys' dimension, and a sample of its entries
    whose stored codes are those its encoder gives the keys they claim to be: knnlm.search.index.check_index_fits). The file is hard-linked
    where the file system allows, else copied (atomically); its parameters, sha256 and the check go to DatastoreLayout
    'index_meta', which KNNLM.from_datastore reads (nprobe: the index's own unless given, knn-transformers' --probe).
    Returns that record. Raises ArtifactError naming the index file when it is not an IVF index, holds another number
    of keys, or is not an index of these keys."""
    import os
    import shutil

    import faiss

    from .datastore.dump import open_datastore
    from .io import atomic_path
    from .search.index import check_index_fits, metric_name, read_index

    ds, index_file = DatastoreLayout(out_dir), Path(index_file)
    keys, _, man = open_datastore(ds.path("manifest"), ds.path("vals"), ds.path("keys", key=key_type), key_type)
    index = read_index(index_file)
    if index.ntotal != man["N"]:
        raise ArtifactError(f"{index_file}: an index of {index.ntotal:,} keys, the store has {man['N']:,}")
    metric = metric_name(index)
    if metric is None:
        raise ArtifactError(f"{index_file}: an index of metric {index.metric_type}; expected L2 or inner product")
    fit = check_index_fits(index, index_file, metric, keys, key_type)
    ivf = faiss.extract_index_ivf(index)
    meta = {"source": "imported", "imported_from": str(index_file), "sha256": sha256_file(index_file),
            "key_type": key_type, "metric": metric, "ntotal": int(index.ntotal), "ncentroids": int(ivf.nlist),
            "code_size": int(ivf.code_size), "nprobe": int(nprobe or ivf.nprobe), "fit": fit,
            "datastore_checkpoint_sha256": man.get("checkpoint_sha256")}
    dst = ds.path("index", key=key_type, metric=metric)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dst) as tmp:
        try:
            os.link(index_file, tmp)
        except OSError:
            shutil.copyfile(index_file, tmp)
    write_json(ds.path("index_meta", key=key_type, metric=metric), meta)
    return meta


if __name__ == "__main__":
    cli_main(main)
