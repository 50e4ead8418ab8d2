# Datastore size (Xu et al. 2023, Sec. 5, Figures 2 and 4): the mask/score settings of the stores
# r<ratio> (seeded random subsets, knnlm.stores) and the full one.
SIZE_STORES = [store_name(r) for r in DATASTORE_SIZE["ratios"]]
NESTED_STORES = [store_name(r) for r in sorted(DATASTORE_SIZE["ratios"])]


if len(NESTED_STORES) > 1:

    # The real mask of every size in one scan (the subsets are nested: each is a prefix of one scan order), for
    # the cost of the largest: knnlm.experiments.retrieval.exact_search_nested. Other stores: rule exact_search.
    rule exact_search_nested:
        input:
            **datastore("{key}"),
            **queries("{split}", "{key}"),
            stores=expand(artifact("store_prep"), store=NESTED_STORES, allow_missing=True),
            scope=artifact("scope"),
        output:
            ids=expand(artifact("exact_ids"), store=NESTED_STORES, allow_missing=True),
            dists=expand(artifact("exact_dists"), store=NESTED_STORES, allow_missing=True),
            meta=expand(artifact("exact_meta"), store=NESTED_STORES, allow_missing=True),
        wildcard_constraints:
            key="|".join(DATASTORE_SIZE["key_types"]),
            metric="|".join(DATASTORE_SIZE["metrics"]),
        params:
            cfg=cfg_json("retrieval", "knn"),
            io=io(),
        threads: THREADS
        resources:
            mem_mb=8000,
        log:
            log_of("exact_search_nested", "lm", "key", "metric", "split"),
        benchmark:
            bench_of("exact_search_nested", "lm", "key", "metric", "split")
        conda:
            ENV
        shell:
            knnlm("retrieval.exact_search_nested")

    ruleorder: exact_search_nested > exact_search


rule write_datastore_size:
    input:
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        settings=expand(artifact("settings"), store=SIZE_STORES, key=DATASTORE_SIZE["key_types"], metric=DATASTORE_SIZE["metrics"], allow_missing=True),
    output:
        csv=artifact("table", table="datastore_size", ext="csv"),
        md=report(artifact("table", table="datastore_size", ext="md"), caption=report_caption("datastore_size"),
                  category="Datastore size"),
        fig2=[report(artifact("figure", figure="fig2_datastore_size", ext=e), caption=report_caption("fig2"),
                     category="Datastore size") for e in ("png", "pdf")],
        fig4=[report(artifact("figure", figure="fig4_mask_score_by_size", ext=e), caption=report_caption("fig4"),
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
