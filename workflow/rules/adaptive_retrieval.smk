# Adaptive retrieval (He et al. 2021, Sec. 3; knnlm.experiments.adaptive_retrieval): an MLP predicts λ from what
# the LM knows before retrieval (the token features of rules/token_gains.smk), trained on valid; test perplexity as
# retrieval is skipped for more and more tokens, against Table 1's kNN-LM of Table 3's pair at τ* with one global λ
# (table, figure and comparisons 'adaptive_retrieval').


knnlm_rule(
    "write_adaptive_retrieval",
    "adaptive_retrieval.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        features=per_split("token_features"),
        lm_logprobs=per_split("lm_logprobs"),
        knn_tuned=per_split("knn_logprobs_tuned", store="full", **GAINS_KEY),
        score=artifact("score", store="full", **GAINS_KEY),
        documents=per_split("documents"),
    ),
    output=files(
        csv=artifact("table", table="adaptive_retrieval", ext="csv"),
        md=in_report(
            artifact("table", table="adaptive_retrieval", ext="md"),
            caption=report_caption("token_gains"),
            category="Beyond the paper",
        ),
        cmp_csv=artifact("table", table="adaptive_retrieval_comparisons", ext="csv"),
        fig=[
            in_report(
                artifact("figure", figure="adaptive_retrieval", ext=e),
                caption=report_caption("token_gains"),
                category="Beyond the paper",
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("quality", "knn", "stats", "profile"),
    threads=THREADS,
)


TARGETS["adaptive_retrieval"] = tables("adaptive_retrieval") if PLAIN_W_SM else []
