"""Pretrained base LMs shipped with the pipeline (pretrained/<config>/): the paper starts from a trained LM, and so
does every run of configs/wikitext2.yaml, which loads them with 'source: fairseq'.

Each LM is a folder pretrained/<config>/<lm>/ with
  checkpoint.pt    the fairseq checkpoint's weights ('model', fp16 when that leaves the valid perplexity unchanged),
                   its 'cfg' and its update count; no optimizer state
  training.json    the training record (knnlm.lm.convergence: valid curve, converged or not), read by every caption
  model_card.json  what identifies and reproduces it: the 'lm' config it was trained with, updates, epochs, valid
                   curve, valid and test perplexity (per token and per word), sha256 of the checkpoint, of the
                   dictionary and of the BPE model, and the one command that retrains it
  README.md        the same card for people
and pretrained/<config>/bpe/ holds the sentencepiece model (spm.model, config 'bpe.model') and the fairseq dictionary
(dict.txt) the LMs were trained with. Written by `python -m knnlm.pretrained export ...` from a run's train_lm outputs.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import zipfile
from pathlib import Path

from .io import ArtifactError, atomic_path, read_json, sha256_file, write_json

log = logging.getLogger(__name__)
CARD, TRAINING = "model_card.json", "training.json"
FP16_TOLERANCE = 0.001  # fp16 weights are shipped when they change valid perplexity by less than 0.1 %


def card_of(checkpoint: str | Path) -> dict | None:
    """The model card beside a shipped checkpoint (model_card.json in its folder), or None."""
    p = Path(checkpoint).with_name(CARD)
    return read_json(p) if p.is_file() else None


def training_of(checkpoint: str | Path) -> Path | None:
    """The training record (training.json) beside a shipped checkpoint, or None."""
    p = Path(checkpoint).with_name(TRAINING)
    return p if p.is_file() else None


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
                            f"{p.with_name(CARD)} ({card['sha256'][:12]}…): the file was changed or corrupted")
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
                            f"model it ships with (config 'bpe.model', {Path(checkpoint).parent.parent / 'bpe'})")


def load_fairseq_lm(checkpoint: str | Path, data_bin: str | Path, key: str):
    """knnlm.dump.load_lm after check_checkpoint and check_dictionary; any failure to load becomes an ArtifactError
    naming config key `key` and the file (never a raw unpickling traceback)."""
    from .dump import load_lm

    check_checkpoint(checkpoint, key)
    check_dictionary(checkpoint, Path(data_bin) / "dict.txt", key)
    try:
        return load_lm(checkpoint, data_bin)
    except Exception as e:  # noqa: BLE001 - whatever fairseq raises, name the file and the config key
        raise ArtifactError(f"config key '{key}': {checkpoint} is not a fairseq LM this run can load "
                            f"({type(e).__name__}: {str(e)[:300]})") from None


def strip_checkpoint(src: str | Path, dst: str | Path, fp16: bool) -> None:
    """Write the weights of fairseq checkpoint `src` to `dst` atomically: 'model' (fp16 when asked), 'cfg', 'args',
    'criterion', 'task_state' and the update count ('optimizer_history', without the optimizer's moments and the
    data iterator's state)."""
    import torch

    st = torch.load(src, map_location="cpu", weights_only=False)
    done: dict = {}  # tied weights (input and output embeddings) stay one tensor
    model = {}
    for k, v in st["model"].items():
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if ptr not in done:
            done[ptr] = v.half() if fp16 and v.is_floating_point() else v
        model[k] = done[ptr]
    keep = {"args": st.get("args"), "cfg": st["cfg"], "model": model, "criterion": st.get("criterion"),
            "optimizer_history": st["optimizer_history"][-1:], "task_state": st.get("task_state", {}),
            "extra_state": {k: v for k, v in st.get("extra_state", {}).items() if k in ("val_loss", "best")},
            "last_optimizer_state": None}
    with atomic_path(dst) as tmp:
        torch.save(keep, tmp)


def evaluate(checkpoint: str | Path, data_bin: str | Path, split: str, context_window: int, max_tokens: int,
             words: int | None = None) -> dict:
    """Perplexity of a fairseq LM over a split of data_bin (knnlm.dump's pass, fairseq-eval-lm's windows): {'tokens',
    'ppl_token', 'ppl_word' (with `words`: the split's whitespace words)}."""
    import numpy as np

    from .dump import fairseq_pass
    from .scoring import perplexity

    lp = _log_probs(fairseq_pass(checkpoint, data_bin, context_window, max_tokens), split)
    out = {"tokens": int(len(lp)), "ppl_token": perplexity(lp, len(lp))}
    if words:
        out["ppl_word"] = perplexity(lp, words)
    return out


SLICE_LINES = 400  # the valid slice whose perplexity every model card records and the tests reproduce


def slice_perplexity(checkpoint: str | Path, bpe_dir: str | Path, config: str | Path, lines: int = SLICE_LINES,
                     work: str | Path | None = None) -> dict:
    """Per-token perplexity of a shipped LM on the first `lines` lines of the valid split of `config`'s corpus,
    encoded with the shipped BPE model (bpe_dir/spm.model) and binarised with the shipped dictionary
    (bpe_dir/dict.txt): {'lines', 'tokens', 'ppl_token'}. What a model card records and tests reproduce without a
    run directory. work: a scratch folder (a temporary one by default)."""
    import subprocess
    import sys
    import tempfile

    from .config import load_config
    from .data import encode_bpe, open_split

    cfg = load_config(config)
    bpe_dir = Path(bpe_dir)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmp = Path(tmp)
        raw = tmp / "valid.tokens"
        with open_split(cfg, "valid") as (fi, _), open(raw, "wb") as fo:
            for i, line in enumerate(fi):
                if i >= lines:
                    break
                fo.write(line)
        encode_bpe(bpe_dir / "spm.model", raw, tmp / "valid.bpe")
        subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--validpref",
                        str(tmp / "valid.bpe"), "--srcdict", str(bpe_dir / "dict.txt"), "--destdir", str(tmp / "bin"),
                        "--workers", "1"], check=True, capture_output=True)
        shutil.copyfile(bpe_dir / "dict.txt", tmp / "bin" / "dict.txt")
        ev = cfg["eval"]
        out = evaluate(checkpoint, tmp / "bin", "valid", ev["context_window"], ev["max_tokens"])
    return {"lines": lines, "tokens": out["tokens"], "ppl_token": out["ppl_token"]}


