# PCA-reduced keys (He et al. 2021): the stores pca<d> of config 'stores.extra' against the full datastore,
# for the (key, metric) pairs of 'datastore_size'.
PCA_STORES = ["full"] + [s for s in CFG["stores"]["extra"] if s.startswith("pca")]


rule write_pca:
    input:
        settings=expand(P("settings"), store=PCA_STORES, key=DS["key_types"], metric=DS["metrics"], allow_missing=True),
    output:
        csv=P("table", table="pca", ext="csv"),
        md=report(P("table", table="pca", ext="md"), caption=report_caption("pca"), category="PCA"),
    params:
        cfg=cfg_json("retrieval", "knn", "stats", "profile"),
        io=io(),
    log:
        log_of("write_pca", "lm"),
    benchmark:
        bench_of("write_pca", "lm")
    conda:
        ENV
    shell:
        knnlm("pca.table")


if len(PCA_STORES) > 1:
    TARGETS["pca"] = tables("pca")
