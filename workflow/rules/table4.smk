# Table 4 (Xu et al. 2023, App. A): the kNN-LM of every base LM of config 'lms' (the Sec. 3 set-up: full store,
# FAISS mask + score, λ tuned on valid, with key type and metric of config 'table4'), gain vs base-LM strength.
T4 = CFG["table4"]


T4_SCORE = dict(store="full", key=T4["key_type"], metric=T4["metric"])

knnlm_rule(
    "write_table4",
    "table4.table4",
    input=files(
        lm_training=[artifact("lm_training", lm=n) for n in BASE_LMS if BACKEND[n].trained],  # each LM's convergence
        models=[lm_weights(lm) for lm in BASE_LMS],
        scores=per_lm("score", **T4_SCORE),
        **{f"knn_{s}": per_lm("knn_logprobs", split=s, **T4_SCORE) for s in EVAL_SPLITS},
        **{f"tuned_{s}": per_lm("knn_logprobs_tuned", split=s, **T4_SCORE) for s in EVAL_SPLITS},
        **{f"lm_logprobs_{s}": per_lm("lm_logprobs", split=s) for s in EVAL_SPLITS},
        **{f"documents_{s}": per_lm("documents", split=s) for s in EVAL_SPLITS},
        wordcounts=artifact("wordcounts"),
    ),
    output=files(
        csv=artifact("run_table", table="table4", ext="csv"),
        md=in_report(
            artifact("run_table", table="table4", ext="md"), caption=report_caption("default"), category="Table 4"
        ),
        cmp_csv=artifact("run_table", table="table4_comparisons", ext="csv"),  # App. A's claims, read by the findings
    ),
    cfg=cfg_json("lms", "table4", "knn", "stats", "profile"),
)


TARGETS["table4"] = [artifact("run_table", table="table4", ext="md")]