def _log_probs(lm, split: str):
    """[T] float64 log p(target) of an LMPass over a split."""
    import numpy as np
    import torch

    parts = []
    with torch.no_grad():
        for batch in lm.states(split, True):
            parts.append(batch["lp"].double().numpy())
    return np.concatenate(parts)


def export(run: str | Path, lm: str, config: str | Path, out: str | Path, threads: int = 2) -> dict:
    """Ship LM `lm` of the run directory `run` (results/<name>) into `out` (pretrained/<name>/<lm>): checkpoint.pt
    (fp16 when valid perplexity changes by less than FP16_TOLERANCE), training.json, model_card.json, README.md; the
    run's BPE model and dictionary into out/../bpe (once). Returns the card."""
    import torch

    from .config import lm_section, load_config

    torch.set_num_threads(threads)
    run, out = Path(run), Path(out)
    cfg = load_config(config)
    src = run / "lms" / lm / "checkpoint.pt"
    data_bin = run / "data-bin"
    training = read_json(run / "lms" / lm / TRAINING)
    ev = cfg["eval"]
    counts = read_json(run / "data" / "wordcounts.json")
    out.mkdir(parents=True, exist_ok=True)
    bpe_dir = out.parent / "bpe"
    bpe_dir.mkdir(exist_ok=True)
    for f, dst in ((run / "bpe" / "spm.model", bpe_dir / "spm.model"), (run / "bpe" / "spm.vocab", bpe_dir / "spm.vocab"),
                   (data_bin / "dict.txt", bpe_dir / "dict.txt")):
        if not dst.exists():
            shutil.copyfile(f, dst)
        elif sha256_file(f) != sha256_file(dst):
            raise ArtifactError(f"{dst} differs from this run's {f}: the LMs of one folder share one BPE")
    full = out / "checkpoint.fp32.tmp"
    strip_checkpoint(src, full, fp16=False)
    strip_checkpoint(src, out / "checkpoint.pt", fp16=True)
    ref = evaluate(full, data_bin, "valid", ev["context_window"], ev["max_tokens"], counts["valid"]["words"])
    half = evaluate(out / "checkpoint.pt", data_bin, "valid", ev["context_window"], ev["max_tokens"],
                    counts["valid"]["words"])
    fp16 = abs(half["ppl_token"] / ref["ppl_token"] - 1) < FP16_TOLERANCE
    if not fp16:
        full.replace(out / "checkpoint.pt")
        half = ref
    else:
        full.unlink()
    test = evaluate(out / "checkpoint.pt", data_bin, "test", ev["context_window"], ev["max_tokens"],
                    counts["test"]["words"])
    valid_slice = slice_perplexity(out / "checkpoint.pt", bpe_dir, config)
    state = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False, mmap=True)
    params = sum(v.numel() for v in {(v.untyped_storage().data_ptr(), v.storage_offset()): v
                                     for v in state["model"].values()}.values())
    tokens_per_update = cfg["lm"]["max_tokens"]
    lm_cfg = lm_section(cfg, lm)
    train = cfg["lms"][lm]
    train_opts = ({} if train["checkpoint"] == "best" and not train["teacher"] else
                  {"checkpoint": train["checkpoint"], "soft_label_weight": train["soft_label_weight"]})
    train_tokens = read_json(run / "bpe" / "bpe_stats.json")["train"]["tokens"]
    shutil.copyfile(run / "lms" / lm / TRAINING, out / TRAINING)
    card = {"name": lm, "config": str(config), "lm": lm_cfg, "train": train_opts, "lms_entry": cfg["lms"][lm],
            "bpe": cfg["bpe"],
            "parameters": int(params), "dtype": "float16" if fp16 else "float32",
            "updates": training["updates"], "epochs": round(training["updates"] * tokens_per_update / train_tokens, 2),
            "converged": training["converged"], "last_gain": training["last_gain"],
            "valid_curve_token_ppl": training["valid"],
            "valid": {**half, "fp32_ppl_token": ref["ppl_token"]}, "test": test, "valid_slice": valid_slice,
            "eval": {"context_window": ev["context_window"], "tokens_per_sample": lm_cfg["tokens_per_sample"]},
            "sha256": sha256_file(out / "checkpoint.pt"), "bytes": (out / "checkpoint.pt").stat().st_size,
            "dict_sha256": sha256_file(bpe_dir / "dict.txt"), "bpe_sha256": sha256_file(bpe_dir / "spm.model"),
            "retrain": (f".venv/bin/snakemake --profile profiles/local --configfile {config} --config pretrained=null "
                        f"-- results/{cfg['name']}/lms/{lm}/checkpoint.pt")}
    write_json(out / CARD, card)
    (out / "README.md").write_text(card_markdown(card))
    return card


