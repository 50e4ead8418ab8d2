"""Hugging Face causal LMs as base LMs (Xu et al. 2023, App. A / Table 4 uses the GPT-2 family).

Keys are captured by forward hooks, found by the model's structure rather than a list of known classes:
  att -- the input of the last decoder block's MLP, i.e. after its pre-MLP norm (GPT-2 `ln_2`, Llama
         `post_attention_layernorm`); for blocks without an MLP submodule (OPT) the input of their `fc1`;
  ffn -- the input of the output projection (`model.get_output_embeddings()`), the final hidden state after
         the final norm.
Tokens: the model's own tokenizer on the split's text (lines kept with their newlines), tokenised in chunks
of `CHUNK_LINES` lines (a chunk boundary always falls between lines). The stream is preceded by the
tokenizer's BOS (else EOS) token, so every token of the split is a target, as in the fairseq path.
Evaluation: the same sliding windows as fairseq-eval-lm --context-window C (knnlm.lm.windows): blocks of
L − C targets, each fed with up to C earlier tokens, L = the LM's `tokens_per_sample`.
Words: every whitespace word and every line's <eos> (the WikiText count, knnlm.data.count_words) is
attributed to the token holding its first character (the newline for <eos>), so the words of any set of
targets add up exactly to the split's word count (checked when dumping).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn

from ..io import ArtifactError, file_stat, read_json, sha256_file
from . import LMPass
from .windows import window_states

log = logging.getLogger(__name__)
CHUNK_LINES = 2000
MLP_NAME = re.compile(r"mlp|feed_?forward|ffn", re.IGNORECASE)
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")
# the attribute a kNN-LM sets on a model whose forward it replaced (knnlm.api.KNNLM.wrap): the model's own forward.
# The LM's own passes (key_capture) call it, so a wrapped model's kNN distribution is never mixed in twice.
OWN_FORWARD = "_knnlm_own_forward"


def own_forward(model):
    """The model's own forward pass: `model` itself, or the forward a kNN-LM's wrap() replaced (OWN_FORWARD)."""
    return model.__dict__.get(OWN_FORWARD) or model


HF_EXTRA = "the Hugging Face libraries are not installed: `pip install \".[hf]\"` (transformers, tokenizers, " \
           "safetensors, huggingface-hub; scripts/setup.sh installs their tested pins)"


def transformers_module():
    """The transformers package, imported on first use (the Hugging Face stack is the optional extra 'hf'; the API
    and fairseq LMs need none of it). Raises ImportError naming the extra to install when it is missing."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"{HF_EXTRA} ({e})") from None
    return transformers


def load_hf(path: str, dtype: str = "float32", revision: str | None = None):
    """(model in eval mode, fast tokenizer) of a local directory or Hub id (Hub ids need internet).

    dtype: 'float32' | 'bfloat16' | 'float16' (config key 'lms.<name>.dtype'). Raises ArtifactError naming the
    model when its tokenizer is not a fast tokenizer (character offsets are needed to count words).
    """
    tf = transformers_module()
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), revision=revision)
    model.eval()
    if torch.cuda.is_available():
        model.cuda()
    tok = tf.AutoTokenizer.from_pretrained(path, revision=revision)
    if not getattr(tok, "is_fast", False):
        raise ArtifactError(f"Hugging Face model {path}: tokenizer {type(tok).__name__} is not a fast tokenizer; "
                            "character offsets are needed to count words")
    return model, tok


def find_key_modules(model) -> tuple[nn.Module, nn.Module]:
    """(the module whose input is the att key, the output projection whose input is the ffn key).

    The decoder blocks are the longest nn.ModuleList of the model with one entry per hidden layer
    (config.num_hidden_layers); in its last block the att module is the one child named like an MLP
    (mlp, feed_forward, ffn), or else its `fc1`. Raises ValueError naming the model class and the last
    block's children when the structure is not found.
    """
    cls = type(model).__name__
    out = model.get_output_embeddings()
    if not isinstance(out, nn.Linear):
        raise ValueError(f"{cls}: output embeddings {type(out).__name__} are not an nn.Linear; cannot hook the ffn key")
    n_layers = getattr(model.config, "num_hidden_layers", None)
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and (n_layers is None or len(m) == n_layers)]
    if not lists:
        raise ValueError(f"{cls}: no nn.ModuleList of {n_layers} decoder blocks found")
    last = max(lists, key=len)[-1]
    children = dict(last.named_children())
    mlps = [m for n, m in children.items() if MLP_NAME.search(n)]
    if len(mlps) == 1:
        return mlps[0], out
    if "fc1" in children:
        return children["fc1"], out
    raise ValueError(f"{cls}: cannot find the MLP of the last decoder block {type(last).__name__} (children: "
                     f"{sorted(children)}); expected one child named like mlp/feed_forward/ffn, or fc1")


