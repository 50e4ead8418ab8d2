# Datastore size (Xu et al. 2023, Sec. 5, Figures 2 and 4): the mask/score settings of the stores
# r<ratio> (seeded random subsets, knnlm.stores) and the full one.
SIZE_STORES = [store_name(r) for r in DS["ratios"]]


rule write_datastore_size:
    input:
        settings=expand(P("settings"), store=SIZE_STORES, key=DS["key_types"], metric=DS["metrics"], allow_missing=True),
    output:
        csv=P("table", table="datastore_size", ext="csv"),
        md=report(P("table", table="datastore_size", ext="md"), caption=report_caption("datastore_size"),
                  category="Datastore size"),
        fig2=[report(P("figure", figure="fig2_datastore_size", ext=e), caption=report_caption("fig2"),
                     category="Datastore size") for e in ("png", "pdf")],
        fig4=[report(P("figure", figure="fig4_mask_score_by_size", ext=e), caption=report_caption("fig4"),
                     category="Datastore size") for e in ("png", "pdf")],
    params:
        cfg=cfg_json("knn", "retrieval", "datastore_size", "stats", "profile"),
        io=io(),
    log:
        log_of("write_datastore_size", "lm"),
    benchmark:
        bench_of("write_datastore_size", "lm")
    conda:
        ENV
    shell:
        knnlm("datastore_size.figures")


TARGETS["datastore_size"] = tables("datastore_size")
