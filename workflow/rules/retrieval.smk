# Retrieval for every datastore variant {store} (knnlm.stores: full, r<ratio> subsets, ...): one family of
# rules serves them all. Then Table 3 (Xu et al. 2023, Sec. 5): FAISS vs real mask and score.


rule scope:
    input:
        documents=artifact("documents"),
    output:
        out=artifact("scope"),
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


# The valid tokens of the stores scored on every token (config 'retrieval.tuning_documents'): whole documents, where
# their λ and τ are tuned; their test tokens stay every token.
rule tuning_sample:
    input:
        documents=artifact("documents"),
    output:
        out=artifact("tuning_sample"),
    wildcard_constraints:
        split="valid",
    params:
        cfg=cfg_with_keys("retrieval", ["tuning_documents", "scope_seed"]),
        io=io(),
    log:
        log_of("tuning_sample", "lm", "split"),
    benchmark:
        bench_of("tuning_sample", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("retrieval.tuning_sample")


rule prepare_store:
    input:
        **datastore("{key}"),
    output:
        store=directory(artifact("store_prep")),
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
        store=artifact("store_prep"),
    output:
        index=artifact("index"),
        meta=artifact("index_meta"),
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
        store=artifact("store_prep"),
        index=index_of("index"),
        index_meta=index_of("index_meta"),
        scope=scope_of(full_is_all=True),
        tuning_sample=tuning_sample_of(),
    output:
        ids=artifact("nb_ids"),
        dists=artifact("nb_dists"),
        meta=artifact("nb_meta"),
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
        store=artifact("store_prep"),
        scope=scope_of(),
        tuning_sample=tuning_sample_of(),
        nb_ids=search_of("nb_ids"),
        nb_meta=search_of("nb_meta"),
    output:
        dists=artifact("real_dists"),
        meta=artifact("real_meta"),
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


# The real mask (exact top-k over the store's keys). With 'retrieval.exact_shards' > 1: one exact_search job per
# shard of the store's keys (whole key chunks, knnlm.stores.shard_spans) and exact_merge, which combines their top-k
# into the store's (knnlm.exact.merge_topk: the same ids and distances as one scan).
EXACT_SHARDS = RETRIEVAL["exact_shards"]
EXACT_OUTPUTS = dict(ids=artifact("exact_ids"), dists=artifact("exact_dists"), meta=artifact("exact_meta"))
SHARDED = ["shard"] if EXACT_SHARDS > 1 else []  # the shard wildcard of a sharded search's logs and benchmarks


rule exact_search:
    input:
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=artifact("store_prep"),
        scope=scope_of(),
        tuning_sample=tuning_sample_of(),
    output:
        **(EXACT_OUTPUTS if EXACT_SHARDS == 1 else
           # a shard's top-k is deleted once merged (temp): T x k x 8 bytes per shard, 2 GB at WikiText-103's test split
           dict(ids=temp(artifact("exact_shard_ids")), dists=temp(artifact("exact_shard_dists")),
                meta=temp(artifact("exact_shard_meta")))),
    params:
        cfg=cfg_json("retrieval", "knn"),
        io=io(),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        log_of("exact_search", "lm", "store", "key", "metric", "split", *SHARDED),
    benchmark:
        bench_of("exact_search", "lm", "store", "key", "metric", "split", *SHARDED)
    conda:
        ENV
    shell:
        knnlm("retrieval.exact_search")


if EXACT_SHARDS > 1:

    rule exact_merge:
        input:
            shard_ids=expand(artifact("exact_shard_ids"), shard=range(EXACT_SHARDS), allow_missing=True),
            shard_dists=expand(artifact("exact_shard_dists"), shard=range(EXACT_SHARDS), allow_missing=True),
            shard_meta=expand(artifact("exact_shard_meta"), shard=range(EXACT_SHARDS), allow_missing=True),
        output:
            **EXACT_OUTPUTS,
        params:
            cfg=cfg_json("retrieval", "knn"),
            io=io(),
        log:
            log_of("exact_merge", "lm", "store", "key", "metric", "split"),
        benchmark:
            bench_of("exact_merge", "lm", "store", "key", "metric", "split")
        conda:
            ENV
        shell:
            knnlm("retrieval.exact_merge")


rule settings:
    input:
        **SETTINGS_INPUTS,
    output:
        out=artifact("settings"),
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
# 'table3_all': the full store on every token of test and of valid (or valid's tuning sample, config
# 'retrieval.tuning_documents') for the paper's (key, metric) (TABLE3_KEY).
# With 'retrieval.small_store_all_tokens', also 'table3_small': the smallest swept store (the paper's 5 %) on
# every token. Same job, same columns; only the settings it reads differ.
TABLE3_SETTINGS = {"table3": settings_of("full", RETRIEVAL),
                   **({"table3_all": settings_of(FULL_ALL_TOKENS, {"key_types": [TABLE3_KEY["key"]],
                                                                     "metrics": [TABLE3_KEY["metric"]]})}
                      if FULL_ALL_TOKENS else {}),
                   **({"table3_small": settings_of(SMALL_ALL_TOKENS, DATASTORE_SIZE)} if SMALL_ALL_TOKENS else {})}


rule write_table3:
    input:
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        settings=lambda wc: expand(TABLE3_SETTINGS[wc.table], lm=wc.lm),  # table {table}'s store, per (key, metric)
    output:
        csv=artifact("table", table="{table}", ext="csv"),
        md=report(artifact("table", table="{table}", ext="md"), caption=report_caption("table3"), category="Table 3"),
        cmp_csv=artifact("table", table="{table}_comparisons", ext="csv"),
        cmp_md=report(artifact("table", table="{table}_comparisons", ext="md"), caption=report_caption("table3"),
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
