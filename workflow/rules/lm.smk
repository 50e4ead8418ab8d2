# A base LM and its one pass over each split: fairseq-train of a pre-norm transformer_lm (plain softmax),
# best checkpoint on valid; the datastore (train: att + ffn keys, vals) and the queries (valid/test).
# Resumable: fairseq restarts from the LM's work dir (layout 'fairseq_dir') after a kill.

rule train_lm:
    input:
        data_bin=P("data_bin"),
    output:
        checkpoint=P("checkpoint"),
    params:
        cfg=cfg_json("lm"),
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


rule dump_datastore:
    input:
        checkpoint=P("checkpoint"),
        data_bin=P("data_bin"),
    output:
        keys_att=P("keys", key="att"),
        keys_ffn=P("keys", key="ffn"),
        vals=P("vals"),
        manifest=P("datastore_manifest"),
    params:
        cfg=cfg_json("eval"),
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
        checkpoint=P("checkpoint"),
        data_bin=P("data_bin"),
        wordcounts=P("wordcounts"),
    output:
        targets=P("targets"),
        lm_logprobs=P("lm_logprobs"),
        queries_att=P("queries", key="att"),
        queries_ffn=P("queries", key="ffn"),
        manifest=P("queries_manifest"),
    params:
        cfg=cfg_json("eval"),
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
