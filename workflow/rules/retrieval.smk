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
        index=index_of("index"),
        index_meta=index_of("index_meta"),
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


# Table 3 ('table3'): the full store on the retrieval scope. With 'retrieval.table3_all_tokens', also
# 'table3_all': the full store on every token of valid and test for the paper's (key, metric) (TABLE3_KEY).
# With 'retrieval.small_store_all_tokens', also 'table3_small': the smallest swept store (the paper's 5 %) on
# every token. Same job, same columns; only the settings it reads differ.
TABLE3_SETTINGS = {"table3": ("full", RA),
                   **({"table3_all": (FULL_ALL_TOKENS, {"key_types": [TABLE3_KEY["key"]],
                                                        "metrics": [TABLE3_KEY["metric"]]})} if FULL_ALL_TOKENS else {}),
                   **({"table3_small": (SMALL_ALL_TOKENS, DS)} if SMALL_ALL_TOKENS else {})}


def table3_settings(wc):
    """Input function of write_table3: the settings of table {table}'s store, per (key, metric) of its section."""
    store, section = TABLE3_SETTINGS[wc.table]
    return expand(P("settings", store=store), key=section["key_types"], metric=section["metrics"], lm=wc.lm)


rule write_table3:
    input:
        settings=table3_settings,
    output:
        csv=P("table", table="{table}", ext="csv"),
        md=report(P("table", table="{table}", ext="md"), caption=report_caption("table3"), category="Table 3"),
        cmp_csv=P("table", table="{table}_comparisons", ext="csv"),
        cmp_md=report(P("table", table="{table}_comparisons", ext="md"), caption=report_caption("table3"),
                      category="Table 3"),
    wildcard_constraints:
        table="|".join(TABLE3_SETTINGS),
    params:
        cfg=cfg_json("retrieval", "knn", "temperature", "stats", "profile", "index"),
        io=io(),
    log:
        log_of("write", "table", "lm"),
    benchmark:
        bench_of("write", "table", "lm")
    conda:
        ENV
    shell:
        knnlm("retrieval.table3")


TARGETS["retrieval"] = tables(*TABLE3_SETTINGS)
