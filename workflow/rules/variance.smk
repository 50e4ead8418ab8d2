# Where the randomness is ours: the three mask/score settings over IVFPQ training seeds (stores
# full-ivf<k>: same keys, so the same exact search) and over subset draws (stores r<ratio>-draw<k>), for the
# (key, metric) of config section 'variance'; table 'variance' (knnlm.experiments.variance, rule write_store_table).
VAR = CFG["variance"]
VAR_STORES = (["full"] + [f"full-ivf{k}" for k in VAR["index_seeds"]] if VAR["index_seeds"] else []) + (
    [store_name(VAR["ratio"])] + [f"{store_name(VAR['ratio'])}-draw{k}" for k in VAR["draw_seeds"]]
    if VAR["draw_seeds"]
    else []
)
if VAR_STORES:
    STORE_TABLES["variance"] = expand(
        artifact("settings", key=VAR["key_type"], metric=VAR["metric"]), store=VAR_STORES, allow_missing=True
    )
    TARGETS["variance"] = tables("variance")
