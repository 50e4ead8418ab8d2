# Is the kNN-LM just an n-gram LM? (Khandelwal et al. 2020, Sec. 6, Figure 7; knnlm.experiments.ngram): Kneser–Ney
# n-gram LMs of orders 2 ... quality.ngram_orders on the datastore's token stream, each interpolated with the base LM
# (λ tuned on valid), against the kNN-LM of Table 1 (Table 3's pair at its τ*) (table, figure and comparisons
# 'ngram'). Reads the datastore's vals and Table 1's log-probs: no search.


knnlm_rule(
    "write_ngram",
    "ngram.table",
    input=files(
        unpack(token_source),  # the LM's vocabulary (the n-gram LM's uniform base distribution)
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        lm_logprobs=per_split("lm_logprobs"),
        targets=per_split("targets"),
        documents=per_split("documents"),
        score=artifact("score", store="full", **GAINS_KEY),
        knn_tuned=per_split("knn_logprobs_tuned", store="full", **GAINS_KEY),
    ),
    output=files(
        csv=artifact("table", table="ngram", ext="csv"),
        md=in_report(
            artifact("table", table="ngram", ext="md"), caption=report_caption("ngram"), category="Beyond the paper"
        ),
        cmp_csv=artifact("table", table="ngram_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="ngram", ext="png"), caption=report_caption("ngram"), category="Beyond the paper"
        ),
        pdf=artifact("figure", figure="ngram", ext="pdf"),
    ),
    cfg=cfg_json("knn", "quality", "stats", "profile"),
)


TARGETS["ngram"] = tables("ngram")
