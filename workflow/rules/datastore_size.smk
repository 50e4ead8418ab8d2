# Datastore size (Xu et al. 2023, Sec. 5, Figures 2 and 4): the mask/score settings of the stores
# r<ratio> (seeded random subsets, knnlm.datastore.stores) and the full one.
SIZE_STORES = [store_name(r) for r in DATASTORE_SIZE["ratios"]]
NESTED_STORES = [store_name(r) for r in sorted(DATASTORE_SIZE["ratios"])]


if len(NESTED_STORES) > 1:
    # The real mask of every size in one scan (the subsets are nested: each is a prefix of one scan order), for
    # the cost of the largest: knnlm.experiments.retrieval.exact_search_nested. Other stores: rule exact_search.
    # With 'retrieval.exact_shards' > 1 the scan is cut into shards that never straddle a subset's end
    # (knnlm.datastore.stores.nested_shards) and exact_merge_nested gives each store the merge of the shards up to its end.
    NESTED_INPUTS = dict(
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        stores=expand(artifact("store_prep"), store=NESTED_STORES, allow_missing=True),
        scope=artifact("scope"),
    )
    NESTED_KEYS = dict(key="|".join(DATASTORE_SIZE["key_types"]), metric="|".join(DATASTORE_SIZE["metrics"]))

    knnlm_rule(
        "exact_search_nested",
        "retrieval.exact_search_nested",
        input=files(
            **NESTED_INPUTS,
        ),
        output=files(
            **(
                dict(
                    ids=expand(artifact("exact_ids"), store=NESTED_STORES, allow_missing=True),
                    dists=expand(artifact("exact_dists"), store=NESTED_STORES, allow_missing=True),
                    meta=expand(artifact("exact_meta"), store=NESTED_STORES, allow_missing=True),
                )
                if EXACT_SHARDS == 1
                else dict(
                    ids=temp(artifact("nested_shard_ids")),
                    dists=temp(artifact("nested_shard_dists")),
                    meta=temp(artifact("nested_shard_meta")),
                )
            ),  # deleted once every store's merge has read them
        ),
        cfg=cfg_json("retrieval", "knn"),
        threads=THREADS,
        resources=dict(
            mem_mb=8000,
        ),
        constraints=dict(
            **NESTED_KEYS,
        ),
    )

    if EXACT_SHARDS == 1:

        ruleorder: exact_search_nested > exact_search

    else:

        rule exact_merge_nested:
            input:
                shard_ids=nested_shards_of("nested_shard_ids"),
                shard_dists=nested_shards_of("nested_shard_dists"),
                shard_meta=nested_shards_of("nested_shard_meta"),
            output:
                ids=artifact("exact_ids"),
                dists=artifact("exact_dists"),
                meta=artifact("exact_meta"),
            log:
                log_of("exact_merge_nested", "lm", "store", "key", "metric", "split"),
            benchmark:
                bench_of("exact_merge_nested", "lm", "store", "key", "metric", "split")
            wildcard_constraints:
                **NESTED_KEYS,
                store=names_constraint(NESTED_STORES),
            conda:
                ENV
            params:
                cfg=cfg_json("retrieval", "knn"),
                io=io(),
                rule="exact_merge_nested",
            shell:
                knnlm("retrieval.exact_merge")

        ruleorder: exact_merge_nested > exact_merge


knnlm_rule(
    "write_datastore_size",
    "datastore_size.figures",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        settings=expand(
            artifact("settings"),
            store=SIZE_STORES,
            key=DATASTORE_SIZE["key_types"],
            metric=DATASTORE_SIZE["metrics"],
            allow_missing=True,
        ),
    ),
    output=files(
        csv=artifact("table", table="datastore_size", ext="csv"),
        md=in_report(
            artifact("table", table="datastore_size", ext="md"),
            caption=report_caption("datastore_size"),
            category="Datastore size",
        ),
        fig2=[
            in_report(
                artifact("figure", figure="fig2_datastore_size", ext=e),
                caption=report_caption("fig2"),
                category="Datastore size",
            )
            for e in ("png", "pdf")
        ],
        fig4=[
            in_report(
                artifact("figure", figure="fig4_mask_score_by_size", ext=e),
                caption=report_caption("fig4"),
                category="Datastore size",
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("knn", "retrieval", "datastore_size", "stats", "profile"),
)


TARGETS["datastore_size"] = tables("datastore_size")
