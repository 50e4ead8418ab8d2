# The spine every experiment reads (knnlm.experiments.spine). The corpus: raw splits -> (sliced) copies + word
# counts -> sentencepiece BPE -> fairseq binarised data.
# Corpus-level artifacts are shared by every base LM of the run that uses this tokenizer; each LM's tokens
# get their own documents (a Hugging Face LM tokenises the text itself).

if CFG["data"]["download"]:

    rule download:
        output:
            splits=[str(p) for p in split_files(CFG).values()],
        log:
            log_of("download"),
        conda:
            ENV
        params:
            cfg=cfg_json("data"),
            io=io(),
            rule="download",
        shell:
            knnlm("spine.download")


# config 'lms.<lm>.url': a published fairseq checkpoint fetched to 'lms.<lm>.path' (sha256 checked when given).
for _name in [n for n in LMS if not BACKEND[n].weights_artifact and CFG["lms"][n]["url"]]:

    rule:
        name:
            f"download_lm_{_name.replace('-', '_').replace('.', '_')}"
        output:
            checkpoint=CFG["lms"][_name]["path"],
        log:
            log_of(f"download_lm_{_name}"),
        conda:
            ENV
        params:
            cfg=quoted_cfg(lms={_name: CFG["lms"][_name]}),
            io=io(fixed={"lm": _name}),
            rule=f"download_lm_{_name.replace('-', '_').replace('.', '_')}",
        shell:
            knnlm("spine.download_lm")


# ancient(): the raw corpus (a folder or one archive) is often a shared, re-mounted directory or a fresh clone whose
# mtimes change, so a newer mtime alone does not rerun the whole DAG. Its content is pinned by data.sha256 (checked
# by this job); without it (an own corpus), the raw files' sha256, read when the DAG is built (cached by size, mtime,
# ctime and inode once the run's folder exists), are in this job's params, so an edited raw file reruns it and
# everything that rests on it.
RAW_SHA256 = (
    {}
    if CFG["data"].get("sha256") or CFG["data"].get("download")
    else sha256_files(data_inputs(CFG), LAYOUT.path("raw_checksums") if LAYOUT.root.is_dir() else None)
)
knnlm_rule(
    "prepare_data",
    "spine.prepare_data",
    input=files(
        raw=[ancient(str(p)) for p in data_inputs(CFG)],
    ),
    output=files(
        splits=[artifact("split_tokens", split=s) for s in SPLITS],
        wordcounts=artifact("wordcounts"),
    ),
    cfg=quoted_cfg("data", raw_sha256=RAW_SHA256) if RAW_SHA256 else cfg_json("data"),
)


knnlm_rule(
    "bpe",
    "spine.bpe",
    input=files(
        splits=[artifact("split_tokens", split=s) for s in SPLITS],
        # config 'pretrained': the BPE model the shipped LMs were trained with, used instead of training one
        given=PRETRAINED_BPE,
    ),
    output=files(
        # 'bpe.type: none' (a word-level LM): no BPE model, the splits' own whitespace tokens
        **({"model": artifact("bpe_model"), "vocab": artifact("bpe_vocab")} if CFG["bpe"]["type"] != "none" else {}),
        bpe=[artifact("bpe_split", split=s) for s in SPLITS],
        stats=artifact("bpe_stats"),
    ),
    cfg=cfg_json("bpe"),
    threads=THREADS,
)


knnlm_rule(
    "preprocess",
    "spine.preprocess",
    input=files(
        bpe=[artifact("bpe_split", split=s) for s in SPLITS],
        dictionary=ancient(CFG["bpe"]["dictionary"]) if CFG["bpe"]["dictionary"] else [],  # a published LM's dict.txt
    ),
    output=files(
        data_bin=directory(artifact("data_bin")),
    ),
    cfg=cfg_json(),
    threads=THREADS,
)


# config 'datastore.data' (Khandelwal et al. 2020, Sec. 4.3, domain adaptation): the datastore's own text, and for
# fairseq LMs its BPE binarised with the LM's dictionary; read only by dump_datastore.
if DATASTORE_DATA:

    knnlm_rule(
        "datastore_corpus",
        "spine.datastore_corpus",
        input=files(
            train=artifact("split_tokens", split="train") if DATASTORE_DATA["with_train"] else [],
            files=[ancient(f) for f in DATASTORE_DATA["files"]],
            **({"data_bin": artifact("data_bin")} if FAIRSEQ_LMS else {}),
            **({"bpe_model": artifact("bpe_model")} if FAIRSEQ_LMS and CFG["bpe"]["type"] != "none" else {}),
        ),
        output=files(
            text=artifact("datastore_text"),
            corpus=artifact("datastore_corpus"),
            **(
                {"bpe": artifact("datastore_bpe"), "datastore_bin": directory(artifact("datastore_bin"))}
                if FAIRSEQ_LMS
                else {}
            ),
        ),
        cfg=cfg_json("datastore"),
        threads=THREADS,
    )


knnlm_rule(
    "token_lines",
    "spine.token_lines",
    input=files(
        bpe=artifact("bpe_split"),
    ),
    output=files(
        out=artifact("token_lines"),
    ),
    cfg=cfg_json(),
    constraints=dict(
        lm=names_constraint(FAIRSEQ_LMS),  # a Hugging Face LM's dump_queries_hf writes its own
    ),
)


