"""The fairseq backend: a transformer_lm checkpoint (trained by the run, shipped, or published) as a base LM.

Loading and checking checkpoints (a truncated file, another file, a changed file or another dictionary is refused
with an error naming the config key), one pass over a split in fairseq-eval-lm's windows giving the keys and the
log-probs, and FairseqLM, the backend of the Python API.

Key types (Xu et al. 2023, Sec. 3):
  att -- the input of the last layer's feed-forward block after its LayerNorm = input of layers[-1].fc1
         (knn-transformers' and urvashik/knnlm's `last_ffn_input`)
  ffn -- the final decoder output (after the final LayerNorm) that feeds the output projection
One key per target token: key i is the state that predicts vals[i].
"""
from __future__ import annotations

import copy
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm import tqdm

from ..io import ArtifactError, checkpoint_globals, load_checkpoint, read_json, sha256_file
from ..paths import PretrainedLayout
from . import LMPass, text_lines


def load_lm(checkpoint: str | Path, data_bin: str | Path):
    """Load a fairseq LM checkpoint in eval mode; returns (model, cfg). data_bin holds dict.txt."""
    from fairseq import checkpoint_utils

    with checkpoint_globals():  # fairseq's torch.load: tensors, plain types and the allowlist only, no code
        models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                       arg_overrides={"data": str(data_bin)})
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
                   keep: torch.Tensor | None = None, incremental_state: dict | None = None):
    """Run the decoder once; return {'att': [B, L, D], 'ffn': [B, L, D]} (+ 'lp': [B, L] log p(target), fp32; with
    `keep` [B, L] bool, 'lp' [n] of the kept positions only, in row-major order: the output layer and its softmax over
    V, most of an eval pass's cost at small D, then run for the scored positions and not for a window's context).
    incremental_state: fairseq's per-layer cache of earlier positions (FairseqStepDecoder): the
    decoder then runs the newest position of src_tokens only, and L = 1.

    att is captured by a forward hook on layers[-1].fc1 (its input, after the pre-FFN LayerNorm).
    """
    captured = {}
    hook = model.decoder.layers[-1].fc1.register_forward_hook(lambda m, inp, out: captured.__setitem__("att", inp[0]))
    try:
        x, extra = model.decoder.extract_features(src_tokens, encoder_out=None, incremental_state=incremental_state)
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
        forward_states(self.model, tokens.to(self.dev), False, incremental_state=self.state)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, t] int64, the sequences so far (the start token first; t = 1 at the first step and one more at
        each step). Returns (att [B, D], ffn [B, D], log-probs [B, V]) float32 of the next token after each sequence
        (the keys of knnlm.lm.fairseq.forward_states, here for the newest position only)."""
        self._advance(tokens)
        st = forward_states(self.model, tokens.to(self.dev), False, incremental_state=self.state)
        # normalised log-probs through the model's own normalisation (a plain or an adaptive softmax), as fairseq_forward
        lp = self.model.get_normalized_probs((self.model.decoder.output_layer(st["ffn"]), None), log_probs=True)
        return st["att"][:, -1].float(), st["ffn"][:, -1].float(), lp[:, -1].float()


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


def fairseq_pass(checkpoint, data_bin, context_window: int, max_tokens: int, key: str | None = None,
                 adaptive_softmax: bool | None = None) -> LMPass:
    """A fairseq transformer_lm checkpoint over the run's binarised data (dict.txt must be the model's). key: the
    config key that names the checkpoint (e.g. 'lms.base.path'): the checkpoint is then checked first and any failure
    to load it raises ArtifactError naming that key and the file (load_fairseq_lm).
    adaptive_softmax: what the config declares (config 'lms.<lm>.adaptive_softmax'); ArtifactError naming the key
    when the checkpoint disagrees (None: not checked). Log-probs come from the model's own normalisation either way."""
    if key:
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


def _beside(checkpoint: str | Path, name: str) -> Path:
    """File `name` (knnlm.paths.PRETRAINED_PATTERNS) of the shipped LM whose checkpoint is `checkpoint`."""
    p = Path(checkpoint)
    return PretrainedLayout(p.parent.parent).path(name, lm=p.parent.name)


def card_of(checkpoint: str | Path) -> dict | None:
    """The model card beside a shipped checkpoint (in its folder), or None."""
    p = _beside(checkpoint, "model_card")
    return read_json(p) if p.is_file() else None


