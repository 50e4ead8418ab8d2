# Retrieval for every datastore variant {store} (knnlm.stores: full, r<ratio> subsets, ...): one family of
# rules serves them all. Then Table 3 (Xu et al. 2023, Sec. 5): FAISS vs real mask and score.


rule scope:
    input:
        documents=P("documents"),
    output:
        out=P("scope"),
    params:
        cfg=cfg_json("retrieval"),
        io=io(),
    log:
        log_of("scope", "lm", "split"),
    benchmark:
        bench_of("scope", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("retrieval.scope")


rule prepare_store:
    input:
        **datastore("{key}"),
    output:
        store=directory(P("store_prep")),
    params:
        cfg=cfg_json("datastore_size", "index"),
        io=io(),
    threads: THREADS
    log:
        log_of("prepare_store", "lm", "store", "key"),
    benchmark:
        bench_of("prepare_store", "lm", "store", "key")
    conda:
        ENV
    shell:
        knnlm("retrieval.prepare_store")


rule build_index:
    input:
        **datastore("{key}"),
        store=P("store_prep"),
    output:
        index=P("index"),
        meta=P("index_meta"),
    params:
        cfg=cfg_json("index"),
        io=io(),
    threads: THREADS
    resources:
        mem_mb=16000,
    log:
        log_of("build_index", "lm", "store", "key", "metric"),
    benchmark:
        bench_of("build_index", "lm", "store", "key", "metric")
    conda:
        ENV
    shell:
        knnlm("retrieval.build_index")


rule search:
    input:
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=P("store_prep"),
        index=P("index"),
        index_meta=P("index_meta"),
        scope=scope_of(full_is_all=True),
    output:
        ids=P("nb_ids"),
        dists=P("nb_dists"),
        meta=P("nb_meta"),
    params:
        cfg=cfg_json("index", "knn", "retrieval"),
        io=io(),
    threads: THREADS
    log:
        log_of("search", "lm", "store", "key", "metric", "split"),
    benchmark:
        bench_of("search", "lm", "store", "key", "metric", "split")
    conda:
        ENV
    shell:
        knnlm("retrieval.search")


rule real_score:
    input:
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=P("store_prep"),
        scope=scope_of(),
        nb_ids=P("nb_ids"),
        nb_meta=P("nb_meta"),
    output:
        dists=P("real_dists"),
        meta=P("real_meta"),
    params:
        cfg=cfg_json("retrieval"),
        io=io(),
    threads: THREADS
    log:
        log_of("real_score", "lm", "store", "key", "metric", "split"),
    benchmark:
        bench_of("real_score", "lm", "store", "key", "metric", "split")
    conda:
        ENV
    shell:
        knnlm("retrieval.real_score")


rule exact_search:
    input:
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=P("store_prep"),
        scope=scope_of(),
    output:
        ids=P("exact_ids"),
        dists=P("exact_dists"),
        meta=P("exact_meta"),
    params:
        cfg=cfg_json("retrieval", "knn"),
        io=io(),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        log_of("exact_search", "lm", "store", "key", "metric", "split"),
    benchmark:
        bench_of("exact_search", "lm", "store", "key", "metric", "split")
    conda:
        ENV
    shell:
        knnlm("retrieval.exact_search")


rule settings:
    input:
        **SETTINGS_INPUTS,
    output:
        out=P("settings"),
    params:
        cfg=cfg_json("knn", "retrieval", "temperature", "stats"),
        io=io(),
    threads: THREADS
    log:
        log_of("settings", "lm", "store", "key", "metric"),
    benchmark:
        bench_of("settings", "lm", "store", "key", "metric")
    conda:
        ENV
    shell:
        knnlm("retrieval.settings")


rule write_table3:
    input:
        settings=expand(P("settings", store="full"), key=RA["key_types"], metric=RA["metrics"], allow_missing=True),
    output:
        csv=P("table", table="table3", ext="csv"),
        md=report(P("table", table="table3", ext="md"), caption=report_caption("table3"), category="Table 3"),
        cmp_csv=P("table", table="table3_comparisons", ext="csv"),
        cmp_md=report(P("table", table="table3_comparisons", ext="md"), caption=report_caption("table3"),
                      category="Table 3"),
    params:
        cfg=cfg_json("retrieval", "knn", "temperature", "stats", "profile"),
        io=io(),
    log:
        log_of("write_table3", "lm"),
    benchmark:
        bench_of("write_table3", "lm")
    conda:
        ENV
    shell:
        knnlm("retrieval.table3")


if SMALL_ALL_TOKENS:
    # Table 3 on the smallest swept store (the paper's 5 %), every token of valid and test (issue 9): its exact
    # search costs the store's ratio of the full store's, so the whole splits fit where the full store's do not.

    rule write_table3_small:
        input:
            settings=expand(P("settings", store=SMALL_ALL_TOKENS), key=DS["key_types"], metric=DS["metrics"],
                            allow_missing=True),
        output:
            csv=P("table", table="table3_small", ext="csv"),
            md=report(P("table", table="table3_small", ext="md"), caption=report_caption("table3"),
                      category="Table 3"),
            cmp_csv=P("table", table="table3_small_comparisons", ext="csv"),
            cmp_md=report(P("table", table="table3_small_comparisons", ext="md"), caption=report_caption("table3"),
                          category="Table 3"),
        params:
            cfg=cfg_json("retrieval", "knn", "temperature", "stats", "profile"),
            io=io(),
        log:
            log_of("write_table3_small", "lm"),
        benchmark:
            bench_of("write_table3_small", "lm")
        conda:
            ENV
        shell:
            knnlm("retrieval.table3")


TARGETS["retrieval"] = tables("table3", *(["table3_small"] if SMALL_ALL_TOKENS else []))