def card_markdown(card: dict) -> str:
    """The model card of a shipped LM as Markdown."""
    lm = card["lm"]
    curve = "\n".join(f"| {u:,} | {p:.2f} |" for u, p in card["valid_curve_token_ppl"])
    return (f"# Base LM '{card['name']}'\n\n"
            f"A fairseq `transformer_lm` (pre-norm, plain softmax, tied input/output embeddings): "
            f"{lm['decoder_layers']} layers, {lm['decoder_embed_dim']} dims, FFN {lm['decoder_ffn_embed_dim']}, "
            f"{lm['decoder_attention_heads']} heads, dropout {lm['dropout']}; {card['parameters']:,} parameters, "
            f"stored as {card['dtype']}. Trained by the pipeline's own `train_lm` rule from `{card['config']}` "
            f"(entry `lms.{card['name']}`: `{json.dumps(card['lms_entry'])}`), on the sentencepiece BPE of `../bpe/`.\n\n"
            f"- updates: {card['updates']:,} ({card['epochs']} epochs of {lm['max_tokens']:,} tokens per update), "
            f"lr {lm['lr']} ({lm.get('lr_scheduler', 'inverse_sqrt')}, warm-up {lm['warmup_updates']})\n"
            f"- converged: {card['converged']} (last evaluation changed valid perplexity by "
            f"{100 * (card['last_gain'] or 0):+.2f} %)\n"
            f"- valid perplexity: {card['valid']['ppl_token']:.2f} per token, {card['valid'].get('ppl_word', 0):.2f} "
            f"per word (fp32 weights: {card['valid']['fp32_ppl_token']:.2f} per token)\n"
            f"- test perplexity: {card['test']['ppl_token']:.2f} per token, {card['test'].get('ppl_word', 0):.2f} per "
            f"word (context window {card['eval']['context_window']} of {card['eval']['tokens_per_sample']})\n"
            f"- sha256: `{card['sha256']}` ({card['bytes']:,} bytes); dictionary `{card['dict_sha256']}`; BPE model "
            f"`{card['bpe_sha256']}`\n"
            f"- retrain: `{card['retrain']}`\n\n"
            f"Valid curve (per-token perplexity at each evaluation):\n\n| update | valid PPL |\n|---:|---:|\n{curve}\n")


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m knnlm.pretrained", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="ship a run's trained LM into pretrained/<config>/<lm>")
    e.add_argument("run", type=Path, help="the run directory, e.g. results/wikitext2")
    e.add_argument("lm", help="the LM's name in config 'lms'")
    e.add_argument("--config", required=True, type=Path, help="the config it was trained with")
    e.add_argument("--out", required=True, type=Path, help="e.g. pretrained/wikitext2/base")
    e.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    card = export(a.run, a.lm, a.config, a.out, a.threads)
    print(json.dumps({k: card[k] for k in ("name", "dtype", "updates", "epochs", "converged", "valid", "test",
                                            "sha256", "bytes")}, indent=1))


if __name__ == "__main__":
    main()