def start_token(tok) -> int:
    """The token fed before the split's first token: BOS, else EOS. ValueError if the tokenizer has neither."""
    for t in (tok.bos_token_id, tok.eos_token_id):
        if t is not None:
            return int(t)
    raise ValueError(f"tokenizer {type(tok).__name__} has no BOS or EOS token to start the stream with")


def _word_positions(text: str) -> np.ndarray:
    """Character offsets of the first character of every WikiText word of `text`: whitespace words and one
    <eos> per line (the newline; a final line without one gets len(text) - 1)."""
    pos = [m.start() for m in re.finditer(r"\S+", text)] + [m.start() for m in re.finditer("\n", text)]
    if text and not text.endswith("\n"):
        pos.append(len(text) - 1)
    return np.sort(np.asarray(pos, dtype=np.int64))


def tokenize_split(tok, text_path: str | Path, chunk_lines: int = CHUNK_LINES) -> dict[str, np.ndarray]:
    """Tokenise a split file with the model's tokenizer: {'ids' [n] int64, 'words' [n] int16 words starting in
    each token, 'line' [n] int32 line of each token's first character}. Raises ArtifactError naming the file if a
    word cannot be attributed to a token (empty tokenisation of non-empty text)."""
    with open(text_path, encoding="utf-8") as f:
        lines = f.readlines()
    return tokenize_lines(tok, lines, str(text_path), chunk_lines)


def tokenize_lines(tok, lines: list[str], source: str = "<text>", chunk_lines: int = CHUNK_LINES) -> dict[str, np.ndarray]:
    """tokenize_split of lines of text (each with its newline, as file.readlines() gives them); `source` names
    them in errors."""
    ids, words, line_of = [], [], []
    for c in range(0, len(lines), chunk_lines):
        part = lines[c:c + chunk_lines]
        text = "".join(part)
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
        if not enc["input_ids"]:
            continue
        off = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        ends = np.maximum.accumulate(off[:, 1])
        wp = _word_positions(text)
        owner = np.minimum(np.searchsorted(ends, wp, side="right"), len(ends) - 1)
        words.append(np.bincount(owner, minlength=len(ends)).astype(np.int16))
        line_starts = np.cumsum([0] + [len(x) for x in part[:-1]])
        line_of.append((c + np.searchsorted(line_starts, off[:, 0], side="right") - 1).astype(np.int32))
        ids.append(np.asarray(enc["input_ids"], dtype=np.int64))
    if not ids:
        raise ArtifactError(f"{source}: the tokenizer produced no tokens")
    return {"ids": np.concatenate(ids), "words": np.concatenate(words), "line": np.concatenate(line_of)}


def iter_states(model, stream: np.ndarray, tokens_per_sample: int, context: int, max_tokens: int,
                with_log_probs: bool, desc: str = "dump") -> Iterator[dict]:
    """Yield per-batch dicts in target order: 'att', 'ffn' [m, D] fp32, 'target' [m] int64, ('lp' [m] fp32
    log p(target), natural log). stream: [n + 1] int64, the start token then the split's tokens."""
    with key_capture(model) as forward:
        yield from window_states(forward, stream, tokens_per_sample, context, max_tokens, with_log_probs, desc)


@contextlib.contextmanager
def key_capture(model):
    """Context manager giving forward(x [B, L] int64 tensor, on any device) -> (att [B, L, D], ffn [B, L, D], logits
    [B, L, V]) of `model` on its device, the keys captured by forward pre-hooks (find_key_modules) that are removed
    on exit. Raises ArtifactError when att and ffn differ in dimension."""
    att_mod, out_mod = find_key_modules(model)
    cap: dict[str, torch.Tensor] = {}
    hooks = [att_mod.register_forward_pre_hook(lambda m, a: cap.__setitem__("att", a[0])),
             out_mod.register_forward_pre_hook(lambda m, a: cap.__setitem__("ffn", a[0]))]

    def forward(x: torch.Tensor):
        x = x.to(model.device)  # windows come from the host; load_hf puts the model on CUDA when there is one
        logits = own_forward(model)(input_ids=x, use_cache=False).logits  # the LM's, even while a kNN-LM wraps it
        b, length = x.shape
        att, ffn = cap["att"].reshape(b, length, -1), cap["ffn"].reshape(b, length, -1)
        if att.shape[-1] != ffn.shape[-1]:
            raise ArtifactError(f"{type(model).__name__}: att keys have {att.shape[-1]} dims, ffn keys "
                                f"{ffn.shape[-1]} (a projection before the output layer); the datastore needs "
                                "both key types of one dimension")
        return att, ffn, logits

    try:
        yield forward
    finally:
        for h in hooks:
            h.remove()


