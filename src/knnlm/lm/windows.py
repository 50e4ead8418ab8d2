"""The sliding windows every base LM is scored and dumped in (fairseq-eval-lm --context-window C semantics).

A split is one token stream, cut into blocks of L − C targets (L: the LM's tokens_per_sample), each fed with up to
C earlier tokens of left context, so every key and every score has ≥ C tokens of context except in the split's
first block. The fairseq backend gets the same windows from fairseq's own LMContextWindowDataset
(knnlm.lm.fairseq.iter_split); the Hugging Face backend and the Python API use window_states.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from tqdm import tqdm


def windows(n: int, tokens_per_sample: int, context: int) -> list[tuple[int, int, int]]:
    """Sliding windows over a stream of n targets (fairseq-eval-lm --context-window semantics): [(a, s, e)]
    where targets s..e-1 (stream positions s+1..e after the start token) are scored from input stream[a:e],
    e − s ≤ L − C, a = max(0, s − C). Raises ValueError if context ≥ tokens_per_sample."""
    if context >= tokens_per_sample:
        raise ValueError(f"context window {context} must be < tokens_per_sample {tokens_per_sample}")
    b = tokens_per_sample - context
    return [(max(0, s - context), s, min(n, s + b)) for s in range(0, n, b)]


@torch.no_grad()
def window_states(forward, stream: np.ndarray, tokens_per_sample: int, context: int, max_tokens: int,
                  with_log_probs: bool, desc: str = "dump", progress: bool = True) -> Iterator[dict]:
    """One pass of an LM over a token stream in fairseq-eval-lm's sliding windows (windows: blocks of
    L − C targets, each fed with up to C earlier tokens). Yields per-batch dicts in target order: 'att', 'ffn'
    [m, D] fp32, 'target' [m] int64, ('lp' [m] fp32 natural-log p(target)).

    forward(x [B, L] int64 tensor) -> (att [B, L, D], ffn [B, L, D], logits [B, L, V]); stream: [n + 1] int64, the
    start token then the n targets; consecutive windows of equal length are batched up to max_tokens tokens.
    """
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
