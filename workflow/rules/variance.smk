# Where the randomness is ours (issue 9): the three mask/score settings over IVFPQ training seeds (stores
# full-ivf<k>: same keys, so the same exact search) and over subset draws (stores r<ratio>-draw<k>), for the
# (key, metric) of config section 'variance' (knnlm.experiments.variance).
VAR = CFG["variance"]
VAR_STORES = (["full"] + [f"full-ivf{k}" for k in VAR["index_seeds"]] if VAR["index_seeds"] else []) + (
    [store_name(VAR["ratio"])] + [f"{store_name(VAR['ratio'])}-draw{k}" for k in VAR["draw_seeds"]]
    if VAR["draw_seeds"] else [])


rule write_variance:
    input:
        settings=expand(P("settings", key=VAR["key_type"], metric=VAR["metric"]), store=VAR_STORES, allow_missing=True),
    output:
        csv=P("table", table="variance", ext="csv"),
        md=report(P("table", table="variance", ext="md"), caption=report_caption("variance"), category="Variance"),
    params:
        cfg=cfg_json("retrieval", "knn", "index", "datastore_size", "variance", "stats", "profile"),
        io=io(),
    log:
        log_of("write_variance", "lm"),
    benchmark:
        bench_of("write_variance", "lm")
    conda:
        ENV
    shell:
        knnlm("variance.table")


if VAR_STORES:
    TARGETS["variance"] = tables("variance")
