# Parametric alternatives to the datastore (Xu et al. 2023, Sec. 4, App. C): trained on the dumped keys with the
# LM frozen; one job per (variant, key type) of config section 'parametric' (knnlm.experiments.parametric).
PAR_TABLES = parametric_tables(CFG)
VARIANTS = parametric_variants(CFG)


rule word_stats:
    input:
        unpack(output_layer),
        **datastore("ffn"),
    output:
        out=P("word_stats"),
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
        wordcounts=P("wordcounts"),
        word_stats=lambda wc: P("word_stats", lm=wc.lm) if wc.variant.startswith("adaptive") else [],
    output:
        result=P("parametric_result"),
        logprobs=per_split("parametric_logprobs"),
    params:
        cfg=cfg_json("parametric", "knn"),
        io=io(work_dir=P("parametric_dir")),
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
        results=[P("parametric_result", variant=v, key=k) for v, k in VARIANTS],
        scores=expand(P("score", store="full"), key=KEYS, metric=METRICS, allow_missing=True),
        lm_logprobs=per_split("lm_logprobs"),
        wordcounts=P("wordcounts"),
        knn_logprobs=[P("knn_logprobs", store="full", key=k, metric=m, split=s) for k in KEYS for m in METRICS
                      for s in EVAL_SPLITS],
        knn_tuned=[P("knn_logprobs_tuned", store="full", key=k, metric=m, split=s) for k in KEYS for m in METRICS
                   for s in EVAL_SPLITS],
        par_logprobs=[P("parametric_logprobs", variant=v, key=k, split=s) for v, k in VARIANTS for s in EVAL_SPLITS],
        documents=per_split("documents"),
    output:
        cmp_csv=P("table", table="parametric_comparisons", ext="csv"),
        cmp_md=report(P("table", table="parametric_comparisons", ext="md"), caption=report_caption("parametric"),
                      category="Parametric"),
        csv=[P("table", table=t, ext="csv") for t in PAR_TABLES],
        md=[report(P("table", table=t, ext="md"), caption=report_caption("parametric"), category="Parametric")
            for t in PAR_TABLES],
        fig3=[report(P("figure", figure="fig3_nv", ext=e), caption=report_caption("fig3"), category="Parametric")
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


TARGETS["parametric"] = tables(*PAR_TABLES)
