"""The spine every experiment reads: corpus → BPE → fairseq data → base LM → datastore (train keys + vals)
and queries (valid/test: att/ffn queries, targets, the LM's log-probs). Xu et al. 2023, Sec. 2-3.

Jobs (knnlm.cli.resolve): download, prepare_data, bpe, preprocess, train_lm, dump_datastore, dump_queries.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..job import Job

log = logging.getLogger(__name__)
SPLITS = ("train", "valid", "test")


def download(job: Job) -> None:
    """Fetch the corpus named by config 'data.url' into 'data.dir' (needs internet; no test runs it)."""
    from ..data import download as fetch

    fetch(job.cfg)


def download_lm(job: Job) -> dict:
    """Fetch the checkpoint of fairseq LM {lm} from config 'lms.<lm>.url' to its 'path' (atomic; needs internet; no
    test runs the download). Checked against 'lms.<lm>.sha256' when given (ConfigError naming the key otherwise); its
    sha256 is logged either way, so that a config can pin it."""
    import urllib.request

    from ..config import ConfigError
    from ..io import atomic_path, sha256_file

    name = job.wildcards["lm"]
    lm = job.cfg["lms"][name]
    out = job.path("checkpoint")
    with atomic_path(out) as tmp:
        log.info("downloading %s", lm["url"])
        urllib.request.urlretrieve(lm["url"], tmp)
        got = sha256_file(tmp)
        if lm.get("sha256") and got != lm["sha256"]:
            raise ConfigError(f"config key 'lms.{name}.sha256': expected {lm['sha256']}, {lm['url']} has {got}")
    if not lm.get("sha256"):
        log.warning("config key 'lms.%s.sha256' is empty: %s has sha256 %s (pin it in the config)", name, out, got)
    return {"params": {"url": lm["url"], "sha256": got}}


def prepare_data(job: Job) -> dict:
    """The (sliced) splits and their word counts (WikiText convention: whitespace words + one <eos> per line)."""
    from ..data import prepare_splits

    out = dict(zip(SPLITS, job.paths("splits")))
    stats = prepare_splits(job.cfg, out, job.path("wordcounts"))
    return {"metrics": {f"{s}_{k}": v[k] for s, v in stats.items() for k in ("lines", "words")},
            "artifacts": [job.path("wordcounts")]}


def bpe(job: Job) -> dict:
    """A sentencepiece BPE model trained on train, and every split encoded with it (config 'bpe.type: none': the
    splits' own whitespace tokens)."""
    from ..data import encode_bpe, train_bpe
    from ..io import write_json

    b = job.cfg["bpe"]
    if b["type"] == "none":  # a word-level LM: the corpus's own tokens
        from ..data import encode_words

        stats = {s: encode_words(src, dst) for s, src, dst in zip(SPLITS, job.paths("splits"), job.paths("bpe"))}
        write_json(job.path("stats"), stats)
        return {"metrics": {f"{s}_tokens": v["tokens"] for s, v in stats.items()}, "artifacts": [job.path("stats")]}
    model = job.path("model")
    if job.input.get("given"):  # config 'pretrained': the BPE model the shipped LMs were trained with
        import shutil

        from ..io import atomic_path

        for src in job.paths("given"):
            with atomic_path(model.with_suffix(Path(src).suffix)) as tmp:
                shutil.copyfile(src, tmp)
    else:
        train_bpe(dict(zip(SPLITS, job.paths("splits")))["train"], model.with_suffix(""), b["vocab_size"],
                  b["character_coverage"], b["seed"], job.threads)
    stats = {s: encode_bpe(model, src, dst) for s, src, dst in zip(SPLITS, job.paths("splits"), job.paths("bpe"))}
    write_json(job.path("stats"), stats)
    return {"metrics": {f"{s}_tokens": v["tokens"] for s, v in stats.items()}, "artifacts": [job.path("stats")]}


def preprocess(job: Job) -> dict:
    """fairseq-preprocess of the BPE splits (dictionary + binarised data; config 'bpe.dictionary': that one)."""
    from ..lm.training import preprocess as fairseq_preprocess

    out = job.path("data_bin")
    fairseq_preprocess(dict(zip(SPLITS, job.paths("bpe"))), out, workers=job.threads,
                       dictionary=job.path("dictionary") if job.input.get("dictionary") else None)
    return {"metrics": {"dict_size": sum(1 for _ in open(out / "dict.txt"))}}


def datastore_corpus(job: Job) -> dict:
    """Config 'datastore.data' (Khandelwal et al. 2020, Sec. 4.3: a datastore from another corpus than the LM's):
    the train split (with 'with_train') then each file, as one text ('text'), its description ('corpus': files,
    sha256, lines, words, label) and, for fairseq LMs, its BPE ('bpe') binarised with the LM's dictionary
    ('datastore_bin'). Raises ConfigError naming 'datastore.data.files' for a missing, non-UTF-8 or empty file."""
    from ..config import ConfigError
    from ..data import count_words, encode_bpe, encode_words
    from ..io import atomic_path, sha256_file, write_json
    from ..lm.training import preprocess_with_dictionary

    spec = job.cfg["datastore"]["data"]
    sources = ([("train split", job.path("train"))] if spec["with_train"] else []) + \
        [(Path(f).name, Path(f)) for f in spec["files"]]
    files = []
    with atomic_path(job.path("text")) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for name, src in sources:
            if not Path(src).is_file():
                raise ConfigError(f"config key 'datastore.data.files': {src} not found")
            try:
                text = Path(src).read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"config key 'datastore.data.files': {src} is not UTF-8 ({e})") from None
            if not text.strip():
                raise ConfigError(f"config key 'datastore.data.files': {src} has no words")
            out.write(text if text.endswith("\n") else text + "\n")
            files.append({"name": name, "path": str(src), "sha256": sha256_file(src), **count_words(src)})
    label = spec.get("name") or " + ".join(f["name"] for f in files)
    corpus = {"label": label, "with_train": spec["with_train"], "files": files, "sha256": sha256_file(job.path("text")),
              **count_words(job.path("text"))}
    if job.input.get("data_bin"):  # fairseq LMs: the LM's tokens (BPE, or words with 'bpe.type: none')
        corpus["bpe"] = (encode_bpe(job.path("bpe_model"), job.path("text"), job.path("bpe")) if job.input.get("bpe_model")
                         else encode_words(job.path("text"), job.path("bpe")))
        preprocess_with_dictionary(job.path("bpe"), job.path("data_bin") / "dict.txt", job.path("datastore_bin"),
                                   job.threads)
    write_json(job.path("corpus"), corpus)
    return {"metrics": {"lines": corpus["lines"], "words": corpus["words"]}, "params": {"corpus": label},
            "artifacts": [job.path("corpus")]}


