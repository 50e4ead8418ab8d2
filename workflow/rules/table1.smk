# Table 1 (Xu et al. 2023, Sec. 3): p_kNN from the full store's neighbour cache, λ tuned on valid, reported on
# valid and test, for every (key type, metric). The same job scores the kNN-LM of the parametric alternatives'
# training rows (store TRAINING_SUBSET, Sec. 4 at equal rows), whose search also covers every token.

knnlm_rule(
    "score",
    "table1.score",
    input=files(
        **datastore(),
        **queries(),
        wordcounts=artifact("wordcounts"),
        nb_ids=per_split("nb_ids"),
        nb_dists=per_split("nb_dists"),
        nb_meta=per_split("nb_meta"),
    ),
    output=files(
        out=artifact("score"),
        knn=per_split("knn_logprobs"),
        knn_tuned=per_split("knn_logprobs_tuned"),
    ),
    cfg=cfg_json("knn", "temperature"),
    constraints=dict(
        store=names_constraint(["full", TRAINING_SUBSET]),
    ),
)


knnlm_rule(
    "write_table1",
    "table1.table1",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        scores=expand(artifact("score", store="full"), key=KEYS, metric=METRICS, allow_missing=True),
        knn_valid=expand(
            artifact("knn_logprobs", store="full", split="valid"), key=KEYS, metric=METRICS, allow_missing=True
        ),
        knn_test=expand(
            artifact("knn_logprobs", store="full", split="test"), key=KEYS, metric=METRICS, allow_missing=True
        ),
        tuned_valid=expand(
            artifact("knn_logprobs_tuned", store="full", split="valid"), key=KEYS, metric=METRICS, allow_missing=True
        ),
        tuned_test=expand(
            artifact("knn_logprobs_tuned", store="full", split="test"), key=KEYS, metric=METRICS, allow_missing=True
        ),
        lm_logprobs=per_split("lm_logprobs"),
        wordcounts=artifact("wordcounts"),
        documents=per_split("documents"),
    ),
    output=files(
        csv=artifact("table", table="table1", ext="csv"),
        md=in_report(artifact("table", table="table1", ext="md"), caption=report_caption("table1"), category="Table 1"),
        cmp_csv=artifact("table", table="table1_comparisons", ext="csv"),
        cmp_md=in_report(
            artifact("table", table="table1_comparisons", ext="md"),
            caption=report_caption("table1"),
            category="Table 1",
        ),
    ),
    cfg=cfg_json("knn", "temperature", "stats", "profile"),
)


TARGETS["table1"] = tables("table1")
