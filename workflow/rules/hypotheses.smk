# The hypotheses the paper rejects that need no training (Xu et al. 2023, Sec. 6, App. E.1-E.4): on Table 1's
# artifacts (the full store's FAISS neighbours of every valid and test token) and the LM's output matrix W_sm.
HYP_METRIC = TABLE3_KEY["metric"]


rule write_hypotheses:
    input:
        unpack(output_layer),  # W_sm
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        **queries(),
        **{f"queries_{k}": per_split("queries", key=k) for k in KEYS},
        **{f"nb_ids_{k}": per_split("nb_ids", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        **{f"nb_meta_{k}": per_split("nb_meta", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        **{f"knn_{k}": per_split("knn_logprobs", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        scores=[artifact("score", store="full", key=k, metric=HYP_METRIC) for k in KEYS],
        documents=per_split("documents"),
    output:
        csv=artifact("table", table="hypotheses", ext="csv"),
        md=report(artifact("table", table="hypotheses", ext="md"), caption=report_caption("hypotheses"),
                  category="App. E"),
        cmp_csv=artifact("table", table="hypotheses_comparisons", ext="csv"),
    params:
        cfg=cfg_json("knn", "temperature", "stats", "hypotheses", "profile"),
        io=io(),
    threads: THREADS
    log:
        log_of("write_hypotheses", "lm"),
    benchmark:
        bench_of("write_hypotheses", "lm")
    conda:
        ENV
    shell:
        knnlm("hypotheses.hypotheses")


TARGETS["hypotheses"] = tables("hypotheses")