def train_lm(job: Job) -> dict:
    """fairseq-train of a base LM (resumable from its work dir); the valid curve is logged per update. Inputs 'init'
    (continue that checkpoint, App. E.6.1) and 'teacher' (soft labels, App. E.6.2) when the 'lms' entry names them;
    cfg 'train': {'checkpoint': 'best' | 'last', 'soft_label_weight'}."""
    from ..io import write_json
    from ..lm.training import convergence, train

    opts = job.cfg.get("train", {})
    curves = train(job.cfg["lm"], job.path("data_bin"), job.extra["work_dir"], job.path("checkpoint"), job.threads,
                   job.extra["fairseq_log"], on_log=job.curve,
                   init_from=job.path("init") if "init" in job.input else None,
                   teacher=job.path("teacher") if "teacher" in job.input else None,
                   soft_label_weight=opts.get("soft_label_weight", 0.5), keep=opts.get("checkpoint", "best"))
    best = min(curves.get("valid_loss", [(0, float("nan"))]), key=lambda x: x[1])
    training = convergence(curves, job.cfg["lm"]["max_update"])
    write_json(job.path("training"), training)
    return {"metrics": {"best_valid_loss_base2": best[1], "best_valid_update": best[0],
                        "still_falling": int(training["still_falling"])},
            "params": {"converged": training["converged"]}, "step_metrics": curves,
            "artifacts": [job.extra["fairseq_log"], job.path("training")]}


