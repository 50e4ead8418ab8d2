"""Base LMs behind one interface: the backends, the registry that picks one, and what every backend gives.

A base LM (config 'lms.<name>', its 'source') is run by one backend (BACKENDS, keyed by source):
  train, fairseq -- knnlm.lm.fairseq: a fairseq transformer_lm (trained by the run, or a checkpoint), over the run's
                    BPE and binarised data (data-bin);
  hf             -- knnlm.lm.hf: a Hugging Face causal LM and its own tokenizer.
The rules ask the registry which inputs a job of an LM needs (Backend: the weights, the tokens), and a job asks it
which backend its inputs belong to (backend_of); neither switches on the backend itself.

Every backend module gives the same functions:
  lm_pass(files, split, cfg, lm) -> LMPass   one pass over a split (knnlm.datastore.dump writes keys/vals/queries);
  output_matrix(files) -> W_sm [V, D] float32 torch tensor (the output projection, Sec. 4);
  token_strings(files, vocab) -> (strings [V], special [V] bool) of the token ids;
and a class for the Python API (knnlm.api) that follows LanguageModel.

Key types (Xu et al. 2023, Sec. 3): att = the input of the last layer's feed-forward block after its LayerNorm
(knn-transformers' and urvashik/knnlm's `last_ffn_input`); ffn = the final decoder output that feeds the output
projection (`last_ffn_output` after the final norm). Importing this package imports no torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import RUN_TOKEN_SOURCES


class LanguageModel(Protocol):
    """What the Python API needs of a base LM (knnlm.lm.fairseq.FairseqLM, knnlm.lm.hf.HuggingFaceLM).

    start: the token id fed before a stream's first token; vocab_size: V; tokens_per_sample: L, the window;
    dim: D, the key dimension (att and ffn); identity: what names the weights (recorded with every score);
    forward(x [B, L] int64 tensor) -> (att [B, L, D], ffn [B, L, D], log-probs or logits [B, L, V]);
    encode(lines) -> [n] int64 ids of lines (each with its end of line); encode_lines(lines) -> {'ids' [n] int64,
    'line' [n] int32 line of each token, 'words' [n] int16 WikiText words each token starts} (the split's token
    lines, as the pipeline's documents read them); encode_prompt(text) -> ids without a final end of line;
    decode(ids) -> text.
    """

    start: int
    vocab_size: int
    tokens_per_sample: int
    dim: int
    identity: dict

    def forward(self, x: Any) -> tuple[Any, Any, Any]: ...

    def encode(self, lines: list[str]) -> Any: ...

    def encode_lines(self, lines: list[str]) -> dict: ...

    def encode_prompt(self, text: str) -> Any: ...

    def decode(self, ids) -> str: ...


@dataclass(frozen=True)
class Backend:
    """One way to run a base LM, as the rules and the jobs see it.

    module: the module that implements it (lm_pass, output_matrix, token_strings); weights_input: the named rule input
    that holds the weights ('checkpoint' or 'model_card'); weights_artifact: the layout artifact of those weights
    (None: the checkpoint file that config 'lms.<name>.path' names); run_tokens: True when the LM reads the run's BPE
    tokens (input 'data_bin'), False when it tokenises the text itself (input 'text', and its 'model_card' names
    its tokenizer); trained: the run trains the LM (it has a training record)."""

    name: str
    module: str
    weights_input: str
    weights_artifact: str | None
    run_tokens: bool
    trained: bool = False

    @property
    def tokens_input(self) -> str:
        """The named rule input that names the LM's token ids: 'data_bin' (fairseq dictionary) or its weights'."""
        return "data_bin" if self.run_tokens else self.weights_input

    def impl(self):
        """The backend's module (imported on first use: it imports torch)."""
        return importlib.import_module(self.module)


BACKENDS = {
    "train": Backend("fairseq", "knnlm.lm.fairseq", "checkpoint", "checkpoint", run_tokens="train" in RUN_TOKEN_SOURCES,
                     trained=True),
    "fairseq": Backend("fairseq", "knnlm.lm.fairseq", "checkpoint", None, run_tokens="fairseq" in RUN_TOKEN_SOURCES),
    "hf": Backend("hf", "knnlm.lm.hf", "model_card", "model_card", run_tokens="hf" in RUN_TOKEN_SOURCES),
}


def backend(source: str) -> Backend:
    """The backend of config 'lms.<name>.source' `source`; ValueError naming the sources otherwise."""
    if source not in BACKENDS:
        raise ValueError(f"config key 'lms.<name>.source': expected one of {sorted(BACKENDS)}, found {source!r}")
    return BACKENDS[source]


def backend_of(files: dict) -> Backend:
    """The backend whose weights a job's named inputs hold (`files`: {name: path}, a rule's `input:`, empty inputs
    ignored). ValueError naming the inputs when none is there."""
    for b in BACKENDS.values():
        if files.get(b.weights_input):
            return b
    for b in BACKENDS.values():
        if files.get(b.tokens_input):
            return b
    raise ValueError(f"needs the weights of a base LM as input {sorted({b.weights_input for b in BACKENDS.values()})} "
                     f"or its tokens as {sorted({b.tokens_input for b in BACKENDS.values()})}; "
                     f"the rule gives {sorted(files)}")


class LMPass:
    """One base LM, ready to run over a split: `n(split)` targets, key dim `d`, `states(split, with_log_probs)`
    (per-batch dicts as iter_states), and `identity` (recorded in every manifest: checkpoint_sha256,
    data_sha256 per split, tokens_per_sample, source); `tokens(split)` (a Hugging Face LM's own tokenisation,
    knnlm.lm.hf.tokenize_split; None for fairseq, whose tokens are the run's BPE). Built by a backend's lm_pass."""

    def __init__(self, n, d, states, identity, tokens=None):
        self.n, self.d, self.states, self.identity, self.tokens = n, d, states, identity, tokens


def text_lines(text: str | list[str]) -> list[str]:
    """Lines of `text` (a string, or a list of lines), each ending with a newline (as a split file's lines)."""
    if isinstance(text, str):
        lines = text.splitlines(keepends=True)
    else:
        lines = [str(x) for x in text]
    return [x if x.endswith("\n") else x + "\n" for x in lines]
