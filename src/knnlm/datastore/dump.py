"""One pass of the frozen LM over a split: datastore keys + vals (train), or queries + LM log-probs (valid/test).

Key types (Xu et al. 2023, Sec. 3):
  att -- the input of the last layer's feed-forward block after its LayerNorm = input of layers[-1].fc1
  ffn -- the final decoder output (after the final LayerNorm) that feeds the output projection
Context: tokens are scored exactly as `fairseq-eval-lm --context-window C` does: the split is cut into
blocks of (tokens_per_sample − C) tokens, and each block is fed with up to C previous tokens of left
context (fairseq's LMContextWindowDataset), so every key/score has ≥ C tokens of context except in the
split's first block. One key per target token: key i is the state that predicts vals[i].
"""
from __future__ import annotations

import logging

from pathlib import Path

import numpy as np

from ..io import (ArtifactError, check_manifest, create_npy, open_npy, read_checked_json, release_rows, save_npy,
                  write_json)

log = logging.getLogger(__name__)
KEY_TYPES = ("att", "ffn")


def dump_datastore(lm, key_paths: dict, vals_path, manifest_path, threads: int, extra: dict | None = None) -> dict:
    """Dump train keys for both key types and vals in one pass of `lm` (a knnlm.lm.LMPass: the datastore takes any
    backend's pass); returns the manifest.

    Writes key_paths['att'], key_paths['ffn']: [N, D] float16 .npy; vals_path: [N] int32 (next-token ids);
    manifest_path (N, D, dtypes, key types, the LM's identity: checkpoint sha256, data sha256, context settings;
    `extra`, e.g. the corpus).
    Atomic per file; the manifest is written last. Raises ArtifactError if the pass yields another count than N, or a
    key that is not finite in fp16 (the exact-distance kernels rely on finite keys).
    """
    import torch  # here, not at the top: the readers below serve jobs that never load torch

    torch.set_num_threads(threads)
    n, d = lm.n("train"), lm.d
    with create_npy(key_paths["att"], (n, d), np.float16) as k_att, \
         create_npy(key_paths["ffn"], (n, d), np.float16) as k_ffn, \
         create_npy(vals_path, (n,), np.int32) as vals:
        ptr = 0
        for b in lm.states("train", False):
            m = b["target"].shape[0]
            for name, arr in (("att", k_att), ("ffn", k_ffn)):
                with np.errstate(over="ignore"):  # an overflow is reported below, with the file and rows
                    arr[ptr:ptr + m] = b[name].numpy()
                if not np.isfinite(arr[ptr:ptr + m]).all():  # fp16 overflow (|h| > 65504) or a NaN state
                    raise ArtifactError(f"{key_paths[name]}: non-finite {name} keys in rows {ptr}..{ptr + m - 1} "
                                        f"(a hidden state outside fp16's range ±65504, or NaN)")
            vals[ptr:ptr + m] = b["target"].numpy()
            for arr in (k_att, k_ffn, vals):  # RSS flat in the datastore's size
                release_rows(arr, ptr, ptr + m)
            ptr += m
        if ptr != n:
            raise ArtifactError(f"dumped {ptr} keys, expected {n} train targets")
    manifest = {"split": "train", "N": n, "D": d, "keys_dtype": "float16", "vals_dtype": "int32",
                "key_types": list(KEY_TYPES), **lm.identity("train"), **(extra or {})}
    write_json(manifest_path, manifest)
    return manifest


def dump_queries(lm, split: str, out: dict, threads: int) -> dict:
    """Dump a valid/test split once in one pass of `lm` (a knnlm.lm.LMPass); returns the manifest. out: paths of
    'targets' ([T] int32), 'lm_logprobs' ([T] float32, natural log p_LM(target)), 'queries_att' / 'queries_ffn' ([T, D]
    float32) and 'manifest' (with the pass's 'seconds' and 'machine', knnlm.io.machine)."""
    import time

    from ..io import machine

    import torch  # here, not at the top: the readers below serve jobs that never load torch

    torch.set_num_threads(threads)
    t0 = time.time()
    parts: dict[str, list] = {"att": [], "ffn": [], "target": [], "lp": []}
    for b in lm.states(split, True):
        for k in parts:
            parts[k].append(b[k].numpy())
    arrs = {k: np.concatenate(v) for k, v in parts.items()}
    save_npy(out["targets"], arrs["target"].astype(np.int32))
    save_npy(out["lm_logprobs"], arrs["lp"].astype(np.float32))
    for kt in KEY_TYPES:
        save_npy(out[f"queries_{kt}"], arrs[kt].astype(np.float32))
    t = int(arrs["target"].shape[0])
    manifest = {"split": split, "T": t, "D": int(arrs["att"].shape[1]), **lm.identity(split),
                "lm_nll_sum": float(-arrs["lp"].astype(np.float64).sum()),
                "seconds": time.time() - t0, "machine": machine(threads)}  # the LM's pass, for the speed table
    write_json(out["manifest"], manifest)
    return manifest


def open_datastore(manifest_path, vals_path, keys_path=None, key_type: str | None = None,
                   checkpoint_sha256: str | None = None):
    """Open a dumped datastore read-only: returns (keys [N, D] float16 memmap or None, vals [N] int32 memmap, manifest).

    keys_path: the keys file of key type `key_type` (None: vals only). Raises ArtifactError naming the file if
    one is missing or truncated, shapes disagree with the manifest, the key type is not in the datastore, or
    it was made from another checkpoint than `checkpoint_sha256`.
    """
    man = read_checked_json(manifest_path, "datastore_manifest")
    if key_type is not None and key_type not in man["key_types"]:
        raise ArtifactError(f"{manifest_path}: key type {key_type!r} not in datastore (has {man['key_types']})")
    if checkpoint_sha256 is not None:
        check_manifest(man, {"checkpoint_sha256": checkpoint_sha256}, f"datastore {manifest_path}")
    linked = (man.get("linked_keys") or {}).get(key_type) if keys_path is not None else None
    if linked and not Path(keys_path).exists():  # an imported store's keys read in place (import_memmap link_keys)
        raw = Path(linked["path"])
        want = man["N"] * man["D"] * 2
        if not raw.is_file() or raw.stat().st_size != want:
            raise ArtifactError(f"{manifest_path}: its {key_type} keys are linked to {raw}, which "
                                + ("is missing" if not raw.is_file() else f"has {raw.stat().st_size} bytes, not {want}")
                                + " (moved or replaced?); import the store again")
        keys = np.memmap(raw, dtype=np.float16, mode="r", shape=(man["N"], man["D"]))
    else:
        keys = None if keys_path is None else open_npy(keys_path, (man["N"], man["D"]), np.float16)
    vals = open_npy(vals_path, (man["N"],), np.int32)
    return keys, vals, man


def open_queries(manifest_path, targets_path, lm_logprobs_path, queries_path=None,
                 checkpoint_sha256: str | None = None) -> dict:
    """Open a dumped valid/test split: dict(targets [T] int32, lm_logprobs [T] float32, queries [T, D] float32
    memmap or None, manifest). Checks as open_datastore."""
    man = read_checked_json(manifest_path, "queries_manifest")
    if checkpoint_sha256 is not None:
        check_manifest(man, {"checkpoint_sha256": checkpoint_sha256}, f"queries {manifest_path}")
    t, d = man["T"], man["D"]
    return {"targets": open_npy(targets_path, (t,), np.int32),
            "lm_logprobs": open_npy(lm_logprobs_path, (t,), np.float32),
            "queries": None if queries_path is None else open_npy(queries_path, (t, d), np.float32), "manifest": man}
