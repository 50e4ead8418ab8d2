# λ by retrieval quality (Drozdov et al. 2022, Sec. 5; knnlm.experiments.lambda_by_quality): a λ per bucket of
# the nearest neighbour's distance and of the n-gram overlap, tuned on valid, against one global λ on test, for
# Table 1's kNN-LM of Table 3's pair at its τ* (table and comparisons 'lambda_by_quality').


knnlm_rule(
    "write_lambda_by_quality",
    "lambda_by_quality.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        features=per_split("token_features"),
        lm_logprobs=per_split("lm_logprobs"),
        knn_tuned=per_split("knn_logprobs_tuned", store="full", **GAINS_KEY),
        score=artifact("score", store="full", **GAINS_KEY),
        documents=per_split("documents"),
    ),
    output=files(
        csv=artifact("table", table="lambda_by_quality", ext="csv"),
        md=in_report(
            artifact("table", table="lambda_by_quality", ext="md"),
            caption=report_caption("token_gains"),
            category="Beyond the paper",
        ),
        cmp_csv=artifact("table", table="lambda_by_quality_comparisons", ext="csv"),
    ),
    cfg=cfg_json("quality", "knn", "stats", "profile"),
)


TARGETS["lambda_by_quality"] = tables("lambda_by_quality") if PLAIN_W_SM else []
