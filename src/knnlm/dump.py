"""One pass of the frozen LM over a split: datastore keys + vals (train), or queries + LM log-probs (valid/test).

Key types (Xu et al. 2023, Sec. 3; DEVELOPERS.md):
  att -- the input of the last layer's feed-forward block after its LayerNorm = input of layers[-1].fc1
  ffn -- the final decoder output (after the final LayerNorm) that feeds the output projection
Context: tokens are scored exactly as `fairseq-eval-lm --context-window C` does: the split is cut into
blocks of (tokens_per_sample − C) tokens, and each block is fed with up to C previous tokens of left
context (fairseq's LMContextWindowDataset), so every key/score has ≥ C tokens of context except in the
split's first block. One key per target token: key i is the state that predicts vals[i].
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm import tqdm

from .io import (ArtifactError, check_manifest, create_npy, open_npy, read_json, release_rows, save_npy, sha256_file,
                 write_json)

log = logging.getLogger(__name__)
KEY_TYPES = ("att", "ffn")


def load_lm(checkpoint: str | Path, data_bin: str | Path):
    """Load a fairseq LM checkpoint in eval mode; returns (model, cfg). data_bin holds dict.txt."""
    from fairseq import checkpoint_utils

    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data_bin)})
    model = models[0]
    model.prepare_for_inference_(cfg)
    model.eval()
    if torch.cuda.is_available():  # fp32 on the GPU too: keys are stored fp16, scores must match eval-lm
        model.cuda()
    return model, cfg


def iter_split(model, cfg, data_bin: str | Path, split: str, context_window: int, max_tokens: int):
    """fairseq-eval-lm's batch iterator over `split` (LMContextWindowDataset). Returns (iterator, n_targets, pad)."""
    from fairseq import tasks, utils

    tcfg = copy.deepcopy(cfg.task)
    tcfg.data = str(data_bin)
    tcfg.tokens_per_sample = cfg.task.tokens_per_sample - context_window
    task = tasks.setup_task(tcfg)
    task.load_dataset(split)
    ds = task.dataset(split)
    itr = task.eval_lm_dataloader(
        dataset=ds, max_tokens=max_tokens, batch_size=None,
        max_positions=utils.resolve_max_positions(model.max_positions()),
        num_shards=1, shard_id=0, num_workers=0, data_buffer_size=0, context_window=context_window)
    return itr, int(np.sum(ds.sizes)), task.source_dictionary.pad()


@torch.no_grad()
def forward_states(model, src_tokens: torch.Tensor, with_log_probs: bool, targets: torch.Tensor | None = None,
                   keep: torch.Tensor | None = None):
    """Run the decoder once; return {'att': [B, L, D], 'ffn': [B, L, D]} (+ 'lp': [B, L] log p(target), fp32; with
    `keep` [B, L] bool, 'lp' [n] of the kept positions only, in row-major order: the output layer and its softmax over
    V, most of an eval pass's cost at small D, then run for the scored positions and not for a window's context).

    att is captured by a forward hook on layers[-1].fc1 (its input, after the pre-FFN LayerNorm).
    """
    captured = {}
    hook = model.decoder.layers[-1].fc1.register_forward_hook(lambda m, inp, out: captured.__setitem__("att", inp[0]))
    try:
        x, extra = model.decoder.extract_features(src_tokens, encoder_out=None)
    finally:
        hook.remove()
    att = captured["att"].transpose(0, 1)  # fairseq's layers run time-first: [L, B, D] -> [B, L, D]
    out = {"att": att, "ffn": x}
    if with_log_probs:
        h, tg = (x, targets) if keep is None else (x[keep].unsqueeze(0), targets[keep].unsqueeze(0))
        logits = model.decoder.output_layer(h)
        lprobs = model.get_normalized_probs((logits, extra), log_probs=True).float()
        lp = lprobs.gather(-1, tg.unsqueeze(-1)).squeeze(-1)
        out["lp"] = lp if keep is None else lp[0]
    return out


def iter_states(model, cfg, data_bin, split, context_window, max_tokens, with_log_probs) -> Iterator[dict]:
    """Yield per-batch dicts of kept positions in stream order: 'att', 'ffn' [n, D] fp32, 'target' [n] int64, ('lp' [n])."""
    itr, n_targets, pad = iter_split(model, cfg, data_bin, split, context_window, max_tokens)
    bar = tqdm(total=n_targets, desc=f"dump {split}", unit=" tok", mininterval=10)
    dev = next(model.parameters()).device
    for sample in itr:
        if "net_input" not in sample:
            continue
        src, tgt = sample["net_input"]["src_tokens"].to(dev), sample["target"].to(dev)
        starts = sample.get("start_indices", [0] * src.shape[0])
        pos = torch.arange(tgt.shape[1], device=dev).unsqueeze(0)
        keep = (tgt != pad) & (pos >= torch.as_tensor(starts, device=dev).unsqueeze(1))
        st = forward_states(model, src, with_log_probs, tgt, keep)  # 'lp' of the kept positions only
        batch = {k: (v if k == "lp" else v[keep]).cpu() for k, v in st.items()}  # row-major: positions in order
        batch["target"] = tgt[keep].cpu()
        bar.update(int(keep.sum()))
        yield batch
    bar.close()


