"""Batched step-by-step decoding of a base LM: the keys (att, ffn) and the next-token log-probs at the last position of
B sequences that grow by one token per step, as generation needs them (knnlm.experiments.generation).

step_decoder(lm) gives the fastest decoder the LM offers: FairseqLM.step_decoder (fairseq's incremental state: each
step feeds one token per sequence) or, for any LanguageModel, WindowDecoder (the whole sequence, at most the LM's
window, through lm.forward at every step). Both give the same states as the LM's forward pass over the same tokens.
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


class FairseqStepDecoder:
    """Decoding of a fairseq transformer_lm with its incremental state (the keys and values of earlier positions kept
    per layer): each step feeds the newest token of each sequence only. One decoder per batch of sequences: the
    sequences must grow by exactly one token per step, from the first step on. Raises ValueError when a step's
    sequences are not one token longer than the last step's, or reach beyond the LM's positions."""

    def __init__(self, model, max_positions: int):
        self.model = model
        self.max_positions = max_positions
        self.state: dict = {}
        self.length = 0
        self.dev = next(model.parameters()).device

    def _advance(self, tokens: torch.Tensor) -> None:
        t = tokens.shape[1]
        if t != self.length + 1:
            raise ValueError(f"incremental decoding: step {self.length + 1} got sequences of {t} tokens")
        if t > self.max_positions:
            raise ValueError(f"incremental decoding: {t} tokens exceed the LM's {self.max_positions} positions")
        self.length = t

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor) -> None:
        """step() without its outputs (a prompt's tokens): the incremental state only, no output layer."""
        self._advance(tokens)
        self.model.decoder.extract_features(tokens.to(self.dev), encoder_out=None, incremental_state=self.state)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, t] int64, the sequences so far (the start token first; t = 1 at the first step and one more at
        each step). Returns (att [B, D], ffn [B, D], log-probs [B, V]) float32 of the next token after each sequence
        (att: the input of the last layer's fc1, as knnlm.lm.fairseq.forward_states captures it)."""
        self._advance(tokens)
        dec = self.model.decoder
        captured = {}
        hook = dec.layers[-1].fc1.register_forward_hook(lambda m, inp, out: captured.__setitem__("att", inp[0]))
        try:
            x, extra = dec.extract_features(tokens.to(self.dev), encoder_out=None, incremental_state=self.state)
        finally:
            hook.remove()
        lp = self.model.get_normalized_probs((dec.output_layer(x), extra), log_probs=True)
        # fairseq's layers run time-first: the hook's input is [1, B, D]
        return captured["att"][-1].float(), x[:, -1].float(), lp[:, -1].float()


def step_decoder(lm):
    """A new decoder of base LM `lm` (a LanguageModel) for one batch of sequences: lm.step_decoder() when the backend
    has one (fairseq: incremental), else WindowDecoder(lm)."""
    make = getattr(lm, "step_decoder", None)
    return make() if make is not None else WindowDecoder(lm)
