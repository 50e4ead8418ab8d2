"""Pretrained base LMs shipped with the pipeline (pretrained/<config>/): the paper starts from a trained LM, and so
does every run of configs/wikitext2.yaml, which loads them with 'source: fairseq'.

Each LM is a folder pretrained/<config>/<lm>/ (the file names: knnlm.paths.PRETRAINED_PATTERNS) with its checkpoint
(the fairseq checkpoint's weights, fp16 when that leaves the valid perplexity unchanged, its 'cfg' and its update
count; no optimizer state), its training record (knnlm.lm.training.convergence: valid curve, converged or not, read by
every caption), and its model card (JSON and Markdown: the 'lm' config it was trained with, updates, epochs, valid
curve, valid and test perplexity per token and per word, sha256 of the checkpoint, of the dictionary and of the BPE
model, and the one command that retrains it); pretrained/<config>/bpe/ holds the sentencepiece model and the fairseq
dictionary the LMs were trained with. Written by `python -m knnlm.lm.shipped export ...` from a run's outputs.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from ..io import ArtifactError, atomic_path, load_checkpoint, read_json, sha256_file, write_json
from ..paths import Layout, PretrainedLayout

log = logging.getLogger(__name__)
FP16_TOLERANCE = 0.001  # fp16 weights are shipped when they change valid perplexity by less than 0.1 %


def strip_checkpoint(src: str | Path, dst: str | Path, fp16: bool) -> None:
    """Write the weights of fairseq checkpoint `src` to `dst` atomically: 'model' (fp16 when asked), 'cfg', 'args',
    'criterion' (less a soft-label teacher's weights, knnlm.lm.soft_labels: the teacher is an LM of its own, and only
    training reads them), 'task_state' and the update count ('optimizer_history', without the optimizer's moments
    and the data iterator's state)."""
    import torch

    st = load_checkpoint(src)
    done: dict = {}  # tied weights (input and output embeddings) stay one tensor
    model = {}
    for k, v in st["model"].items():
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if ptr not in done:
            done[ptr] = v.half() if fp16 and v.is_floating_point() else v
        model[k] = done[ptr]
    criterion = {k: v for k, v in (st.get("criterion") or {}).items() if not k.startswith("teacher.")} or None
    keep = {"args": st.get("args"), "cfg": st["cfg"], "model": model, "criterion": criterion,
            "optimizer_history": st["optimizer_history"][-1:], "task_state": st.get("task_state", {}),
            "extra_state": {k: v for k, v in st.get("extra_state", {}).items() if k in ("val_loss", "best")},
            "last_optimizer_state": None}
    with atomic_path(dst) as tmp:
        torch.save(keep, tmp)


def evaluate(checkpoint: str | Path, data_bin: str | Path, split: str, context_window: int, max_tokens: int,
             words: int | None = None) -> dict:
    """Perplexity of a fairseq LM over a split of data_bin (knnlm.datastore.dump's pass, fairseq-eval-lm's windows):
    {'tokens', 'ppl_token', 'ppl_word' (with `words`: the split's whitespace words)}."""

    from .fairseq import fairseq_pass
    from ..scoring.interpolation import perplexity

    lp = _log_probs(fairseq_pass(checkpoint, data_bin, context_window, max_tokens), split)
    out = {"tokens": int(len(lp)), "ppl_token": perplexity(lp, len(lp))}
    if words:
        out["ppl_word"] = perplexity(lp, words)
    return out


SLICE_LINES = 400  # the valid slice whose perplexity every model card records and the tests reproduce


def slice_perplexity(checkpoint: str | Path, shipped: str | Path, config: str | Path, lines: int = SLICE_LINES,
                     work: str | Path | None = None) -> dict:
    """Per-token perplexity of a shipped LM on the first `lines` lines of the valid split of `config`'s corpus,
    encoded with the BPE model and binarised with the dictionary of the folder of shipped LMs `shipped`
    (knnlm.paths.PRETRAINED_PATTERNS): {'lines', 'tokens', 'ppl_token'}. What a model card records and tests
    reproduce without a run directory. work: a scratch folder (a temporary one by default)."""
    import subprocess
    import sys
    import tempfile

    from ..config import load_config
    from ..data import encode_bpe, open_split

    cfg = load_config(config)
    files = PretrainedLayout(shipped)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmp = Path(tmp)
        raw = tmp / "slice.txt"
        with open_split(cfg, "valid") as (fi, _), open(raw, "wb") as fo:
            for i, line in enumerate(fi):
                if i >= lines:
                    break
                fo.write(line)
        encode_bpe(files.path("bpe_model"), raw, tmp / "slice.pieces")
        subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--validpref",
                        str(tmp / "slice.pieces"), "--srcdict", str(files.path("dictionary")), "--destdir",
                        str(tmp / "bin"), "--workers", "1"], check=True, capture_output=True)
        shutil.copyfile(files.path("dictionary"), tmp / "bin" / files.path("dictionary").name)
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
    """Ship LM `lm` of the run directory `run` (<results_dir>/<name>) into the folder of shipped LMs `out`
    (pretrained/<name>; knnlm.paths.PRETRAINED_PATTERNS): its checkpoint (fp16 when valid perplexity changes by less
    than FP16_TOLERANCE, no optimizer state), training record, model card (JSON and Markdown), and the run's BPE
    model and dictionary (once per folder; ArtifactError when the folder already holds another). Returns the card."""
    import torch

    from ..config import lm_section, load_config

    torch.set_num_threads(threads)
    run, dst = Layout(Path(run).parent, Path(run).name), PretrainedLayout(out)
    cfg = load_config(config)
    data_bin = run.path("data_bin")
    training = read_json(run.path("lm_training", lm=lm))
    ev = cfg["eval"]
    counts = read_json(run.path("wordcounts"))
    dst.path("checkpoint", lm=lm).parent.mkdir(parents=True, exist_ok=True)
    dst.path("bpe_model").parent.mkdir(parents=True, exist_ok=True)
    for f, name in ((run.path("bpe_model"), "bpe_model"), (run.path("bpe_vocab"), "bpe_vocab"),
                    (data_bin / dst.path("dictionary").name, "dictionary")):
        if not dst.path(name).exists():
            shutil.copyfile(f, dst.path(name))
        elif sha256_file(f) != sha256_file(dst.path(name)):
            raise ArtifactError(f"{dst.path(name)} differs from this run's {f}: the LMs of one folder share one BPE")
    ckpt = dst.path("checkpoint", lm=lm)
    full = ckpt.with_suffix(".fp32.tmp")
    strip_checkpoint(run.path("checkpoint", lm=lm), full, fp16=False)
    strip_checkpoint(run.path("checkpoint", lm=lm), ckpt, fp16=True)
    ref = evaluate(full, data_bin, "valid", ev["context_window"], ev["max_tokens"], counts["valid"]["words"])
    half = evaluate(ckpt, data_bin, "valid", ev["context_window"], ev["max_tokens"], counts["valid"]["words"])
    fp16 = abs(half["ppl_token"] / ref["ppl_token"] - 1) < FP16_TOLERANCE
    if not fp16:
        full.replace(ckpt)
        half = ref
    else:
        full.unlink()
    test = evaluate(ckpt, data_bin, "test", ev["context_window"], ev["max_tokens"], counts["test"]["words"])
    valid_slice = slice_perplexity(ckpt, out, config)
    state = load_checkpoint(ckpt, mmap=True)
    params = sum(v.numel() for v in {(v.untyped_storage().data_ptr(), v.storage_offset()): v
                                     for v in state["model"].values()}.values())
    lm_cfg = lm_section(cfg, lm)
    entry = cfg["lms"][lm]
    train_opts = ({} if entry["checkpoint"] == "best" and not entry["teacher"] else
                  {"checkpoint": entry["checkpoint"], "soft_label_weight": entry["soft_label_weight"]})
    train_tokens = read_json(run.path("bpe_stats"))["train"]["tokens"]
    shutil.copyfile(run.path("lm_training", lm=lm), dst.path("lm_training", lm=lm))
    card = {"name": lm, "config": str(config), "lm": lm_cfg, "train": train_opts, "lms_entry": entry,
            "bpe": cfg["bpe"], "parameters": int(params), "dtype": "float16" if fp16 else "float32",
            "updates": training["updates"], "epochs": round(training["updates"] * lm_cfg["max_tokens"] / train_tokens, 2),
            "checkpoint_update": int(state["optimizer_history"][-1]["num_updates"]),  # best on valid, or the last
            "converged": training["converged"], "last_gain": training["last_gain"],
            "valid_curve_token_ppl": training["valid"],
            "valid": {**half, "fp32_ppl_token": ref["ppl_token"]}, "test": test, "valid_slice": valid_slice,
            "eval": {"context_window": ev["context_window"], "tokens_per_sample": lm_cfg["tokens_per_sample"]},
            "sha256": sha256_file(ckpt), "bytes": ckpt.stat().st_size,
            "dict_sha256": sha256_file(dst.path("dictionary")), "bpe_sha256": sha256_file(dst.path("bpe_model")),
            "retrain": (f".venv/bin/snakemake --profile profiles/local --configfile {config} --config pretrained=null "
                        f"-- {run.path('checkpoint', lm=lm)}")}
    write_json(dst.path("model_card", lm=lm), card)
    dst.path("model_card_md", lm=lm).write_text(card_markdown(card))
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
            f"- updates: {card['updates']:,} ({card['epochs']} epochs of {lm['max_tokens']:,} tokens per update; the "
            f"weights are those of update {card.get('checkpoint_update', card['updates']):,}), "
            f"lr {lm['lr']} ({lm.get('lr_scheduler', 'inverse_sqrt')}, warm-up {lm['warmup_updates']})\n"
            f"- converged: {card['converged']} (last evaluation changed valid perplexity by "
            f"{100 * (card['last_gain'] or 0):+.2f} %)"
            + (f"; continued from `{card['lms_entry'].get('init_from')}` for a set number of updates (its last "
               f"checkpoint: App. E.6.1's LM trained further without dropout), so no plateau is sought: the findings "
               f"check whether it memorised its training set\n" if card["train"].get("checkpoint") == "last" else "\n")
            + f"- valid perplexity: {card['valid']['ppl_token']:.2f} per token, {card['valid'].get('ppl_word', 0):.2f} "
            f"per word (fp32 weights: {card['valid']['fp32_ppl_token']:.2f} per token)\n"
            f"- test perplexity: {card['test']['ppl_token']:.2f} per token, {card['test'].get('ppl_word', 0):.2f} per "
            f"word (context window {card['eval']['context_window']} of {card['eval']['tokens_per_sample']})\n"
            f"- sha256: `{card['sha256']}` ({card['bytes']:,} bytes); dictionary `{card['dict_sha256']}`; BPE model "
            f"`{card['bpe_sha256']}`\n"
            f"- retrain: `{card['retrain']}`\n\n"
            f"Valid curve (per-token perplexity at each evaluation):\n\n| update | valid PPL |\n|---:|---:|\n{curve}\n")


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m knnlm.lm.shipped", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="ship a run's trained LM into pretrained/<config>")
    e.add_argument("run", type=Path, help="the run directory, e.g. results/wikitext2")
    e.add_argument("lm", help="the LM's name in config 'lms'")
    e.add_argument("--config", required=True, type=Path, help="the config it was trained with")
    e.add_argument("--out", required=True, type=Path, help="the folder of shipped LMs, e.g. pretrained/wikitext2")
    e.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    card = export(a.run, a.lm, a.config, a.out, a.threads)
    print(json.dumps({k: card[k] for k in ("name", "dtype", "updates", "epochs", "converged", "valid", "test",
                                            "sha256", "bytes")}, indent=1))


if __name__ == "__main__":
    main()
