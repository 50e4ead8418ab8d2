# Table 1 (Xu et al. 2023, Sec. 3): p_kNN from the full store's neighbour cache, λ tuned on valid, reported on
# valid and test, for every (key type, metric).

rule score:
    input:
        **datastore(),
        **queries(),
        wordcounts=artifact("wordcounts"),
        nb_ids=per_split("nb_ids", store="full"),
        nb_dists=per_split("nb_dists", store="full"),
        nb_meta=per_split("nb_meta", store="full"),
    output:
        out=artifact("score", store="full"),
        knn=per_split("knn_logprobs", store="full"),
        knn_tuned=per_split("knn_logprobs_tuned", store="full"),
    params:
        cfg=cfg_json("knn", "temperature"),
        io=io(),
    log:
        log_of("score", "lm", "key", "metric"),
    benchmark:
        bench_of("score", "lm", "key", "metric")
    conda:
        ENV
    shell:
        knnlm("table1.score")


rule write_table1:
    input:
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        scores=expand(artifact("score", store="full"), key=KEYS, metric=METRICS, allow_missing=True),
        knn_valid=expand(artifact("knn_logprobs", store="full", split="valid"), key=KEYS, metric=METRICS, allow_missing=True),
        knn_test=expand(artifact("knn_logprobs", store="full", split="test"), key=KEYS, metric=METRICS, allow_missing=True),
        tuned_valid=expand(artifact("knn_logprobs_tuned", store="full", split="valid"), key=KEYS, metric=METRICS,
                           allow_missing=True),
        tuned_test=expand(artifact("knn_logprobs_tuned", store="full", split="test"), key=KEYS, metric=METRICS,
                          allow_missing=True),
        lm_logprobs=per_split("lm_logprobs"),
        wordcounts=artifact("wordcounts"),
        documents=per_split("documents"),
    output:
        csv=artifact("table", table="table1", ext="csv"),
        md=report(artifact("table", table="table1", ext="md"), caption=report_caption("table1"), category="Table 1"),
        cmp_csv=artifact("table", table="table1_comparisons", ext="csv"),
        cmp_md=report(artifact("table", table="table1_comparisons", ext="md"), caption=report_caption("table1"),
                      category="Table 1"),
    params:
        cfg=cfg_json("knn", "temperature", "stats", "profile"),
        io=io(),
    log:
        log_of("write_table1", "lm"),
    benchmark:
        bench_of("write_table1", "lm")
    conda:
        ENV
    shell:
        knnlm("table1.table1")


TARGETS["table1"] = tables("table1")
