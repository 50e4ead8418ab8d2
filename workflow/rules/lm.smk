# A base LM (config 'lms') and its one pass over each split: fairseq-train of a pre-norm transformer_lm (plain
# softmax), best checkpoint on valid, or an existing fairseq checkpoint, or a Hugging Face causal LM (knnlm.hf);
# the datastore (train: att + ffn keys, vals) and the queries (valid/test).
# Resumable: fairseq restarts from the LM's work dir (layout 'fairseq_dir') after a kill.

rule train_lm:
    input:
        data_bin=P("data_bin"),
    output:
        checkpoint=P("checkpoint"),
    wildcard_constraints:
        lm=lm_constraint([n for n in LMS if SOURCE[n] == "train"]),
    params:
        cfg=lambda wc: quoted_cfg(lm=lm_section(CFG, wc.lm)),
        io=io(work_dir=P("fairseq_dir"), fairseq_log=P("log", job="train_lm_{lm}.fairseq")),
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


rule register_hf:
    input:
        hf_local_files,
    output:
        card=P("model_card"),
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
    output:
        keys_att=P("keys", key="att"),
        keys_ffn=P("keys", key="ffn"),
        vals=P("vals"),
        manifest=P("datastore_manifest"),
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
        wordcounts=P("wordcounts"),
    output:
        targets=P("targets"),
        lm_logprobs=P("lm_logprobs"),
        queries_att=P("queries", key="att"),
        queries_ffn=P("queries", key="ffn"),
        manifest=P("queries_manifest"),
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
        targets=P("targets"),
        lm_logprobs=P("lm_logprobs"),
        queries_att=P("queries", key="att"),
        queries_ffn=P("queries", key="ffn"),
        manifest=P("queries_manifest"),
        token_lines=P("token_lines"),  # the lines and words of the LM's own tokens (knnlm.hf)
    wildcard_constraints:
        lm=lm_constraint(HF_LMS),
