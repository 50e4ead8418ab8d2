# Approximation strength as a variable (Sec. 5): each store of 'retrieval.probe_sweep.ratios' searched with each
# nprobe of 'retrieval.probe_sweep.nprobe' (stores '<store>-np<n>': the same index and exact search, so each point
# costs a FAISS search, a real score and a settings job on the retrieval scope), beside the store at 'index.nprobe';
# table and figure 'probe_sweep' (knnlm.experiments.probe_sweep).
SWEEP = RETRIEVAL["probe_sweep"]
SWEEP_STORES = [
    s for r in SWEEP["ratios"] for s in [store_name(r)] + [probe_store(store_name(r), n) for n in SWEEP["nprobe"]]
]

if SWEEP_STORES:

    knnlm_rule(
        "write_probe_sweep",
        "probe_sweep.table",
        input=files(
            lm_training=lm_training(),  # the base LM's convergence, in the caption
            settings=expand(artifact("settings", **TABLE3_KEY), store=SWEEP_STORES, allow_missing=True),
        ),
        output=files(
            csv=artifact("table", table="probe_sweep", ext="csv"),
            md=in_report(
                artifact("table", table="probe_sweep", ext="md"),
                caption=report_caption("store_table"),
                category="Stores",
            ),
            fig=[
                in_report(
                    artifact("figure", figure="probe_sweep", ext=e),
                    caption=report_caption("store_table"),
                    category="Stores",
                )
                for e in ("png", "pdf")
            ],
        ),
        cfg=cfg_json("retrieval", "knn", "index", "stats", "profile"),
    )

    TARGETS["probe_sweep"] = tables("probe_sweep") + expand(
        artifact("figure", figure="probe_sweep", ext="png"), lm=PRIMARY
    )