def _sha256_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_dir(path: str, revision: str | None = None) -> Path | None:
    """The local folder of a Hugging Face model: `path` itself, or the Hub cache's snapshot of the id (None when it
    is not cached: the identity of a model that was never downloaded here is not known)."""
    d = Path(path)
    if d.is_dir():
        return d
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache (or no hub library): unknown here
        return None


_IDENTITIES: dict[tuple, dict] = {}  # files_identity by its files' paths and stats: each LM hashed once per process


def files_identity(d: Path) -> dict:
    """The identity of a Hugging Face LM's files in folder d, one definition for every caller (the pipeline's model
    card, HuggingFaceLM, bundles): {'checkpoint_sha256': the sha256 of its weight files and config (WEIGHT_FILES, by
    name in sorted order), 'tokenizer_sha256': of its tokenizer files (TOKENIZER_FILES), None without any}. Files
    whose paths and stats (knnlm.io.file_stat) are unchanged are not hashed again in this process."""
    weights = sorted({f for pat in WEIGHT_FILES for f in d.glob(pat)})
    toks = sorted(f for name in TOKENIZER_FILES for f in d.glob(name))
    key = tuple(tuple((str(f.resolve()), *file_stat(f).values()) for f in files) for files in (weights, toks))
    if key not in _IDENTITIES:
        _IDENTITIES[key] = {"checkpoint_sha256": _sha256_files(weights) if weights else None,
                            "tokenizer_sha256": _sha256_files(toks) if toks else None}
    return dict(_IDENTITIES[key])