def pretrained_lm(job: Job) -> dict:
    """A shipped LM (config 'pretrained', knnlm.lm.shipped) in place of training it: its checkpoint must match its
    model card's sha256, the 'lm' section (and App. E.6 options) this config would train it with, and the run's
    dictionary; then the checkpoint and its training record are copied to the LM's outputs. Raises ArtifactError
    naming config key 'pretrained' and the file otherwise (retrain with --config pretrained=null)."""
    import shutil

    from ..io import ArtifactError, atomic_path, read_json
    from ..lm.fairseq import check_checkpoint, check_dictionary

    lm = job.wildcards["lm"]
    key = f"pretrained (LM {lm!r})"
    card = check_checkpoint(job.input["checkpoint"], key)
    if card is None:
        raise ArtifactError(f"config key 'pretrained': {job.path('card')} is missing beside {job.input['checkpoint']}")
    want = {"lm": job.cfg["lm"], "train": job.cfg.get("train", {})}
    have = {"lm": card["lm"], "train": card.get("train", {})}
    if want != have:
        diff = sorted(k for k in set(want["lm"]) | set(have["lm"]) if want["lm"].get(k) != have["lm"].get(k))
        raise ArtifactError(f"config key 'pretrained': {job.input['checkpoint']} was trained with another config than "
                            f"this run's for LM {lm!r} (differs in {diff or 'train options'}: card "
                            f"{ {k: have['lm'].get(k) for k in diff} }, config { {k: want['lm'].get(k) for k in diff} }); "
                            f"retrain it with --config pretrained=null")
    check_dictionary(job.input["checkpoint"], job.path("data_bin") / "dict.txt", key)
    for name in ("checkpoint", "training"):
        with atomic_path(job.output[name]) as tmp:
            shutil.copyfile(job.input[name], tmp)
    training = read_json(job.input["training"])
    return {"metrics": {"updates": card["updates"], "valid_ppl_token": card["valid"]["ppl_token"],
                        "test_ppl_token": card["test"]["ppl_token"]},
            "params": {"converged": training["converged"], "checkpoint_sha256": card["sha256"],
                       "pretrained": str(job.input["checkpoint"])}}


def register_hf(job: Job) -> dict:
    """The model card of a Hugging Face base LM (knnlm.lm.hf.model_card): what identifies its weights and tokenizer."""
    from ..lm.hf import model_card
    from ..io import write_json

    lm = job.cfg["lms"][job.wildcards["lm"]]
    card = model_card(lm["path"], lm["revision"], lm["dtype"])
    write_json(job.path("card"), card)
    return {"metrics": {"parameters": card["parameters"], "vocab_size": card["vocab_size"]},
            "params": {"model_class": card["class"]}, "artifacts": [job.path("card")]}


def lm_pass(job: Job, split: str):
    """The job's base LM over `split` (knnlm.lm.LMPass), run by the backend whose weights the rule gives
    (knnlm.lm.backend_of: a fairseq 'checkpoint' over 'data_bin', or a Hugging Face 'model_card' and the split's
    'text')."""
    from .common import lm_backend

    impl, files = lm_backend(job)
    return impl.lm_pass(files, split, job.cfg, job.wildcards.get("lm", ""))


def dump_datastore(job: Job) -> dict:
    """One pass of the frozen LM over train (or config 'datastore.data''s text, input 'corpus'): att and ffn keys,
    vals, manifest (naming the corpus)."""
    from ..datastore.dump import dump_datastore as dump
    from ..io import read_json

    keys = {"att": job.path("keys_att"), "ffn": job.path("keys_ffn")}
    corpus = read_json(job.path("corpus")) if job.input.get("corpus") else None  # config 'datastore.data'
    man = dump(lm_pass(job, "train"), keys, job.path("vals"), job.path("manifest"), job.threads,
               extra={"corpus": corpus["label"] if corpus else "train split",
                      **({"corpus_files": corpus["files"], "corpus_sha256": corpus["sha256"]} if corpus else {})})
    size = sum(p.stat().st_size for p in [*keys.values(), job.path("vals")])
    return {"metrics": {"N": man["N"], "D": man["D"], "bytes_on_disk": size}, "artifacts": [job.path("manifest")]}


