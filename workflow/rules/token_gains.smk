# When does retrieval help? (Drozdov et al. 2022; He et al. 2021; knnlm.experiments.token_gains): the features of
# every valid and test token (the top FAISS neighbour of Table 3's pair on the full store, the base LM's entropy,
# the target's training frequency, the n-gram overlap with the neighbour's context), then the per-token gain of the
# kNN-LM over its base LM on test, by feature (table, figure and comparisons 'token_gains'). Reads Table 1's caches
# and, when the full store is scored on every token (table3_all), its exact top-k: no new search.


knnlm_rule(
    "token_features",
    "token_gains.features",
    input=files(
        unpack(output_layer),  # W_sm: the base LM's distribution from the ffn queries
        **datastore(),
        **queries("{split}", "ffn"),
        nb_ids=artifact("nb_ids", store="full", **GAINS_KEY),
        nb_dists=artifact("nb_dists", store="full", **GAINS_KEY),
        nb_meta=artifact("nb_meta", store="full", **GAINS_KEY),
    ),
    output=files(
        out=artifact("token_features"),
    ),
    cfg=cfg_json("quality"),
    threads=THREADS,
)


knnlm_rule(
    "write_token_gains",
    "token_gains.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        features=artifact("token_features", split="test"),
        targets=artifact("targets", split="test"),
        lm_logprobs=artifact("lm_logprobs", split="test"),
        knn_tuned=artifact("knn_logprobs_tuned", store="full", split="test", **GAINS_KEY),
        score=artifact("score", store="full", **GAINS_KEY),
        documents=per_split("documents"),
        vals=artifact("vals"),
        # the real mask on every test token (table3_all's exact search and its tuned τ, λ; not when it scores a
        # block sample, config 'retrieval.table3_fraction' < 1)
        **(
            {
                "real_settings": artifact("settings", store=FULL_EVERY_TOKEN, **GAINS_KEY),
                "exact_ids": artifact("exact_ids", store=FULL_EVERY_TOKEN, split="test", **GAINS_KEY),
                "exact_dists": artifact("exact_dists", store=FULL_EVERY_TOKEN, split="test", **GAINS_KEY),
                "exact_meta": artifact("exact_meta", store=FULL_EVERY_TOKEN, split="test", **GAINS_KEY),
            }
            if FULL_EVERY_TOKEN
            else {}
        ),
    ),
    output=files(
        csv=artifact("table", table="token_gains", ext="csv"),
        md=in_report(
            artifact("table", table="token_gains", ext="md"),
            caption=report_caption("token_gains"),
            category="Beyond the paper",
        ),
        cmp_csv=artifact("table", table="token_gains_comparisons", ext="csv"),
        fig=[
            in_report(
                artifact("figure", figure="token_gains", ext=e),
                caption=report_caption("token_gains"),
                category="Beyond the paper",
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("quality", "knn", "stats", "profile"),
)


TARGETS["token_gains"] = tables("token_gains") if PLAIN_W_SM else []  # its features read W_sm