def check_checkpoint(checkpoint: str | Path, key: str) -> dict | None:
    """Check an existing fairseq checkpoint before any work: it exists, is a torch zip archive (not truncated or
    another file), and matches the sha256 of its model card when it has one. Returns the card (or None). Raises
    ArtifactError naming config key `key` (e.g. 'lms.base.path') and the file."""
    p = Path(checkpoint)
    if not p.is_file():
        raise ArtifactError(f"config key '{key}': {p} does not exist (expected a fairseq checkpoint file)")
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise ArtifactError(f"config key '{key}': {p} is not a torch checkpoint (a zip archive written by "
                            f"torch.save), it is corrupt or another kind of file: {e}") from None
    if bad is not None or not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        raise ArtifactError(f"config key '{key}': {p} is a corrupt torch checkpoint "
                            f"({'bad member ' + bad if bad else 'no data.pkl'})")
    card = card_of(p)
    if card is not None and card.get("sha256") and sha256_file(p) != card["sha256"]:
        raise ArtifactError(f"config key '{key}': {p} does not match the sha256 of its model card "
                            f"{_beside(p, 'model_card')} ({card['sha256'][:12]}…): the file was changed or corrupted")
    return card


def check_dictionary(checkpoint: str | Path, dict_txt: str | Path, key: str) -> None:
    """A shipped LM must score the run's tokens: the run's fairseq dictionary (data-bin/dict.txt) must be the one its
    model card names. Raises ArtifactError naming config key `key` and both files otherwise (a checkpoint without a
    card is not checked here; fairseq then fails on a size mismatch)."""
    card = card_of(checkpoint)
    if card is None or not card.get("dict_sha256"):
        return
    got = sha256_file(dict_txt)
    if got != card["dict_sha256"]:
        raise ArtifactError(f"config key '{key}': {checkpoint} was trained with another dictionary than this run's "
                            f"{dict_txt} (sha256 {got[:12]}…, its card {card['dict_sha256'][:12]}…): use the BPE "
                            f"model it ships with (config 'pretrained': {Path(checkpoint).parent.parent})")


def load_fairseq_lm(checkpoint: str | Path, data_bin: str | Path, key: str):
    """load_lm after check_checkpoint and check_dictionary; any failure to load becomes an ArtifactError
    naming config key `key` and the file (never a raw unpickling traceback)."""
    check_checkpoint(checkpoint, key)
    check_dictionary(checkpoint, Path(data_bin) / "dict.txt", key)
    import pickle

    try:
        return load_lm(checkpoint, data_bin)
    except pickle.UnpicklingError as e:
        raise ArtifactError(f"config key '{key}': {checkpoint}: refused to load: it holds objects beyond tensors, plain "
                            f"types and argparse.Namespace, whose unpickling could run code ({str(e)[:200]})") from None
    except Exception as e:  # noqa: BLE001 - whatever fairseq raises, name the file and the config key
        raise ArtifactError(f"config key '{key}': {checkpoint} is not a fairseq LM this run can load "
                            f"({type(e).__name__}: {str(e)[:300]})") from None


class FairseqLM:
    """A fairseq transformer_lm with the dictionary (and sentencepiece model) it was trained with.

    checkpoint: the .pt file (a plain or an adaptive softmax); data_bin: a folder holding its dict.txt; bpe_model:
    the sentencepiece .model, or None for a word-level LM (urvashik/knnlm's WikiText-103 LM: its dictionary holds
    whitespace words). Tokens of a line are its pieces (or words; unknown ones map to <unk>) and the end of line,
    as fairseq-preprocess makes them.
    """

    def __init__(self, checkpoint: str | Path, data_bin: str | Path, bpe_model: str | Path | None,
                 key: str | None = None):
        import sentencepiece as spm

        if key:
                self.model, cfg = load_fairseq_lm(checkpoint, data_bin, key)
        else:
            self.model, cfg = load_lm(checkpoint, data_bin)
        self.dictionary = self.model.decoder.dictionary
        self.sp = spm.SentencePieceProcessor(model_file=str(bpe_model)) if bpe_model else None
        self.start = self.dictionary.eos()
        self.vocab_size = len(self.dictionary)
        self.tokens_per_sample = int(cfg.task.tokens_per_sample)
        self.dim = int(self.model.decoder.layers[-1].fc1.in_features)
        self.forward = fairseq_forward(self.model)
        # the checkpoint's sha256, as the pipeline's dumps record it (fairseq_pass): a datastore's LM is compared with it
        self.identity = {"source": "fairseq", "checkpoint": str(checkpoint), "checkpoint_sha256": sha256_file(checkpoint)}

    def step_decoder(self):
        """A new FairseqStepDecoder (incremental decoding) for one batch of sequences."""
        return FairseqStepDecoder(self.model, min(self.tokens_per_sample, int(self.model.decoder.max_positions())))

    def encode(self, lines: list[str]) -> np.ndarray:
        """[n] int64 token ids of `lines`: each line's BPE pieces then the end-of-line token."""
        return self.encode_lines(lines)["ids"]

    def encode_lines(self, lines: list[str]) -> dict[str, np.ndarray]:
        """{'ids' [n] int64 (each line's BPE pieces then the end-of-line token), 'line' [n] int32, 'words' [n] int16
        (1 for a piece that starts a word and for the end of line: knnlm.data.bpe_token_lines)}."""
        ids, line, words = [], [], []
        for i, text in enumerate(lines):
            s = text.strip()
            pieces = (self.sp.encode(s, out_type=str) if self.sp else s.split()) if s else []
            ids += [self.dictionary.index(p) for p in pieces] + [self.dictionary.eos()]
            line += [i] * (len(pieces) + 1)
            words += [p.startswith("\u2581") if self.sp else True for p in pieces] + [True]
        return {"ids": np.asarray(ids, dtype=np.int64), "line": np.asarray(line, dtype=np.int32),
                "words": np.asarray(words, dtype=np.int16)}

    def encode_prompt(self, text: str) -> np.ndarray:
        """Token ids of a prompt to continue: its BPE pieces, no end of line after its last line."""
        return self.encode(text_lines(text))[:-1]

    def decode(self, ids) -> str:
        """Text of token ids (ends of line become newlines)."""
        eos, words = self.dictionary.eos(), []
        line: list[str] = []
        join = self.sp.decode if self.sp else " ".join
        for i in ids:
            if int(i) == eos:
                words.append(join(line) + "\n")
                line = []
            else:
                line.append(self.dictionary[int(i)])
        return "".join(words) + (join(line) if line else "")


