# PCA-reduced keys (He et al. 2021): the stores pca<d> of config 'stores.extra' against the full datastore, for
# the (key, metric) pairs of 'datastore_size'; table 'pca' (knnlm.experiments.pca.table, rule write_store_table).
PCA_STORES = ["full"] + [s for s in CFG["stores"]["extra"] if s.startswith("pca")]
if len(PCA_STORES) > 1:
    STORE_TABLES["pca"] = expand(
        artifact("settings"),
        store=PCA_STORES,
        key=DATASTORE_SIZE["key_types"],
        metric=DATASTORE_SIZE["metrics"],
        allow_missing=True,
    )
    TARGETS["pca"] = tables("pca")
