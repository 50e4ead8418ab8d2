"""Import a published kNN-LM datastore (headerless memmaps) into this pipeline's datastore layout.

Layouts read:
  knn-transformers (neulab): dstore_<model>_<N>_<D>_keys.npy [N, D] float16, dstore_<model>_<N>_<D>_vals.npy [N, 1]
                             int32 (N and D are read from the names);
  urvashik/knnlm (Khandelwal et al. 2020): <prefix>_keys.npy [N, D] float16 with --dstore-fp16 (float32 without),
                             <prefix>_vals.npy [N, 1] int16 with --dstore-fp16 (int64 without); N (--dstore-size)
                             and D (the LM's embedding dim) must be given.
Written (knnlm.datastore.dump's files, knnlm.paths.DatastoreLayout): keys [N, D] float16, vals [N] int32 and the
manifest, which records where the files came from. Copied in chunks: memory stays flat in N.

    python -m knnlm.importer --keys dstore_gpt2_116988150_768_keys.npy --vals dstore_gpt2_116988150_768_vals.npy \\
        --block-size 1024 --stride 512 --lm gpt2 --out my_datastore
Key type: both tools store `last_ffn_input` by default (knn-transformers' --knn_keytype, urvashik/knnlm's
--knn-keytype), the input of the last layer's feed-forward block after its LayerNorm: this pipeline's att, the
importer's default. A store dumped with `last_ffn_output` is ffn (--key-type ffn).

Windows: the keys are hidden states, so they depend on the context each token had when they were dumped; the
importer needs the windows to check them (KNNLM.verify recomputes a sample in the same windows, aligned as the tool
that wrote them aligns them; the manifest's 'stream_offset'):
  knn-transformers: --block-size B --stride S (theirs; defaults 1024, the GPT-2 maximum, and 512): run_clm.py's
                    group_texts windows of B tokens starting every S tokens of the concatenated text, whose last S
                    labels are kept, and KNNSaver's rows: the state at each position with the next token as its val
                    (labels[:, 1:]). The text's first token is never a val, so row r is the text's token r + 1 and
                    the windows' first rows are r ≡ −1 (mod S) (stream_offset 1); this pipeline's tokens_per_sample =
                    B, context_window = B − S. (run_clm.py concatenates the texts of each `datasets.map` batch of 1,000
                    rows apart: a store dumped from several such batches has other windows after the first.)
  urvashik/knnlm:   --tokens-per-sample T --context-window C (fairseq-eval-lm's; their README: 3072 and 2560): every
                    token a val, the first predicted from the end-of-sentence token, as this pipeline's dumps
                    (stream_offset 0).
The command line (knnlm.importer) verifies the imported keys with --lm (a Hugging Face model folder or hub id) and
refuses a store that is not that LM's; --no-verify imports without the check and marks the store unverified.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..io import ArtifactError, create_npy, release_rows, sha256_file, write_json
from ..paths import DatastoreLayout

KNN_TRANSFORMERS = re.compile(r"dstore_(?P<model>.+)_(?P<n>\d+)_(?P<d>\d+)_(keys|vals)\.npy$")


def _memmap(path: Path, dtype, shape: tuple[int, ...], what: str) -> np.memmap:
    """A read-only headerless memmap; ArtifactError naming the file when its size is not shape × itemsize."""
    if not path.is_file():
        raise ArtifactError(f"{path}: {what} file not found")
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    got = path.stat().st_size
    if got != want:
        raise ArtifactError(f"{path}: expected {what} of shape {shape} {np.dtype(dtype).name} = {want} bytes, found "
                            f"{got} bytes (check --size, --dim and the dtypes)")
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def import_memmap(keys_file: str | Path, vals_file: str | Path, out_dir: str | Path, *, size: int | None = None,
                  dim: int | None = None, keys_dtype: str = "float16", vals_dtype: str = "int32", key_type: str = "att",
                  vocab_size: int | None = None, checkpoint_sha256: str | None = None, tokens_per_sample: int | None = None,
                  context_window: int | None = None, block_size: int | None = None, stride: int | None = None,
                  unknown_windows: bool = False, lm_identity: dict | None = None, link_keys: bool = False,
                  chunk: int = 1 << 16) -> dict:
    """Copy a memmap datastore into out_dir as keys [N, D] float16, vals [N] int32 and a manifest
    (knnlm.paths.DatastoreLayout); returns the manifest.

    size N and dim D default to those in knn-transformers file names. key_type: which hidden state the keys are
    ('att', the default: the last FFN's input after its LayerNorm, knn-transformers' and urvashik/knnlm's
    `last_ffn_input`; 'ffn' for their `last_ffn_output`, the final decoder output). vocab_size: when given, every
    val must be below it. checkpoint_sha256: the LM the keys came from (recorded, and checked when queries of that LM
    are scored). tokens_per_sample, context_window: the windows the keys were dumped in (fairseq-eval-lm's: windows of
    tokens_per_sample tokens, each scoring the tokens after its first context_window), recorded so that
    KNNLM.verify recomputes the very states; or knn-transformers' block_size and stride (tokens_per_sample =
    block_size, context_window = block_size − stride; their rows aligned as knn-transformers writes them,
    stream_offset 1). Without either, pass unknown_windows=True: the store is then checked only loosely
    (KNNLM.verify logs). lm_identity: the LM's identity (HuggingFaceLM.identity: its weights', tokenizer's and
    vocabulary's sha256), recorded so that a load with another LM is checked whatever its `verify` says.
    link_keys: read float16 keys in place (the manifest's 'linked_keys' names the file; checked for finite values
    and hashed, not copied: no second copy of the largest file on disk); the file must stay where it is. Raises ArtifactError naming the file for a wrong size, a non-finite key
    in fp16, or a val outside [0, vocab_size) (int16 vals of a vocabulary over 32,767 overflow: re-dump with int32
    vals); ValueError for a missing N or D, a bad key type, or windows that are missing or inconsistent.
    """
    keys_file, vals_file, out = Path(keys_file), Path(vals_file), Path(out_dir)
    if key_type not in ("att", "ffn"):
        raise ValueError(f"key_type must be 'att' or 'ffn', found {key_type!r}")
    tokens_per_sample, context_window = import_windows(tokens_per_sample, context_window, block_size, stride,
                                                       unknown_windows)
    m = KNN_TRANSFORMERS.search(keys_file.name)
    size = size or (int(m["n"]) if m else None)
    dim = dim or (int(m["d"]) if m else None)
    if not size or not dim:
        raise ValueError(f"{keys_file}: give the datastore size and key dimension (--size, --dim); they are not in "
                         f"the file name (knn-transformers' dstore_<model>_<N>_<D>_keys.npy)")
    keys = _memmap(keys_file, keys_dtype, (size, dim), "keys")
    vals = _memmap(vals_file, vals_dtype, (size, 1), "vals")
    if link_keys and np.dtype(keys_dtype) != np.float16:
        raise ValueError(f"{keys_file}: keys of {keys_dtype} cannot be read in place (this layout's keys are float16); "
                         "import them without linking (a float16 copy)")
    out.mkdir(parents=True, exist_ok=True)
    ds = DatastoreLayout(out)
    with (contextlib.nullcontext(keys) if link_keys else create_npy(ds.path("keys", key=key_type), (size, dim),
                                                                      np.float16)) as k_out, \
         create_npy(ds.path("vals"), (size,), np.int32) as v_out:
        for s in tqdm(range(0, size, chunk), desc="import datastore", unit=" chunk", mininterval=10):
            e = min(size, s + chunk)
            if not link_keys:
                with np.errstate(over="ignore"):
                    k_out[s:e] = keys[s:e]
            if not np.isfinite(k_out[s:e]).all():
                raise ArtifactError(f"{keys_file}: non-finite keys (in fp16) in rows {s}..{e - 1}")
            v = np.asarray(vals[s:e, 0]).astype(np.int64)
            bad = (v < 0) | (v >= vocab_size if vocab_size else False)
            if bad.any():
                r = s + int(np.flatnonzero(bad)[0])
                raise ArtifactError(f"{vals_file}: val {int(v[r - s])} at row {r} is not a token id in [0, "
                                    f"{vocab_size or 'vocab'}) ({vals_dtype} vals of a vocabulary over its range "
                                    f"overflow: re-dump with int32 vals)")
            v_out[s:e] = v
            for a in ((v_out, keys, vals) if link_keys else (k_out, v_out, keys, vals)):
                release_rows(a, s, e)
    layout = "knn-transformers" if m else "urvashik/knnlm"
    ident = {n: v for n, v in (lm_identity or {}).items()
             if n in ("model", "revision", "checkpoint_sha256", "tokenizer_sha256", "vocab_sha256") and v is not None}
    manifest = {"split": "train", "N": size, "D": dim, "keys_dtype": "float16", "vals_dtype": "int32",
                "key_types": [key_type], "checkpoint_sha256": checkpoint_sha256, **ident, "source": "imported",
                **({"tokens_per_sample": int(tokens_per_sample), "context_window": int(context_window or 0),
                    "stream_offset": 1 if block_size is not None else 0} if tokens_per_sample else {}),
                **({"linked_keys": {key_type: {"path": str(keys_file.resolve())}}} if link_keys else {}),
                "imported_from": {"layout": layout, "keys": str(keys_file), "vals": str(vals_file),
                                  "keys_dtype": keys_dtype, "vals_dtype": vals_dtype,
                                  "keys_sha256": sha256_file(keys_file), "vals_sha256": sha256_file(vals_file)}}
    write_json(ds.path("manifest"), manifest)
    return manifest


def import_windows(tokens_per_sample: int | None, context_window: int | None, block_size: int | None,
                   stride: int | None, unknown: bool = False) -> tuple[int | None, int | None]:
    """(tokens_per_sample, context_window) of an imported store from fairseq-eval-lm's names (urvashik/knnlm) or
    knn-transformers' (block_size B, stride S: windows of B tokens whose last S are stored → B, B − S); (None, None)
    with `unknown`. Raises ValueError naming the options when both kinds or neither are given, or when they do not
    fit (stride outside 1..block_size, context_window outside 0..tokens_per_sample − 1)."""
    fairseq, hf = tokens_per_sample is not None or context_window is not None, block_size is not None or stride is not None
    if fairseq and hf:
        raise ValueError("give the windows once: --tokens-per-sample/--context-window (urvashik/knnlm) or "
                         "--block-size/--stride (knn-transformers), not both")
    if hf:
        if block_size is None or stride is None or not 1 <= stride <= block_size:
            raise ValueError(f"--block-size and --stride: expected 1 <= stride <= block size, found block size "
                             f"{block_size}, stride {stride} (knn-transformers' defaults: 1024 and 512)")
        return int(block_size), int(block_size - stride)
    if fairseq:
        c = int(context_window or 0)
        if tokens_per_sample is None or not 0 <= c < tokens_per_sample:
            raise ValueError(f"--tokens-per-sample and --context-window: expected 0 <= context window < tokens per "
                             f"sample, found {tokens_per_sample} and {context_window}")
        return int(tokens_per_sample), c
    if unknown:
        return None, None
    raise ValueError("the windows the keys were dumped in are needed to check them: --block-size and --stride "
                     "(knn-transformers; defaults 1024 and 512) or --tokens-per-sample and --context-window "
                     "(urvashik/knnlm; its README: 3072 and 2560); --unknown-windows imports without them")
