# Temperature (Xu et al. 2023, Sec. 5.2, Figure 5): the τ × λ sweep is part of every store's settings (rule
# settings); this draws Figure 5 for the stores of config 'temperature.ratios': the full store with the
# (key, metric) pairs of 'retrieval', the subsets with those of 'datastore_size'.
TAU_STORES = [store_name(r) for r in CFG["temperature"]["ratios"]]


FIG5_SETTINGS = [
    f
    for store in TAU_STORES
    for f in expand(
        artifact("settings", store=store),
        key=(RETRIEVAL if store == "full" else DATASTORE_SIZE)["key_types"],
        metric=(RETRIEVAL if store == "full" else DATASTORE_SIZE)["metrics"],
        allow_missing=True,
    )
]


knnlm_rule(
    "write_temperature",
    "temperature.figures",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        settings=FIG5_SETTINGS,
    ),
    output=files(
        csv=artifact("table", table="temperature", ext="csv"),
        md=in_report(
            artifact("table", table="temperature", ext="md"),
            caption=report_caption("temperature"),
            category="Temperature",
        ),
        fig5=[
            in_report(
                artifact("figure", figure=f"fig5_temperature_{s}", ext=e),
                caption=report_caption("fig5"),
                category="Temperature",
            )
            for s in TAU_STORES
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("knn", "retrieval", "temperature", "stats", "profile"),
)


TARGETS["temperature"] = tables("temperature")
