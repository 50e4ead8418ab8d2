# Parametric alternatives to the datastore (Xu et al. 2023, Sec. 4, App. C): trained on the dumped keys with the
# LM frozen; one job per (variant, key type) of config section 'parametric' (knnlm.experiments.parametric).
PAR_TABLES = parametric_tables(CFG)
VARIANTS = parametric_variants(CFG)


rule word_stats:
    input:
        unpack(output_layer),
        **datastore("ffn"),
    output:
        out=artifact("word_stats"),
        row_logprobs=artifact("train_lm_logprobs"),  # log p_LM(val) of every datastore row (App. E.6.3's loss)
    params:
        cfg=cfg_json("parametric"),
        io=io(),
    threads: THREADS
    log:
        log_of("word_stats", "lm"),
    benchmark:
        bench_of("word_stats", "lm")
    conda:
        ENV
    shell:
        knnlm("parametric.word_stats")


rule train_parametric:
    input:
        unpack(output_layer),
        **datastore("{key}"),
        **queries(key="{key}"),
        wordcounts=artifact("wordcounts"),
        word_stats=lambda wc: artifact("word_stats", lm=wc.lm) if wc.variant.startswith("adaptive") else [],
        # the interpolated loss (App. E.6.3) needs p_LM of every training row, computed once by word_stats
        row_logprobs=lambda wc: artifact("train_lm_logprobs", lm=wc.lm) if wc.variant.startswith("iloss") else [],
    output:
        result=artifact("parametric_result"),
        logprobs=per_split("parametric_logprobs"),
    params:
        cfg=cfg_json("parametric", "knn"),
        io=io(work_dir=artifact("parametric_dir")),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        log_of("train_parametric", "lm", "variant", "key"),
    benchmark:
        bench_of("train_parametric", "lm", "variant", "key")
    conda:
        ENV
    shell:
        knnlm("parametric.train_parametric")


rule write_parametric:
    input:
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        results=[artifact("parametric_result", variant=v, key=k) for v, k in VARIANTS],
        scores=expand(artifact("score", store="full"), key=KEYS, metric=METRICS, allow_missing=True),
        lm_logprobs=per_split("lm_logprobs"),
        wordcounts=artifact("wordcounts"),
        knn_logprobs=[artifact("knn_logprobs", store="full", key=k, metric=m, split=s) for k in KEYS for m in METRICS
                      for s in EVAL_SPLITS],
        knn_tuned=[artifact("knn_logprobs_tuned", store="full", key=k, metric=m, split=s) for k in KEYS for m in METRICS
                   for s in EVAL_SPLITS],
        par_logprobs=[artifact("parametric_logprobs", variant=v, key=k, split=s) for v, k in VARIANTS for s in EVAL_SPLITS],
        documents=per_split("documents"),
    output:
        cmp_csv=artifact("table", table="parametric_comparisons", ext="csv"),
        cmp_md=report(artifact("table", table="parametric_comparisons", ext="md"), caption=report_caption("parametric"),
                      category="Parametric"),
        csv=[artifact("table", table=t, ext="csv") for t in PAR_TABLES],
        md=[report(artifact("table", table=t, ext="md"), caption=report_caption("parametric"), category="Parametric")
            for t in PAR_TABLES],
        fig3=[report(artifact("figure", figure="fig3_nv", ext=e), caption=report_caption("fig3"), category="Parametric")
              for e in ("png", "pdf")],
    params:
        cfg=cfg_json("parametric", "knn", "stats", "profile"),
        io=io(),
    log:
        log_of("write_parametric", "lm"),
    benchmark:
        bench_of("write_parametric", "lm")
    conda:
        ENV
    shell:
        knnlm("parametric.tables")


TARGETS["parametric"] = tables(*PAR_TABLES) if PLAIN_W_SM else []  # they read W_sm