def dump_queries(job: Job) -> dict:
    """One pass over a valid/test split: targets, the LM's log-probs, att and ffn queries, manifest; for a Hugging
    Face LM also its tokens' lines and words ('token_lines', checked against the split's word count)."""
    from ..datastore.dump import dump_queries as dump
    from ..io import ArtifactError, read_json
    from ..scoring.interpolation import perplexity
    from ..data import save_token_lines

    split = job.wildcards["split"]
    names = ("targets", "lm_logprobs", "queries_att", "queries_ffn", "manifest")
    lm = lm_pass(job, split)
    words = read_json(job.path("wordcounts"))[split]["words"]
    if "token_lines" in job.output:
        tl = lm.tokens(split)
        if int(tl["words"].sum()) != words:
            raise ArtifactError(f"{job.path('text')}: the tokens hold {int(tl['words'].sum())} words, the split has "
                                f"{words} ({job.path('wordcounts')})")
        save_token_lines(job.path("token_lines"), tl)
    man = dump(lm, split, {n: job.path(n) for n in names}, job.threads)
    lp = np.load(job.path("lm_logprobs"))
    m = {"T": man["T"], "lm_ppl_word": perplexity(lp, words), "lm_ppl_token": perplexity(lp, len(lp))}
    log.info("base LM on %s: %s", split, m)
    return {"metrics": m, "artifacts": [job.path("manifest")]}


def token_lines(job: Job) -> dict:
    """The targets of a fairseq LM over a split (its BPE pieces + one <eos> per line): the line and words of each
    (knnlm.data.bpe_token_lines)."""
    from ..data import bpe_token_lines, save_token_lines

    tl = bpe_token_lines(job.path("bpe"))
    save_token_lines(job.path("out"), tl)
    return {"metrics": {"T": len(tl["line"]), "words": int(tl["words"].sum())}}


def documents(job: Job) -> dict:
    """The documents of a valid/test split for one LM's tokens (knnlm.statistics.intervals, config 'stats'): 'doc' [T]
    int32 document id per target, 'words' [T] int16 words starting at each target, 'tokens' [D] int64 per document,
    'scheme' (the scheme used: 'auto' resolves to 'wikitext', 'blank_lines' or 'blocks') and 'block_tokens'.
    Raises ValueError naming config key 'stats.documents' and the text file when the split has one document."""
    from ..io import atomic_path
    from ..statistics.documents import SCHEME_NAMES, check_documents, split_token_documents

    st = job.cfg["stats"]
    tl = np.load(job.path("token_lines"))
    doc, scheme, block = split_token_documents(job.path("text"), tl["line"], st["documents"], st["block_tokens"],
                                               st["target_documents"], st["min_block_tokens"])
    tokens = np.bincount(doc).astype(np.int64)
    check_documents(len(tokens), f"{job.path('text')} ({len(doc)} tokens)", st["documents"])
    if len(tokens) < st["min_documents"]:
        log.warning("%s: %d documents (%s), fewer than stats.min_documents = %d: every comparison on it is "
                    "inconclusive", job.path("text"), len(tokens), SCHEME_NAMES[scheme], st["min_documents"])
    with atomic_path(job.path("out")) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, doc=doc, words=tl["words"], tokens=tokens, scheme=np.array(scheme), block_tokens=block)
    return {"metrics": {"documents": len(tokens), "median_tokens": float(np.median(tokens)) if len(tokens) else 0.0,
                        "block_tokens": block}, "params": {"documents_scheme": scheme}}