def checkpoint_output_matrix(checkpoint) -> torch.Tensor:
    """W_sm [V, D] float32 of a fairseq checkpoint (decoder.output_projection.weight, or decoder.embed_out). Raises
    ArtifactError naming the file when it has no plain output projection (adaptive softmax)."""
    state = load_checkpoint(checkpoint)["model"]
    for name in ("decoder.output_projection.weight", "decoder.embed_out"):
        if name in state:
            return state[name].float()
    raise ArtifactError(f"{checkpoint}: no plain output projection (decoder.output_projection.weight); "
                        "adaptive-softmax LMs are not supported")


# The backend's functions (knnlm.lm: the same in every backend)
def lm_pass(files: dict, split: str, cfg: dict, lm: str) -> LMPass:
    """The fairseq LM `lm` over `split`: files 'checkpoint' and 'data_bin' (a job's named inputs), cfg the job's
    config sections ('eval': context_window, max_tokens; 'adaptive_softmax', checked against the checkpoint)."""
    ev = cfg["eval"]
    return fairseq_pass(files["checkpoint"], files["data_bin"], ev["context_window"], ev["max_tokens"],
                        key=f"lms.{lm}", adaptive_softmax=bool(cfg.get("adaptive_softmax", False)))


def output_matrix(files: dict) -> torch.Tensor:
    """W_sm [V, D] float32 of the checkpoint in files['checkpoint'] (checkpoint_output_matrix)."""
    return checkpoint_output_matrix(files["checkpoint"])


def token_strings(files: dict, vocab: int) -> tuple[list[str], np.ndarray]:
    """(pieces [V'], special [V'] bool), V' ≥ vocab, of the fairseq dictionary files['data_bin']/dict.txt (ids 0-3 are
    <s>, <pad>, </s>, <unk>). Raises ArtifactError when dict.txt is missing."""
    path = Path(files["data_bin"]) / "dict.txt"
    if not path.exists():
        raise ArtifactError(f"{path}: the fairseq dictionary is missing (rule binarise writes it)")
    pieces = ["<s>", "<pad>", "</s>", "<unk>"] + [ln.split(" ", 1)[0] for ln in path.read_text().splitlines()]
    return pieces, np.arange(max(vocab, len(pieces))) < 4


def run_lm(cfg: dict, lm: str, layout) -> FairseqLM:
    """FairseqLM of base LM `lm` of a validated run config: its trained or shipped checkpoint (or config
    'lms.<lm>.path') with the run's BPE model and dictionary (layout: the run's knnlm.paths.Layout). Raises
    ArtifactError naming the file when one is missing."""
    from . import backend

    b = backend(cfg["lms"][lm]["source"])
    ckpt = layout.path(b.weights_artifact, lm=lm) if b.weights_artifact else Path(cfg["lms"][lm]["path"])
    bpe = layout.path("bpe_model") if cfg["bpe"]["type"] != "none" else None  # 'none': a word-level LM
    for p in (ckpt, layout.path("data_bin") / "dict.txt", bpe):
        if p is not None and not Path(p).exists():
            raise ArtifactError(f"{p}: missing for base LM {lm!r} (run the pipeline's data and LM jobs first)")
    return FairseqLM(ckpt, layout.path("data_bin"), bpe, key=None if b.trained else f"lms.{lm}.path")
