# How many neighbours (Khandelwal et al. 2020, Sec. 5, Figure 4; knnlm.experiments.k_sweep): Table 1's kNN-LM of
# Table 3's pair with the first k of its cached FAISS neighbours, k = 1, 2, 4, ... up to knn.k, each k with its own
# τ and λ tuned on valid (table, figure and comparisons 'k_sweep'). Reads the full store's caches: no new search.


knnlm_rule(
    "write_k_sweep",
    "k_sweep.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        lm_logprobs=per_split("lm_logprobs"),
        targets=per_split("targets"),
        documents=per_split("documents"),
        score=artifact("score", store="full", **GAINS_KEY),
        **{n: per_split(n, store="full", **GAINS_KEY) for n in ("nb_ids", "nb_dists", "nb_meta")},
    ),
    output=files(
        csv=artifact("table", table="k_sweep", ext="csv"),
        md=in_report(
            artifact("table", table="k_sweep", ext="md"), caption=report_caption("k_sweep"), category="Beyond the paper"
        ),
        cmp_csv=artifact("table", table="k_sweep_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="k_sweep", ext="png"),
            caption=report_caption("k_sweep"),
            category="Beyond the paper",
        ),
        pdf=artifact("figure", figure="k_sweep", ext="pdf"),
    ),
    cfg=cfg_json("knn", "temperature", "stats", "profile"),
)


TARGETS["k_sweep"] = tables("k_sweep")