knnlm_rule(
    "documents",
    "spine.documents",
    input=files(
        text=artifact("split_tokens"),
        token_lines=artifact("token_lines"),
    ),
    output=files(
        out=artifact("documents"),
    ),
    cfg=cfg_json("stats"),
)


# A base LM (config 'lms') and its one pass over each split: fairseq-train of a pre-norm transformer_lm (plain
# softmax), best checkpoint on valid, or an existing fairseq checkpoint, or a Hugging Face causal LM (knnlm.lm.hf);
# the datastore (train: att + ffn keys, vals) and the queries (valid/test).
# Resumable: fairseq restarts from the LM's work dir (layout 'fairseq_dir') after a kill.

knnlm_rule(
    "train_lm",
    "spine.train_lm",
    input=files(
        unpack(lm_sources),  # App. E.6: the checkpoint an LM continues ('init') or learns soft labels from ('teacher')
        data_bin=artifact("data_bin"),
    ),
    output=files(
        **{"checkpoint": artifact("checkpoint")},  # a dict: 'checkpoint' is a keyword
        training=artifact("lm_training"),  # the valid curve and whether it converged (knnlm.lm.training.convergence)
    ),
    cfg=lambda wc: quoted_cfg(lm=lm_section(CFG, wc.lm), **train_options(wc.lm)),
    io=io(work_dir=artifact("fairseq_dir"), fairseq_log=artifact("log", job="train_lm_{lm}.fairseq")),
    threads=THREADS,
    resources=dict(
        mem_mb=8000,
    ),
    constraints=dict(
        lm=names_constraint([n for n in LMS if BACKEND[n].trained and n not in PRETRAINED]),
    ),
)


# config 'pretrained': a shipped LM (knnlm.lm.shipped) instead of training it: checked against its model card (the
# sha256, the 'lm' config this run would train it with, the run's dictionary) and copied with its training record.
knnlm_rule(
    "pretrained_lm",
    "spine.pretrained_lm",
    input=files(
        **{"checkpoint": SHIPPED.pattern("checkpoint") if SHIPPED else []},  # a dict: 'checkpoint' is a keyword
        card=SHIPPED.pattern("model_card") if SHIPPED else [],
        training=SHIPPED.pattern("lm_training") if SHIPPED else [],
        data_bin=artifact("data_bin"),
    ),
    output=files(
        **{"checkpoint": artifact("checkpoint")},  # a dict: 'checkpoint' is a keyword
        training=artifact("lm_training"),
    ),
    cfg=lambda wc: quoted_cfg(lm=lm_section(CFG, wc.lm), **train_options(wc.lm)),
    constraints=dict(
        lm=names_constraint(PRETRAINED),
    ),
)


knnlm_rule(
    "register_hf",
    "spine.register_hf",
    input=files(
        hf_local_files,
    ),
    output=files(
        card=artifact("model_card"),
    ),
    cfg=cfg_of_lm(),
    threads=THREADS,
    constraints=dict(
        lm=names_constraint(HF_LMS),
    ),
)


knnlm_rule(
    "dump_datastore",
    "spine.dump_datastore",
    input=files(
        unpack(lm_model("train")),
        corpus=artifact("datastore_corpus") if DATASTORE_DATA else [],
    ),
    output=files(
        keys_att=artifact("keys", key="att"),
        keys_ffn=artifact("keys", key="ffn"),
        vals=artifact("vals"),
        manifest=artifact("datastore_manifest"),
    ),
    cfg=cfg_of_lm("eval"),
    threads=THREADS,
    resources=dict(
        mem_mb=8000,
    ),
)


knnlm_rule(
    "dump_queries",
    "spine.dump_queries",
    input=files(
        unpack(lm_model(None)),
        wordcounts=artifact("wordcounts"),
    ),
    output=files(
        targets=artifact("targets"),
        lm_logprobs=artifact("lm_logprobs"),
        queries_att=artifact("queries", key="att"),
        queries_ffn=artifact("queries", key="ffn"),
        manifest=artifact("queries_manifest"),
    ),
    cfg=cfg_of_lm("eval"),
    threads=THREADS,
    constraints=dict(
        lm=names_constraint(FAIRSEQ_LMS),
    ),
)


# A Hugging Face LM's queries: dump_queries with the lines and words of its own tokens
knnlm_rule(
    "dump_queries_hf",
    "spine.dump_queries",
    input=files(
        unpack(lm_model(None)),
        wordcounts=artifact("wordcounts"),
    ),
    output=files(
        targets=artifact("targets"),
        lm_logprobs=artifact("lm_logprobs"),
        queries_att=artifact("queries", key="att"),
        queries_ffn=artifact("queries", key="ffn"),
        manifest=artifact("queries_manifest"),
        token_lines=artifact("token_lines"),  # the lines and words of the LM's own tokens (knnlm.lm.hf)
    ),
    cfg=cfg_of_lm("eval"),
    threads=THREADS,
    constraints=dict(
        lm=names_constraint(HF_LMS),
    ),
    log_name="dump_queries",
)
