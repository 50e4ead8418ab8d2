# The spine every experiment reads (knnlm.experiments.spine). The corpus: raw splits -> (sliced) copies + word
# counts -> sentencepiece BPE -> fairseq binarised data.
# Corpus-level artifacts are shared by every base LM of the run that uses this tokenizer; each LM's tokens
# get their own documents (a Hugging Face LM tokenises the text itself).

if CFG["data"]["download"]:

    rule download:
        output:
            splits=[str(p) for p in split_files(CFG).values()],
        params:
            cfg=cfg_json("data"),
            io=io(),
        log:
            log_of("download"),
        conda:
            ENV
        shell:
            knnlm("spine.download")


# config 'lms.<lm>.url': a published fairseq checkpoint fetched to 'lms.<lm>.path' (sha256 checked when given).
for _name in [n for n in LMS if SOURCE[n] == "fairseq" and CFG["lms"][n]["url"]]:

    rule:
        name:
            f"download_lm_{_name.replace('-', '_').replace('.', '_')}"
        output:
            checkpoint=CFG["lms"][_name]["path"],
        params:
            cfg=quoted_cfg(lms={_name: CFG["lms"][_name]}),
            io=io(fixed={"lm": _name}),
        log:
            log_of(f"download_lm_{_name}"),
        conda:
            ENV
        shell:
            knnlm("spine.download_lm")


# ancient(): the raw corpus (a folder or one archive) is often a shared, re-mounted directory or a fresh clone whose
# mtimes change; its content is pinned by data.sha256 (checked by this job), so a newer mtime alone does not rerun
# the whole DAG.
rule prepare_data:
    input:
        raw=[ancient(str(p)) for p in data_inputs(CFG)],
    output:
        splits=[artifact("split_tokens", split=s) for s in SPLITS],
        wordcounts=artifact("wordcounts"),
    params:
        cfg=cfg_json("data"),
        io=io(),
    log:
        log_of("prepare_data"),
    benchmark:
        bench_of("prepare_data")
    conda:
        ENV
    shell:
        knnlm("spine.prepare_data")


rule bpe:
    input:
        splits=[artifact("split_tokens", split=s) for s in SPLITS],
        # config 'pretrained': the BPE model the shipped LMs were trained with, used instead of training one
        given=PRETRAINED_BPE,
    output:
        # 'bpe.type: none' (a word-level LM): no BPE model, the splits' own whitespace tokens
        **({"model": artifact("bpe_model"), "vocab": artifact("bpe_vocab")} if CFG["bpe"]["type"] != "none" else {}),
        bpe=[artifact("bpe_split", split=s) for s in SPLITS],
        stats=artifact("bpe_stats"),
    params:
        cfg=cfg_json("bpe"),
        io=io(),
    threads: THREADS
    log:
        log_of("bpe"),
    benchmark:
        bench_of("bpe")
    conda:
        ENV
    shell:
        knnlm("spine.bpe")


rule preprocess:
    input:
        bpe=[artifact("bpe_split", split=s) for s in SPLITS],
        dictionary=ancient(CFG["bpe"]["dictionary"]) if CFG["bpe"]["dictionary"] else [],  # a published LM's dict.txt
    output:
        data_bin=directory(artifact("data_bin")),
    params:
        cfg=cfg_json(),
        io=io(),
    threads: THREADS
    log:
        log_of("preprocess"),
    benchmark:
        bench_of("preprocess")
    conda:
        ENV
    shell:
        knnlm("spine.preprocess")


# config 'datastore.data' (Khandelwal et al. 2020, Sec. 4.3, domain adaptation): the datastore's own text, and for
# fairseq LMs its BPE binarised with the LM's dictionary; read only by dump_datastore.
if DATASTORE_DATA:

    rule datastore_corpus:
        input:
            train=artifact("split_tokens", split="train") if DATASTORE_DATA["with_train"] else [],
            files=[ancient(f) for f in DATASTORE_DATA["files"]],
            **({"data_bin": artifact("data_bin")} if FAIRSEQ_LMS else {}),
            **({"bpe_model": artifact("bpe_model")} if FAIRSEQ_LMS and CFG["bpe"]["type"] != "none" else {}),
        output:
            text=artifact("datastore_text"),
            corpus=artifact("datastore_corpus"),
            **({"bpe": artifact("datastore_bpe"), "datastore_bin": directory(artifact("datastore_bin"))}
               if FAIRSEQ_LMS else {}),
        params:
            cfg=cfg_json("datastore"),
            io=io(),
        threads: THREADS
        log:
            log_of("datastore_corpus"),
        benchmark:
            bench_of("datastore_corpus")
        conda:
            ENV
        shell:
            knnlm("spine.datastore_corpus")


