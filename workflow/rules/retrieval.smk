# Retrieval for every datastore variant {store} (knnlm.datastore.stores: full, r<ratio> subsets, ...): one family of
# rules serves them all. Then Table 3 (Xu et al. 2023, Sec. 5): FAISS vs real mask and score.


knnlm_rule(
    "scope",
    "retrieval.scope",
    input=files(
        documents=artifact("documents"),
    ),
    output=files(
        out=artifact("scope"),
    ),
    cfg=cfg_json("retrieval"),
)


# The valid tokens of the stores scored on every token (config 'retrieval.tuning_documents'): whole documents, where
# their λ and τ are tuned; their test tokens stay every token.
knnlm_rule(
    "tuning_sample",
    "retrieval.tuning_sample",
    input=files(
        documents=artifact("documents"),
    ),
    output=files(
        out=artifact("tuning_sample"),
    ),
    cfg=cfg_with_keys("retrieval", ["tuning_documents", "scope_seed"]),
    constraints=dict(
        split="valid",
    ),
)


# The tokens of the stores scored on every token when 'retrieval.table3_fraction' < 1: a block sample of that share of
# every test token and of valid's tuning sample (sized by the rule of docs/statistics.md, target 'sample_size').
knnlm_rule(
    "table3_sample",
    "retrieval.table3_sample",
    input=files(
        documents=artifact("documents"),
        tuning_sample=lambda wc: (
            artifact("tuning_sample", lm=wc.lm, split="valid")
            if RETRIEVAL["tuning_documents"] and wc.split == "valid"
            else []
        ),
    ),
    output=files(
        out=artifact("table3_sample"),
    ),
    cfg=cfg_with_keys("retrieval", ["table3_fraction", "tuning_documents", "scope_seed"]),
)


knnlm_rule(
    "prepare_store",
    "retrieval.prepare_store",
    input=files(
        **datastore("{key}"),
    ),
    output=files(
        store=directory(artifact("store_prep")),
    ),
    cfg=cfg_of_store("datastore_size", "index"),
    threads=THREADS,
)


knnlm_rule(
    "build_index",
    "retrieval.build_index",
    input=files(
        **datastore("{key}"),
        store=artifact("store_prep"),
    ),
    output=files(
        index=artifact("index"),
        meta=artifact("index_meta"),
    ),
    cfg=cfg_json("index"),
    threads=THREADS,
    resources=dict(
        mem_mb=16000,
    ),
)


knnlm_rule(
    "search",
    "retrieval.search",
    input=files(
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=artifact("store_prep"),
        index=index_of("index"),
        index_meta=index_of("index_meta"),
        scope=scope_of(full_is_all=True),
        tuning_sample=tuning_sample_of(),
        table3_sample=table3_sample_of(),
    ),
    output=files(
        ids=artifact("nb_ids"),
        dists=artifact("nb_dists"),
        meta=artifact("nb_meta"),
    ),
    cfg=cfg_json("index", "knn", "retrieval"),
    threads=THREADS,
)


knnlm_rule(
    "real_score",
    "retrieval.real_score",
    input=files(
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=artifact("store_prep"),
        scope=scope_of(),
        tuning_sample=tuning_sample_of(),
        table3_sample=table3_sample_of(),
        nb_ids=search_of("nb_ids"),
        nb_meta=search_of("nb_meta"),
    ),
    output=files(
        dists=artifact("real_dists"),
        meta=artifact("real_meta"),
    ),
    cfg=cfg_json("retrieval"),
    threads=THREADS,
)


# The real mask (exact top-k over the store's keys). With 'retrieval.exact_shards' > 1: one exact_search job per
# shard of the store's keys (whole key chunks, knnlm.datastore.stores.shard_spans) and exact_merge, which combines their
# top-k into the store's (knnlm.search.exact.merge_topk: the same ids and distances as one scan).
EXACT_OUTPUTS = dict(ids=artifact("exact_ids"), dists=artifact("exact_dists"), meta=artifact("exact_meta"))
SHARDED = ["shard"] if EXACT_SHARDS > 1 else []  # the shard wildcard of a sharded search's logs and benchmarks