@torch.no_grad()
def window_states(forward, stream: np.ndarray, tokens_per_sample: int, context: int, max_tokens: int,
                  with_log_probs: bool, desc: str = "dump", progress: bool = True) -> Iterator[dict]:
    """One pass of an LM over a token stream in fairseq-eval-lm's sliding windows (knnlm.hf.windows: blocks of
    L − C targets, each fed with up to C earlier tokens). Yields per-batch dicts in target order: 'att', 'ffn'
    [m, D] fp32, 'target' [m] int64, ('lp' [m] fp32 natural-log p(target)).

    forward(x [B, L] int64 tensor) -> (att [B, L, D], ffn [B, L, D], logits [B, L, V]); stream: [n + 1] int64, the
    start token then the n targets; consecutive windows of equal length are batched up to max_tokens tokens.
    """
    from .hf import windows

    wins = windows(len(stream) - 1, tokens_per_sample, context)
    per_batch = max(1, max_tokens // tokens_per_sample)
    bar = tqdm(total=len(stream) - 1, desc=desc, unit=" tok", mininterval=10, disable=not progress)
    dev = None
    try:
        i = 0
        while i < len(wins):  # batch consecutive windows of equal input length
            j = i + 1
            while j < len(wins) and j - i < per_batch and wins[j][2] - wins[j][0] == wins[i][2] - wins[i][0]:
                j += 1
            batch = wins[i:j]
            x = torch.as_tensor(np.stack([stream[a:e] for a, _, e in batch]))
            att, ffn, logits = forward(x)
            dev = att.device
            sl = [slice(s - a, e - a) for a, s, e in batch]
            tgt = torch.as_tensor(np.concatenate([stream[s + 1:e + 1] for _, s, e in batch]), device=dev)
            out = {"att": torch.cat([att[r, s_] for r, s_ in enumerate(sl)]).float().cpu(),
                   "ffn": torch.cat([ffn[r, s_] for r, s_ in enumerate(sl)]).float().cpu(),
                   "target": tgt.cpu()}
            if with_log_probs:
                lg = torch.cat([logits[r, s_] for r, s_ in enumerate(sl)]).float()
                out["lp"] = lg.log_softmax(-1).gather(-1, tgt[:, None]).squeeze(-1).cpu()
            bar.update(len(tgt))
            yield out
            i = j
    finally:
        bar.close()


def fairseq_forward(model):
    """forward(x [B, L] int64 tensor) -> (att, ffn [B, L, D], log-probs [B, L, V]) of a fairseq transformer_lm, for
    window_states (the keys as forward_states captures them; the log-probs through the model's own normalisation,
    a plain or an adaptive softmax)."""
    dev = next(model.parameters()).device

    def forward(x: torch.Tensor):
        st = forward_states(model, x.to(dev), False)
        # normalised log-probs (log_softmax leaves them unchanged): an adaptive softmax has no plain logits
        lp = model.get_normalized_probs((model.decoder.output_layer(st["ffn"]), None), log_probs=True)
        return st["att"], st["ffn"], lp

    return forward


class LMPass:
    """One base LM, ready to run over a split: `n(split)` targets, key dim `d`, `states(split, with_log_probs)`
    (per-batch dicts as iter_states), and `identity` (recorded in every manifest: checkpoint_sha256,
    data_sha256 per split, tokens_per_sample, source); `tokens(split)` (a Hugging Face LM's own tokenisation,
    knnlm.hf.tokenize_split; None for fairseq, whose tokens are the run's BPE). Built by fairseq_pass or hf_pass."""

    def __init__(self, n, d, states, identity, tokens=None):
        self.n, self.d, self.states, self.identity, self.tokens = n, d, states, identity, tokens


def fairseq_pass(checkpoint, data_bin, context_window: int, max_tokens: int, key: str | None = None,
                 adaptive_softmax: bool | None = None) -> LMPass:
    """A fairseq transformer_lm checkpoint over the run's binarised data (dict.txt must be the model's). key: the
    config key that names the checkpoint (e.g. 'lms.base.path'): the checkpoint is then checked first and any failure
    to load it raises ArtifactError naming that key and the file (knnlm.pretrained.load_fairseq_lm).
    adaptive_softmax: what the config declares (config 'lms.<lm>.adaptive_softmax'); ArtifactError naming the key
    when the checkpoint disagrees (None: not checked). Log-probs come from the model's own normalisation either way."""
    if key:
        from .pretrained import load_fairseq_lm

        model, cfg = load_fairseq_lm(checkpoint, data_bin, key)
    else:
        model, cfg = load_lm(checkpoint, data_bin)
    has = getattr(model.decoder, "adaptive_softmax", None) is not None
    if adaptive_softmax is not None and has != adaptive_softmax:
        raise ArtifactError(f"config key '{key or 'lms.<lm>'}.adaptive_softmax': {checkpoint} "
                            f"{'has' if has else 'has no'} adaptive softmax, the config says {adaptive_softmax}")
    d = model.decoder.embed_dim if not hasattr(model.decoder, "output_embed_dim") else model.decoder.output_embed_dim
    d_att = model.decoder.layers[-1].fc1.in_features
    if d_att != d:
        raise ArtifactError(f"{checkpoint}: att keys have {d_att} dims, ffn keys {d}; both must be equal")
    sha = sha256_file(checkpoint)
    return LMPass(
        n=lambda split: iter_split(model, cfg, data_bin, split, context_window, max_tokens)[1], d=d,
        states=lambda split, lp: iter_states(model, cfg, data_bin, split, context_window, max_tokens, lp),
        identity=lambda split: {"source": "fairseq", "checkpoint_sha256": sha,
                                "data_sha256": sha256_file(Path(data_bin) / f"{split}.bin"),
                                "context_window": context_window, "tokens_per_sample": int(cfg.task.tokens_per_sample)})


def hf_pass(card: dict, texts: dict, context_window: int, max_tokens: int, tokens_per_sample: int) -> LMPass:
    """A Hugging Face causal LM (knnlm.hf; card: knnlm.hf.model_card) over the split files texts[split]."""
    from . import hf

    model, tok = hf.load_hf(card["path"], card["dtype"], card.get("revision"))
    toks: dict[str, dict] = {}

    def tokens(split):
        if split not in toks:
            toks[split] = hf.tokenize_split(tok, texts[split])
        return toks[split]

    def states(split, lp):
        stream = np.concatenate([[hf.start_token(tok)], tokens(split)["ids"]])
        return hf.iter_states(model, stream, tokens_per_sample, context_window, max_tokens, lp, desc=f"dump {split}")

    return LMPass(n=lambda split: len(tokens(split)["ids"]), d=card["hidden_size"], states=states, tokens=tokens,
                  identity=lambda split: {"source": "hf", "model": card["path"], "checkpoint_sha256": card["checkpoint_sha256"],
                                          "tokenizer_sha256": card["tokenizer_sha256"],
                                          "data_sha256": sha256_file(texts[split]), "context_window": context_window,
                                          "tokens_per_sample": tokens_per_sample})


def dump_datastore(lm: LMPass, key_paths: dict, vals_path, manifest_path, threads: int, extra: dict | None = None) -> dict:
    """Dump train keys for both key types and vals in one pass of `lm`; returns the manifest.

    Writes key_paths['att'], key_paths['ffn']: [N, D] float16 .npy; vals_path: [N] int32 (next-token ids);
    manifest_path (N, D, dtypes, key types, the LM's identity: checkpoint sha256, data sha256, context settings;
    `extra`, e.g. the corpus).
    Atomic per file; the manifest is written last. Raises ArtifactError if the pass yields another count than N, or a
    key that is not finite in fp16 (the exact-distance kernels rely on finite keys).
    """
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


def dump_queries(lm: LMPass, split: str, out: dict, threads: int) -> dict:
    """Dump a valid/test split once; returns the manifest. out: paths of 'targets' ([T] int32), 'lm_logprobs'
    ([T] float32, natural log p_LM(target)), 'queries_att' / 'queries_ffn' ([T, D] float32) and 'manifest' (with the
    pass's 'seconds' and 'machine', knnlm.io.machine)."""
    import time

    from .io import machine

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
    man = read_json(manifest_path)
    if key_type is not None and key_type not in man["key_types"]:
        raise ArtifactError(f"{manifest_path}: key type {key_type!r} not in datastore (has {man['key_types']})")
    if checkpoint_sha256 is not None:
        check_manifest(man, {"checkpoint_sha256": checkpoint_sha256}, f"datastore {manifest_path}")
    keys = None if keys_path is None else open_npy(keys_path, (man["N"], man["D"]), np.float16)
    vals = open_npy(vals_path, (man["N"],), np.int32)
    return keys, vals, man


def open_queries(manifest_path, targets_path, lm_logprobs_path, queries_path=None,
                 checkpoint_sha256: str | None = None) -> dict:
    """Open a dumped valid/test split: dict(targets [T] int32, lm_logprobs [T] float32, queries [T, D] float32
    memmap or None, manifest). Checks as open_datastore."""
    man = read_json(manifest_path)
    if checkpoint_sha256 is not None:
        check_manifest(man, {"checkpoint_sha256": checkpoint_sha256}, f"queries {manifest_path}")
    t, d = man["T"], man["D"]
    return {"targets": open_npy(targets_path, (t,), np.int32),
            "lm_logprobs": open_npy(lm_logprobs_path, (t,), np.float32),
            "queries": None if queries_path is None else open_npy(queries_path, (t, d), np.float32), "manifest": man}
