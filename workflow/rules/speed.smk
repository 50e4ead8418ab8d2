# Speed (He et al. 2021's axis): tokens per second of the base LM's pass and of each full-store FAISS search, the
# exact search and the real score per query, from the seconds their jobs recorded, on the test split; table 'speed'
# (knnlm.experiments.speed). Reads metas only: no job is re-timed.
knnlm_rule(
    "write_speed",
    "speed.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        queries_manifest=artifact("queries_manifest", split="test"),
        nb_meta=expand(artifact("nb_meta", store="full", split="test"), key=KEYS, metric=METRICS, allow_missing=True),
        exact_meta=expand(
            artifact("exact_meta", store="full", split="test"),
            key=RETRIEVAL["key_types"],
            metric=RETRIEVAL["metrics"],
            allow_missing=True,
        ),
        real_meta=expand(
            artifact("real_meta", store="full", split="test"),
            key=RETRIEVAL["key_types"],
            metric=RETRIEVAL["metrics"],
            allow_missing=True,
        ),
    ),
    output=files(
        csv=artifact("table", table="speed", ext="csv"),
        md=in_report(
            artifact("table", table="speed", ext="md"), caption=report_caption("store_table"), category="Stores"
        ),
    ),
    cfg=cfg_json("profile"),
)


TARGETS["speed"] = tables("speed")