def vocab_identity(tok) -> str:
    """The sha256 of a tokenizer's vocabulary (its token → id map, sorted by id): what a datastore's vals mean. Two
    tokenizers saved apart (other tokenizer_config.json files, so another tokenizer_sha256) with the same vocabulary
    share it."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in vocab).encode()).hexdigest()


def model_card(path: str, revision: str | None = None, dtype: str = "float32") -> dict:
    """What identifies a Hugging Face LM: {'source': 'hf', 'path', 'revision', 'dtype', 'class', 'parameters',
    'checkpoint_sha256' (weights + config), 'tokenizer_sha256'}. For a Hub id (no local directory) the files of
    the local Hub cache are hashed after loading. Every datastore and query dump records checkpoint_sha256, so a
    datastore is never used with another model."""
    model, tok = load_hf(path, dtype, revision)
    d = Path(path)
    if not d.is_dir():
        from huggingface_hub import snapshot_download

        d = Path(snapshot_download(path, revision=revision))
    ident = files_identity(d)
    if not ident["checkpoint_sha256"]:
        raise ArtifactError(f"Hugging Face model {path}: no weight files ({', '.join(WEIGHT_FILES)}) in {d}")
    return {"source": "hf", "path": str(path), "revision": revision, "dtype": dtype, "class": type(model).__name__,
            "parameters": int(sum(p.numel() for p in model.parameters())), "vocab_size": int(model.config.vocab_size),
            "hidden_size": int(model.get_output_embeddings().in_features),
            "tokenizer": type(tok).__name__, **ident}


# the window of a Hugging Face LM when none is given: its maximum length, at most this (a Llama-3's 8k positions
# would make every window an 8k-token fp32 pass)
DEFAULT_MAX_WINDOW = 1024


class HuggingFaceLM:
    """A Hugging Face causal LM (knnlm.lm.hf) and its fast tokenizer; tokens are the tokenizer's over the text with its
    newlines, the stream starts with BOS (else EOS), as the pipeline's dumps.

    model: a local directory or Hub id, or an already loaded model (then `tokenizer` is its fast tokenizer); dtype:
    'float32' | 'bfloat16' | 'float16' for a model loaded here; tokens_per_sample: the window (default: the model's
    maximum length, at most DEFAULT_MAX_WINDOW). Raises ValueError for a loaded model without a tokenizer."""

    def __init__(self, model, dtype: str = "float32", revision: str | None = None,
                 tokens_per_sample: int | None = None, tokenizer=None):
        if isinstance(model, (str, Path)):
            path = str(model)
            self.model, self.tok = load_hf(path, dtype, revision)
        else:
            if tokenizer is None:
                raise ValueError("HuggingFaceLM: a loaded model needs its tokenizer (tokenizer=)")
            if not getattr(tokenizer, "is_fast", False):
                raise ArtifactError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; character offsets "
                                    "are needed to count words")
            self.model, self.tok = model.eval(), tokenizer
            path = getattr(model, "name_or_path", "") or type(model).__name__
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.start = start_token(self.tok)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.tokens_per_sample = int(tokens_per_sample or min(self.model.config.max_position_embeddings,
                                                              DEFAULT_MAX_WINDOW))
        self.dim = int(self.model.get_output_embeddings().weight.shape[1])
        self._capture = key_capture(self.model)
        self.forward = self._capture.__enter__()  # hooks stay for the model's life in this object
        d = model_dir(path, revision) if isinstance(model, (str, Path)) else None
        # the weights' and tokenizer's sha256 (files_identity; None for a model object): what every datastore made
        # with this LM records, and what a datastore's LM is compared with on load
        self.identity = {"source": "hf", "model": path, "revision": revision, "dtype": dtype,
                         **(files_identity(d) if d is not None else {"checkpoint_sha256": None, "tokenizer_sha256": None}),
                         "vocab_sha256": vocab_identity(self.tok)}

    def encode(self, lines: list[str]) -> np.ndarray:
        return tokenize_lines(self.tok, lines)["ids"]

    def encode_lines(self, lines: list[str]) -> dict[str, np.ndarray]:
        """tokenize_lines: {'ids', 'line', 'words'} of the lines (each with its newline)."""
        return tokenize_lines(self.tok, lines)

    def encode_prompt(self, text: str) -> np.ndarray:
        return np.asarray(self.tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


def hf_pass(card: dict, texts: dict, context_window: int, max_tokens: int, tokens_per_sample: int) -> LMPass:
    """A Hugging Face causal LM (knnlm.lm.hf; card: knnlm.lm.hf.model_card) over the split files texts[split]."""
    model, tok = load_hf(card["path"], card["dtype"], card.get("revision"))
    toks: dict[str, dict] = {}

    def tokens(split):
        if split not in toks:
            toks[split] = tokenize_split(tok, texts[split])
        return toks[split]

    def states(split, lp):
        stream = np.concatenate([[start_token(tok)], tokens(split)["ids"]])
        return iter_states(model, stream, tokens_per_sample, context_window, max_tokens, lp, desc=f"dump {split}")

    return LMPass(n=lambda split: len(tokens(split)["ids"]), d=card["hidden_size"], states=states, tokens=tokens,
                  identity=lambda split: {"source": "hf", "model": card["path"], "checkpoint_sha256": card["checkpoint_sha256"],
                                          "tokenizer_sha256": card["tokenizer_sha256"],
                                          "data_sha256": sha256_file(texts[split]), "context_window": context_window,
                                          "tokens_per_sample": tokens_per_sample})


# The backend's functions (knnlm.lm: the same in every backend)
def lm_pass(files: dict, split: str, cfg: dict, lm: str) -> LMPass:
    """The Hugging Face LM `lm` over `split`: files 'model_card' (model_card) and 'text' (the split's text); cfg the
    job's config sections ('eval': context_window, max_tokens; 'lms': the LM's window)."""
    from ..config import lm_tokens_per_sample

    ev = cfg["eval"]
    return hf_pass(read_json(files["model_card"]), {split: files["text"]}, ev["context_window"], ev["max_tokens"],
                   lm_tokens_per_sample(cfg, lm))


def output_matrix(files: dict) -> torch.Tensor:
    """W_sm [V, D] float32: the output embeddings of the LM of files['model_card']. Raises ArtifactError when the
    output layer has a bias (the parametric models use W_sm h only)."""
    card = read_json(files["model_card"])
    out = load_hf(card["path"], "float32", card.get("revision"))[0].get_output_embeddings()
    if getattr(out, "bias", None) is not None:
        raise ArtifactError(f"{card['path']}: the output layer has a bias; the parametric models use W_sm h only")
    return out.weight.detach().float().cpu()


def token_strings(files: dict, vocab: int) -> tuple[list[str], np.ndarray]:
    """(pieces [V'], special [V'] bool), V' ≥ vocab, of the tokenizer of the LM of files['model_card']."""
    card = read_json(files["model_card"])
    tok = transformers_module().AutoTokenizer.from_pretrained(card["path"], revision=card.get("revision"))
    pieces = tok.convert_ids_to_tokens(list(range(max(vocab, len(tok)))))
    special = np.zeros(len(pieces), dtype=bool)
    special[[i for i in tok.all_special_ids if i < len(pieces)]] = True
    return pieces, special


def run_lm(cfg: dict, lm: str, layout) -> HuggingFaceLM:
    """HuggingFaceLM of base LM `lm` of a validated run config, from its model card (layout: the run's
    knnlm.paths.Layout). Raises ArtifactError naming the card when the run has not written it."""
    from ..config import lm_tokens_per_sample

    card_path = layout.path("model_card", lm=lm)
    if not card_path.exists():
        raise ArtifactError(f"{card_path}: no model card for Hugging Face LM {lm!r} (run the pipeline's "
                            f"model_card job)")
    card = read_json(card_path)
    return HuggingFaceLM(card["path"], card["dtype"], card.get("revision"), lm_tokens_per_sample(cfg, lm))
