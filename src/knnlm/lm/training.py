"""Base LM: fairseq-preprocess and fairseq-train of a pre-norm transformer_lm with a plain softmax.

Thin wrappers around fairseq's own CLIs (run as subprocesses of this Python), which add atomic outputs,
logging of the training curve, and the settings the paper's key types assume (Xu et al. 2023, Sec. 3):
--decoder-normalize-before (pre-norm: att is the input of the last FFN after its LayerNorm), input/output dims equal
to the embed dim (att and ffn keys of one dimension), no adaptive softmax (one output matrix W_sm).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..io import ArtifactError, atomic_path, load_checkpoint

log = logging.getLogger(__name__)


def _env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), MKL_DYNAMIC="FALSE", PYTHONUNBUFFERED="1")
    return env


def preprocess(bpe: dict[str, str | Path], out_dir: str | Path, workers: int = 2,
               dictionary: str | Path | None = None) -> None:
    """fairseq-preprocess --only-source of the BPE files bpe[train|valid|test] into out_dir (atomic directory), with
    the fairseq dict.txt `dictionary` when given (--srcdict; else one built from train)."""
    with atomic_path(out_dir) as tmp:
        cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
               "--trainpref", str(bpe["train"]), "--validpref", str(bpe["valid"]),
               "--testpref", str(bpe["test"]), "--destdir", str(tmp), "--workers", str(workers)]
        cmd += ["--srcdict", str(dictionary)] if dictionary else []
        log.info("running %s", " ".join(cmd))
        subprocess.run(cmd, check=True, env=_env(workers))


def preprocess_with_dictionary(bpe_file: str | Path, dict_txt: str | Path, out_dir: str | Path, workers: int = 2) -> None:
    """fairseq-preprocess --only-source of one BPE file as split 'train' of out_dir, with the given dictionary (the
    LM's: config 'datastore.data' binarises the datastore's own text with it; atomic directory)."""
    with atomic_path(out_dir) as tmp:
        cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict", str(dict_txt),
               "--trainpref", str(bpe_file), "--destdir", str(tmp), "--workers", str(workers)]
        log.info("running %s", " ".join(cmd))
        subprocess.run(cmd, check=True, env=_env(workers))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def train_command(lm: dict, data_bin: str | Path, save_dir: str | Path, threads: int, init_from: str | Path | None = None,
                  teacher: str | Path | None = None, soft_label_weight: float = 0.5) -> list[str]:
    """The fairseq-train command for config section 'lm' (pre-norm transformer_lm, plain softmax).

    init_from: a checkpoint of the same architecture to continue training from (--finetune-from-model: weights
    loaded, optimizer, schedule and data order restarted, 'max_update' counts the updates from there; App. E.6.1).
    teacher: a checkpoint over the same dictionary whose distribution is the soft label (knnlm.lm.soft_labels, App.
    E.6.2) with weight soft_label_weight."""
    d = lm["decoder_embed_dim"]
    cmd = [
        sys.executable, "-m", "knnlm.lm.soft_labels" if teacher else "fairseq_cli.train", str(data_bin),
        "--task", "language_modeling", "--arch", "transformer_lm",
        "--decoder-normalize-before", "--share-decoder-input-output-embed",
        "--decoder-layers", str(lm["decoder_layers"]), "--decoder-embed-dim", str(d),
        "--decoder-input-dim", str(d), "--decoder-output-dim", str(d),
        "--decoder-ffn-embed-dim", str(lm["decoder_ffn_embed_dim"]),
        "--decoder-attention-heads", str(lm["decoder_attention_heads"]),
        "--dropout", str(lm["dropout"]),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01", "--clip-norm", "0.0",
        "--lr", str(lm["lr"]), "--lr-scheduler", lm.get("lr_scheduler", "inverse_sqrt"),
        "--warmup-updates", str(lm["warmup_updates"]), "--warmup-init-lr", "1e-07",
        "--tokens-per-sample", str(lm["tokens_per_sample"]), "--sample-break-mode", "none",
        "--max-tokens", str(lm["max_tokens"]), "--max-update", str(lm["max_update"]),
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--seed", str(lm["seed"]),
        "--log-format", "json", "--log-interval", "25", "--num-workers", "0",
    ]
    if not _cuda_available():
        cmd.append("--cpu")
    if lm.get("lr_scheduler") == "cosine":  # one half-cosine from lr down to 0 at max_update (a fixed budget)
        cmd += ["--min-lr", "0"]
    if lm.get("validate_interval_updates"):
        cmd += ["--validate-interval-updates", str(lm["validate_interval_updates"])]
    if init_from:
        cmd += ["--finetune-from-model", str(Path(init_from).resolve())]
    if teacher:
        cmd += ["--criterion", "soft_label_cross_entropy", "--teacher-checkpoint", str(Path(teacher).resolve()),
                "--soft-label-weight", str(soft_label_weight)]
    return cmd


def _fairseq_records(lines):
    """The JSON records (dicts) of fairseq --log-format json lines, in order; other lines are skipped."""
    for line in lines:
        brace = line.find("{")
        if brace < 0:
            continue
        try:
            rec = json.loads(line[brace:])
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            yield rec


def parse_fairseq_json_log(lines) -> dict[str, list[tuple[int, float]]]:
    """Training curve from fairseq's --log-format json output: {'train_loss': [(update, loss base 2)] (every
    log interval), 'train_loss_epoch' (each epoch's average), 'valid_loss': ...}."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for rec in _fairseq_records(lines):
        if "valid_loss" in rec and "valid_num_updates" in rec:
            step = int(float(rec["valid_num_updates"]))
            curves.setdefault("valid_loss", []).append((step, float(rec["valid_loss"])))
            if "valid_ppl" in rec:
                curves.setdefault("valid_ppl", []).append((step, float(rec["valid_ppl"])))
        elif "loss" in rec and "num_updates" in rec:
            step = int(float(rec["num_updates"]))
            curves.setdefault("train_loss", []).append((step, float(rec["loss"])))
            if "wps" in rec:
                curves.setdefault("train_wps", []).append((step, float(rec["wps"])))
        elif "train_loss" in rec and "train_num_updates" in rec:  # an epoch's average, logged at its end
            step = int(float(rec["train_num_updates"]))
            curves.setdefault("train_loss_epoch", []).append((step, float(rec["train_loss"])))
    return curves


LM_CONVERGED_GAIN = 0.01  # the last evaluation improved valid perplexity by less than 1 %: converged


def convergence(curves: dict[str, list[tuple[int, float]]], max_update: int,
                tolerance: float = LM_CONVERGED_GAIN) -> dict:
    """Whether a trained base LM converged, from its training curve (parse_fairseq_json_log: 'valid_loss' =
    [(update, loss in bits per token)], 'train_loss'); the base-LM row of every table says so.

    'still_falling' is True when the last evaluation is the best so far and improved valid perplexity by at least
    `tolerance` (relative) over the one before it (over the one before that when the last came less than half an
    evaluation interval after it, as fairseq's extra validation at max_update does): more updates would very likely
    lower it further, so the LM is under-trained. Returns {'updates' (last logged update), 'max_update', 'evaluations',
    'valid' [(update, perplexity)], 'best_update', 'train_loss_last' (the last logged training loss, a log interval's or
    an epoch's average, bits per token; None without one),
    'last_gain' (relative perplexity change of the last evaluation, negative = better;
    None with one evaluation), 'still_falling', 'converged': 'yes' | 'no (valid loss still falling)' | 'unknown (one
    evaluation)'}. Raises ValueError when the curve has no valid evaluation."""
    valid = sorted({u: loss for u, loss in curves.get("valid_loss", [])}.items())  # a resumed log repeats updates
    if not valid:
        raise ValueError("the training log has no valid evaluation ('valid_loss'): cannot say whether the LM converged")
    ppl = [(u, 2.0 ** loss) for u, loss in valid]
    best_update = min(ppl, key=lambda x: x[1])[0]
    train = sorted(curves.get("train_loss", []) + curves.get("train_loss_epoch", []), key=lambda x: x[0])
    updates = max([u for u, _ in train] + [valid[-1][0]])
    # fairseq validates at the end of every epoch and once more at max_update: an evaluation a few updates after the
    # one before it says nothing about a plateau, so the gain is measured against the evaluation before that one
    prev = -2
    if len(ppl) >= 3:
        steps = np.diff([u for u, _ in ppl[:-1]])
        if ppl[-1][0] - ppl[-2][0] < 0.5 * float(np.median(steps)):
            prev = -3
    gain = ppl[-1][1] / ppl[prev][1] - 1 if len(ppl) > 1 else None
    falling = gain is not None and ppl[-1][1] <= min(p for _, p in ppl) and gain <= -tolerance
    converged = ("unknown (one evaluation)" if gain is None else "no (valid loss still falling)" if falling else "yes")
    return {"updates": int(updates), "max_update": int(max_update), "evaluations": len(ppl), "valid": ppl,
            "train_loss_last": float(train[-1][1]) if train else None,
            "best_update": int(best_update), "last_gain": gain, "still_falling": bool(falling), "converged": converged,
            "tolerance": tolerance}


def convergence_label(training: dict | None, who: str = "Base LM") -> str:
    """One sentence for a table caption: how long the LM `who` trained and whether it converged (convergence); for
    an LM this run did not train (training None), says so."""
    if training is None:
        return f"{who}: not trained by this run (config 'lms'); its convergence is not recorded here."
    gain = training["last_gain"]
    last = (f"; the last of {training['evaluations']} valid evaluations changed perplexity by {100 * gain:+.1f} %"
            if gain is not None else "")
    verdict = {"yes": "converged", "no (valid loss still falling)": "under-trained (valid loss still falling)"}.get(
        training["converged"], training["converged"])
    best = min(p for _, p in training["valid"])  # fairseq's validation: blocks without the context window
    return (f"{who}: {training['updates']:,} of {training['max_update']:,} updates, best valid perplexity (per token, "
            f"fairseq's validation in blocks without the context window) {best:.2f} at update "
            f"{training['best_update']:,}{last}: {verdict} "
            f"(converged = the last evaluation gained less than {100 * training['tolerance']:.0f} %).")


def fairseq_log_seconds(lines) -> tuple[float, float, int]:
    """Training wall time in a fairseq --log-format json log appended to across resumes: (seconds, seconds_all,
    segments).

    fairseq's 'wall' counts seconds since its process started, so each drop of 'wall' begins a new segment (a
    resumed run). seconds_all sums each segment's last 'wall': all the time logged, updates that a segment repeats
    (it resumed from a checkpoint before where the last one stopped) included. seconds counts each update once, as
    an uninterrupted run would: the 'wall' increments up to records whose update ('num_updates', or
    'valid_num_updates') no earlier segment reached. Neither counts a killed segment's time after its last record.
    (0.0, 0.0, 0) for a log without any 'wall'."""
    once = every = 0.0
    last, segments, reached, seg_reached = None, 0, -1, -1
    for rec in _fairseq_records(lines):
        if "wall" not in rec:
            continue
        wall = float(rec["wall"])
        update = int(float(rec.get("num_updates", rec.get("valid_num_updates", -1))))
        if last is None or wall < last:  # a new process: its clock starts at 0
            every += last or 0.0
            segments, reached, last = segments + 1, max(reached, seg_reached), 0.0
        if update > reached:
            once += wall - last
        seg_reached, last = max(seg_reached, update), wall
    return once, every + (last or 0.0), segments


# the fewest windows of tokens_per_sample tokens a train split must hold to be trained on (one batch of two samples):
# fewer, and fairseq-train stops with an error of its own in its log, not naming the split
MIN_TRAIN_WINDOWS = 2


def check_train_split(data_bin: str | Path, tokens_per_sample: int) -> int:
    """The train split's tokens in the binarized data folder `data_bin` (fairseq-preprocess's train.idx), checked
    before fairseq-train runs: at least MIN_TRAIN_WINDOWS windows of tokens_per_sample tokens. Returns the count.
    Raises ArtifactError naming the file, the tokens it has and the tokens needed."""
    from fairseq.data import MMapIndexedDataset

    from ..io import ArtifactError

    prefix = Path(data_bin) / "train"
    if not Path(f"{prefix}.idx").is_file():
        raise ArtifactError(f"{prefix}.idx: no binarized train split (run the job that prepares the data)")
    ds = MMapIndexedDataset(str(prefix))
    tokens = int(ds.sizes.sum())
    del ds  # its memory map: not kept alive by a traceback's frame
    need = MIN_TRAIN_WINDOWS * tokens_per_sample
    if tokens < need:
        raise ArtifactError(f"{prefix}.bin: the train split has {tokens:,} tokens, too few to train an LM on: at least "
                            f"{MIN_TRAIN_WINDOWS} windows of config 'lm.tokens_per_sample' = {tokens_per_sample} tokens "
                            f"({need:,}) are needed; give a longer train split (config 'data.files')")
    return tokens


def train(lm: dict, data_bin: str | Path, work_dir: str | Path, out_checkpoint: str | Path, threads: int,
          log_file: str | Path, on_log=None, init_from: str | Path | None = None, teacher: str | Path | None = None,
          soft_label_weight: float = 0.5, keep: str = "best") -> dict[str, list[tuple[int, float]]]:
    """Run fairseq-train; copy the best checkpoint (lowest valid loss; keep='last': the last one, as an overfitted
    LM of App. E.6.1 is taken where its training stopped) to out_checkpoint atomically.

    Resumable: fairseq restarts from checkpoint_last.pt if a previous run was killed. The fairseq save dir
    is work_dir/<hash of the 'lm' config, the init_from and teacher checkpoints' contents and the weight>, so a
    changed architecture or starting point never resumes from an incompatible checkpoint. init_from, teacher,
    soft_label_weight: see train_command. Returns the training curve (see parse_fairseq_json_log). Raises
    ArtifactError if the checkpoint to keep was not written. on_log(step, {name: value}) is called for every fairseq
    log record as it is printed (live curves: knnlm.job.Job.curve).
    """
    from ..io import sha256_file

    if keep not in ("best", "last"):
        raise ValueError(f"keep must be 'best' or 'last', found {keep!r}")
    check_train_split(data_bin, int(lm["tokens_per_sample"]))
    ident = {"lm": lm, **({"init_from": sha256_file(init_from)} if init_from else {}),
             **({"teacher": sha256_file(teacher), "soft_label_weight": soft_label_weight} if teacher else {})}
    digest = hashlib.sha256(json.dumps(ident if len(ident) > 1 else lm, sort_keys=True).encode()).hexdigest()[:12]
    work_dir = Path(work_dir) / f"lm-{digest}"
    work_dir.mkdir(parents=True, exist_ok=True)
    done = trained_updates(work_dir / "checkpoint_last.pt")
    if done is not None and done >= int(lm["max_update"]):
        # fairseq resumed from a finished run's checkpoint_last still takes one more update before it stops
        log.info("%s already holds a run of %d updates (max_update %d): fairseq-train not rerun", work_dir, done,
                 int(lm["max_update"]))
    else:
        _run_fairseq(train_command(lm, data_bin, work_dir, threads, init_from, teacher, soft_label_weight), threads,
                     log_file, on_log)
    best = work_dir / f"checkpoint_{keep}.pt"
    if not best.is_file():
        raise ArtifactError(f"fairseq-train finished without {best}")
    with atomic_path(out_checkpoint) as tmp:
        shutil.copyfile(best, tmp)
    with open(log_file) as lf:
        return parse_fairseq_json_log(lf)


def trained_updates(checkpoint: str | Path) -> int | None:
    """The number of updates a fairseq checkpoint was saved at ('optimizer_history'[-1]['num_updates']); None when
    the file does not exist. The checkpoint is memory-mapped, not read whole."""
    import torch

    if not Path(checkpoint).is_file():
        return None
    state = load_checkpoint(checkpoint, mmap=True)
    return int(state["optimizer_history"][-1]["num_updates"])


def _run_fairseq(cmd: list[str], threads: int, log_file: str | Path, on_log, poll_s: float = 0.5) -> None:
    """Run a fairseq-train command line with its output appended to log_file by the operating system (fairseq's
    stdout and stderr are the file itself), and follow the file: each new line is copied to stderr and every log
    record passed to on_log(step, {name: value}).

    fairseq logs a validation before it saves the checkpoint that follows it, and flushes every record, so a log
    written this way holds every record up to the last checkpoint even when the job is killed (SIGKILL, a lost node)
    while it is still copying lines: a finished run that is not rerun (see train) still has its whole curve. Raises
    RuntimeError when fairseq fails."""
    log.info("running %s", " ".join(cmd))
    log_file = Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out, open(log_file, "rb") as follow:
        follow.seek(0, os.SEEK_END)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(threads))
        pending = b""

        def drain() -> None:
            nonlocal pending
            pending += follow.read()
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", errors="replace") + "\n"
                sys.stderr.write(line)
                if on_log is not None:
                    for name, points in parse_fairseq_json_log([line]).items():
                        for step, value in points:
                            on_log(step, {name: value})

        while proc.poll() is None:
            time.sleep(poll_s)
            drain()
        drain()
        if pending:
            pending += b"\n"
            drain()
        if proc.returncode != 0:
            raise RuntimeError(f"fairseq-train failed with exit code {proc.returncode}; log: {log_file}")