knnlm_rule(
    "exact_search",
    "retrieval.exact_search",
    input=files(
        **datastore("{key}"),
        **queries("{split}", "{key}"),
        store=artifact("store_prep"),
        scope=scope_of(),
        tuning_sample=tuning_sample_of(),
        table3_sample=table3_sample_of(),
    ),
    output=files(
        **(
            EXACT_OUTPUTS
            if EXACT_SHARDS == 1
            else
            # a shard's top-k is deleted once merged (temp): T x k x 8 bytes per shard, 2 GB at WikiText-103's test split
            dict(
                ids=temp(artifact("exact_shard_ids")),
                dists=temp(artifact("exact_shard_dists")),
                meta=temp(artifact("exact_shard_meta")),
            )
        ),
    ),
    cfg=cfg_json("retrieval", "knn"),
    threads=THREADS,
    resources=dict(
        mem_mb=8000,
    ),
)


if EXACT_SHARDS > 1:

    knnlm_rule(
        "exact_merge",
        "retrieval.exact_merge",
        input=files(
            shard_ids=expand(artifact("exact_shard_ids"), shard=range(EXACT_SHARDS), allow_missing=True),
            shard_dists=expand(artifact("exact_shard_dists"), shard=range(EXACT_SHARDS), allow_missing=True),
            shard_meta=expand(artifact("exact_shard_meta"), shard=range(EXACT_SHARDS), allow_missing=True),
        ),
        output=files(
            **EXACT_OUTPUTS,
        ),
        cfg=cfg_json("retrieval", "knn"),
    )


knnlm_rule(
    "settings",
    "retrieval.settings",
    input=files(
        **SETTINGS_INPUTS,
    ),
    output=files(
        out=artifact("settings"),
    ),
    cfg=cfg_json("knn", "retrieval", "temperature", "stats"),
    threads=THREADS,
)


# FAISS mask + FAISS score alone, the same job without the exact search and the real score it would wait for: what
# the regime map needs of its key and metric variants (the effects that compare keys or metrics)
knnlm_rule(
    "settings_faiss",
    "retrieval.settings",
    input=files(
        **{
            n: v
            for n, v in SETTINGS_INPUTS.items()
            if n not in ("real_dists", "exact_ids", "exact_dists", "exact_meta")
        }
    ),
    output=files(
        out=artifact("settings_faiss"),
    ),
    cfg=cfg_json("knn", "retrieval", "temperature", "stats"),
    threads=THREADS,
)


# Table 3 ('table3'): the full store on the retrieval scope. With 'retrieval.table3_all_tokens', also
# 'table3_all': the full store on every token of test and of valid (or valid's tuning sample, config
# 'retrieval.tuning_documents') for the paper's (key, metric) (TABLE3_KEY).
# With 'retrieval.small_store_all_tokens', also 'table3_small': the smallest swept store (the paper's 5 %) on
# every token. Same job, same columns; only the settings it reads differ.
TABLE3_SETTINGS = {
    "table3": settings_of("full", RETRIEVAL),
    **(
        {
            "table3_all": settings_of(
                FULL_ALL_TOKENS, {"key_types": [TABLE3_KEY["key"]], "metrics": [TABLE3_KEY["metric"]]}
            )
        }
        if FULL_ALL_TOKENS
        else {}
    ),
    **({"table3_small": settings_of(SMALL_ALL_TOKENS, DATASTORE_SIZE)} if SMALL_ALL_TOKENS else {}),
}


knnlm_rule(
    "write_table3",
    "retrieval.table3",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        settings=lambda wc: expand(TABLE3_SETTINGS[wc.table], lm=wc.lm),  # table {table}'s store, per (key, metric)
    ),
    output=files(
        csv=artifact("table", table="{table}", ext="csv"),
        md=in_report(
            artifact("table", table="{table}", ext="md"), caption=report_caption("table3"), category="Table 3"
        ),
        cmp_csv=artifact("table", table="{table}_comparisons", ext="csv"),
        cmp_md=in_report(
            artifact("table", table="{table}_comparisons", ext="md"),
            caption=report_caption("table3"),
            category="Table 3",
        ),
    ),
    cfg=cfg_json("retrieval", "knn", "temperature", "stats", "profile", "index"),
    constraints=dict(
        table="|".join(TABLE3_SETTINGS),
    ),
    wildcards=("table", "lm"),
    log_name="write",
)


TARGETS["retrieval"] = tables(*TABLE3_SETTINGS)
