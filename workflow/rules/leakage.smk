# Leakage control (Borgeaud et al. 2022, RETRO, Sec. 2.6 and 4.4, Figure 6; knnlm.experiments.leakage): the test
# split in chunks of 64 tokens, each chunk's longest run of tokens shared with the datastore's stream, and the
# kNN-LM of Table 1 (Table 3's pair at its τ*) against the base LM on the chunks whose overlap is at most α
# (table, figure and comparisons 'leakage'). Reads Table 1's caches: no new search.


knnlm_rule(
    "write_leakage",
    "leakage.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        targets=artifact("targets", split="test"),
        lm_logprobs=artifact("lm_logprobs", split="test"),
        knn_tuned=artifact("knn_logprobs_tuned", store="full", split="test", **GAINS_KEY),
        score=artifact("score", store="full", **GAINS_KEY),
        documents=per_split("documents"),
    ),
    output=files(
        csv=artifact("table", table="leakage", ext="csv"),
        md=in_report(
            artifact("table", table="leakage", ext="md"), caption=report_caption("leakage"), category="Beyond the paper"
        ),
        cmp_csv=artifact("table", table="leakage_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="leakage", ext="png"),
            caption=report_caption("leakage"),
            category="Beyond the paper",
        ),
        pdf=artifact("figure", figure="leakage", ext="pdf"),
    ),
    cfg=cfg_json("stats", "profile"),
)


TARGETS["leakage"] = tables("leakage")