rule token_lines:
    input:
        bpe=artifact("bpe_split"),
    output:
        out=artifact("token_lines"),
    wildcard_constraints:
        lm=lm_constraint(FAIRSEQ_LMS),  # a Hugging Face LM's dump_queries_hf writes its own
    params:
        cfg=cfg_json(),
        io=io(),
    log:
        log_of("token_lines", "lm", "split"),
    benchmark:
        bench_of("token_lines", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("spine.token_lines")


rule documents:
    input:
        text=artifact("split_tokens"),
        token_lines=artifact("token_lines"),
    output:
        out=artifact("documents"),
    params:
        cfg=cfg_json("stats"),
        io=io(),
    log:
        log_of("documents", "lm", "split"),
    benchmark:
        bench_of("documents", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("spine.documents")


# A base LM (config 'lms') and its one pass over each split: fairseq-train of a pre-norm transformer_lm (plain
# softmax), best checkpoint on valid, or an existing fairseq checkpoint, or a Hugging Face causal LM (knnlm.hf);
# the datastore (train: att + ffn keys, vals) and the queries (valid/test).
# Resumable: fairseq restarts from the LM's work dir (layout 'fairseq_dir') after a kill.

rule train_lm:
    input:
        unpack(lm_sources),  # App. E.6: the checkpoint an LM continues ('init') or learns soft labels from ('teacher')
        data_bin=artifact("data_bin"),
    output:
        checkpoint=artifact("checkpoint"),
        training=artifact("lm_training"),  # the valid curve and whether it converged (knnlm.lm.convergence)
    wildcard_constraints:
        lm=lm_constraint([n for n in LMS if SOURCE[n] == "train" and n not in PRETRAINED]),
    params:
        cfg=lambda wc: quoted_cfg(lm=lm_section(CFG, wc.lm), **train_options(wc.lm)),
        io=io(work_dir=artifact("fairseq_dir"), fairseq_log=artifact("log", job="train_lm_{lm}.fairseq")),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        log_of("train_lm", "lm"),
    benchmark:
        bench_of("train_lm", "lm")
    conda:
        ENV
    shell:
        knnlm("spine.train_lm")


# config 'pretrained': a shipped LM (knnlm.pretrained) instead of training it: checked against its model card (the
# sha256, the 'lm' config this run would train it with, the run's dictionary) and copied with its training record.
rule pretrained_lm:
    input:
        checkpoint=SHIPPED.pattern("checkpoint") if SHIPPED else [],
        card=SHIPPED.pattern("model_card") if SHIPPED else [],
        training=SHIPPED.pattern("lm_training") if SHIPPED else [],
        data_bin=artifact("data_bin"),
    output:
        checkpoint=artifact("checkpoint"),
        training=artifact("lm_training"),
    wildcard_constraints:
        lm=lm_constraint(PRETRAINED),
    params:
        cfg=lambda wc: quoted_cfg(lm=lm_section(CFG, wc.lm), **train_options(wc.lm)),
        io=io(),
    log:
        log_of("pretrained_lm", "lm"),
    benchmark:
        bench_of("pretrained_lm", "lm")
    conda:
        ENV
    shell:
        knnlm("spine.pretrained_lm")


rule register_hf:
    input:
        hf_local_files,
    output:
        card=artifact("model_card"),
    wildcard_constraints:
        lm=lm_constraint(HF_LMS),
    params:
        cfg=cfg_of_lm(),
        io=io(),
    threads: THREADS
    log:
        log_of("register_hf", "lm"),
    benchmark:
        bench_of("register_hf", "lm")
    conda:
        ENV
    shell:
        knnlm("spine.register_hf")


rule dump_datastore:
    input:
        unpack(lm_model("train")),
        corpus=artifact("datastore_corpus") if DATASTORE_DATA else [],
    output:
        keys_att=artifact("keys", key="att"),
        keys_ffn=artifact("keys", key="ffn"),
        vals=artifact("vals"),
        manifest=artifact("datastore_manifest"),
    params:
        cfg=cfg_of_lm("eval"),
        io=io(),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        log_of("dump_datastore", "lm"),
    benchmark:
        bench_of("dump_datastore", "lm")
    conda:
        ENV
    shell:
        knnlm("spine.dump_datastore")


rule dump_queries:
    input:
        unpack(lm_model(None)),
        wordcounts=artifact("wordcounts"),
    output:
        targets=artifact("targets"),
        lm_logprobs=artifact("lm_logprobs"),
        queries_att=artifact("queries", key="att"),
        queries_ffn=artifact("queries", key="ffn"),
        manifest=artifact("queries_manifest"),
    wildcard_constraints:
        lm=lm_constraint(FAIRSEQ_LMS),
    params:
        cfg=cfg_of_lm("eval"),
        io=io(),
    threads: THREADS
    log:
        log_of("dump_queries", "lm", "split"),
    benchmark:
        bench_of("dump_queries", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("spine.dump_queries")


use rule dump_queries as dump_queries_hf with:
    output:
        targets=artifact("targets"),
        lm_logprobs=artifact("lm_logprobs"),
        queries_att=artifact("queries", key="att"),
        queries_ffn=artifact("queries", key="ffn"),
        manifest=artifact("queries_manifest"),
        token_lines=artifact("token_lines"),  # the lines and words of the LM's own tokens (knnlm.hf)
    wildcard_constraints:
        lm=lm_constraint(HF_LMS),
