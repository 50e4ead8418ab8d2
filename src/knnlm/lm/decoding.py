"""Batched step-by-step decoding of a base LM: the keys (att, ffn) and the next-token log-probs at the last position of
B sequences that grow by one token per step, as generation needs them (knnlm.experiments.generation).

step_decoder(lm) gives the fastest decoder the LM offers: FairseqLM.step_decoder (knnlm.lm.fairseq.FairseqStepDecoder,
fairseq's incremental state: each step feeds one token per sequence) or, for any LanguageModel, WindowDecoder (the
whole sequence, at most the LM's window, through lm.forward at every step). Both give the same states as the LM's
forward pass over the same tokens.
"""
from __future__ import annotations

import torch


class WindowDecoder:
    """Decoding through LanguageModel.forward: every step runs the last `tokens_per_sample` tokens of each sequence and
    keeps the last position (any backend; cost grows with the sequence's length)."""

    def __init__(self, lm):
        self.lm = lm

    def feed(self, tokens: torch.Tensor) -> None:
        """A step whose outputs are not needed (a prompt's tokens): nothing to do, every step reads the whole window."""

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, t] int64, the sequences so far (the start token first). Returns (att [B, D], ffn [B, D],
        log-probs [B, V]) float32 of the next token after each sequence."""
        att, ffn, out = self.lm.forward(tokens[:, -self.lm.tokens_per_sample:])
        return att[:, -1].float(), ffn[:, -1].float(), out[:, -1].float().log_softmax(-1)


def start(lm, prompts: torch.Tensor):
    """A decoder of `lm` (step_decoder) that has read the start token and prompts [B, P] int64 (one prompt per
    sequence, all of P tokens). Returns (decoder, sequences [B, P + 1] int64: the start token, then the prompt), ready
    for decoder.step(sequences)."""
    dec = step_decoder(lm)
    seq = torch.full((prompts.shape[0], 1), int(lm.start), dtype=torch.long)
    for i in range(prompts.shape[1]):  # the prompt: the decoder's state only
        dec.feed(seq)
        seq = torch.cat([seq, prompts[:, i:i + 1].long()], 1)
    return dec, seq


def step_decoder(lm):
    """A new decoder of base LM `lm` (a LanguageModel) for one batch of sequences: lm.step_decoder() when the backend
    has one (fairseq: incremental), else WindowDecoder(lm)."""
    make = getattr(lm, "step_decoder", None)
    return make() if make is not None else WindowDecoder(lm)
