# Datastore size (Figures 2, 4) and temperature (Figure 5): subsets are row-id lists into the one
# datastore, one IVFPQ per subset; every setting is scored on the query scope of 'retrieval.max_queries';
# the τ × λ sweep reads the cached neighbours (no new search).
from knnlm.config import store_name

DS = CFG["datastore_size"]
SUBSETS = [store_name(r) for r in DS["ratios"] if r < 1]
SWEEP_STORES = [store_name(r) for r in DS["ratios"]]
TAU_STORES = [store_name(r) for r in CFG["temperature"]["ratios"]]
SUB = f"{R}/subsets/{{store}}"

wildcard_constraints:
    store=r"full|r[0-9.e-]+",


rule subsample:
    input:
        manifest=f"{R}/datastore/manifest.json",
    output:
        rows=f"{SUB}/rows.npy",
        meta=f"{SUB}/rows.npy.json",
    params:
        cfg=cfg_json("datastore_size"),
    log:
        f"{R}/logs/subsample_{{store}}.log",
    benchmark:
        f"{R}/benchmarks/subsample_{{store}}.tsv"
    shell:
        knnlm("subsample", "subsample", "store={wildcards.store}")
        + " --datastore {R}/datastore --store {wildcards.store} --out {output.rows} > {log} 2>&1"


rule build_subset_index:
    input:
        rows=f"{SUB}/rows.npy",
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        ckpt=f"{R}/lm/checkpoint.pt",
    output:
        index=f"{SUB}/index/{{key}}_{{metric}}.faiss",
        meta=f"{SUB}/index/{{key}}_{{metric}}.faiss.json",
    params:
        cfg=cfg_json("index", "datastore_size"),
    threads: THREADS
    resources:
        mem_mb=16000,
    log:
        f"{R}/logs/build_subset_index_{{store}}_{{key}}_{{metric}}.log",
    benchmark:
        f"{R}/benchmarks/build_subset_index_{{store}}_{{key}}_{{metric}}.tsv"
    shell:
        knnlm("build-index", "build_subset_index", "store={wildcards.store} key={wildcards.key} metric={wildcards.metric}")
        + " --datastore {R}/datastore --key {wildcards.key} --metric {wildcards.metric} --out {output.index}"
        " --checkpoint {input.ckpt} --rows {input.rows} > {log} 2>&1"


rule search_subset:
    input:
        index=f"{SUB}/index/{{key}}_{{metric}}.faiss",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
        manifest=f"{R}/queries/{{split}}/manifest.json",
    output:
        ids=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}_ids.npy",
        dists=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}_dists.npy",
        meta=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}.json",
    params:
        cfg=cfg_json("index", "knn", "retrieval"),
        prefix=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}",
    threads: THREADS
    log:
        f"{R}/logs/search_subset_{{store}}_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/search_subset_{{store}}_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("search", "search_subset",
              "store={wildcards.store} key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --index {input.index} --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --split {wildcards.split} --scope --out-prefix {params.prefix} > {log} 2>&1"


rule real_score_subset:
    input:
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        ids=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}_ids.npy",
        meta=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}.json",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
    output:
        f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}_realdists.npy",
    params:
        cfg=cfg_json("retrieval"),
        prefix=f"{SUB}/neighbours/{{key}}_{{metric}}_{{split}}",
    threads: THREADS
    log:
        f"{R}/logs/real_score_subset_{{store}}_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/real_score_subset_{{store}}_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("real-score", "real_score_subset",
              "store={wildcards.store} key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --datastore {R}/datastore --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --neighbours-prefix {params.prefix} --out {output} > {log} 2>&1"


rule exact_search_subset:
    input:
        rows=f"{SUB}/rows.npy",
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
    output:
        ids=f"{SUB}/exact/{{key}}_{{metric}}_{{split}}_ids.npy",
        dists=f"{SUB}/exact/{{key}}_{{metric}}_{{split}}_dists.npy",
        meta=f"{SUB}/exact/{{key}}_{{metric}}_{{split}}.json",
    params:
        cfg=cfg_json("retrieval", "knn"),
        prefix=f"{SUB}/exact/{{key}}_{{metric}}_{{split}}",
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        f"{R}/logs/exact_search_subset_{{store}}_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/exact_search_subset_{{store}}_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("exact-search", "exact_search_subset",
              "store={wildcards.store} key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --datastore {R}/datastore --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --rows {input.rows} --out-prefix {params.prefix} > {log} 2>&1"


def store_dir(store):
    return R if store == "full" else f"{R}/subsets/{store}"


def sweep_inputs(wc):
    d = store_dir(wc.store)
    pre = [f"{d}/neighbours/{wc.key}_{wc.metric}_{s}" for s in EVAL_SPLITS]
    ex = [f"{d}/exact/{wc.key}_{wc.metric}_{s}" for s in EVAL_SPLITS]
    return ([p + x for p in pre for x in ("_ids.npy", "_dists.npy", ".json", "_realdists.npy")]
            + [p + x for p in ex for x in ("_ids.npy", "_dists.npy", ".json")])


rule sweep:
    input:
        sweep_inputs,
        vals=f"{R}/datastore/vals.npy",
        lm=expand(f"{R}/queries/{{split}}/lm_logprobs.npy", split=EVAL_SPLITS),
    output:
        f"{R}/sweeps/{{store}}_{{key}}_{{metric}}.json",
    params:
        cfg=cfg_json("knn", "retrieval", "datastore_size", "temperature"),
        store_dir=lambda wc: store_dir(wc.store),
        tau=lambda wc: "--tau-sweep" if wc.store in TAU_STORES else "",
    threads: THREADS
    log:
        f"{R}/logs/sweep_{{store}}_{{key}}_{{metric}}.log",
    benchmark:
        f"{R}/benchmarks/sweep_{{store}}_{{key}}_{{metric}}.tsv"
    shell:
        knnlm("sweep", "sweep", "store={wildcards.store} key={wildcards.key} metric={wildcards.metric}")
        + " --root {R} --store {wildcards.store} --store-dir {params.store_dir} --key {wildcards.key}"
        " --metric {wildcards.metric} {params.tau} --out {output} > {log} 2>&1"


rule figures:
    input:
        expand(f"{R}/sweeps/{{store}}_{{key}}_{{metric}}.json", store=SWEEP_STORES, key=DS["key_types"],
               metric=DS["metrics"]),
    output:
        fig2=expand(f"{R}/figures/fig2_datastore_size.{{ext}}", ext=["png", "pdf"]),
        fig4=expand(f"{R}/figures/fig4_mask_score_by_size.{{ext}}", ext=["png", "pdf"]),
        fig5=expand(f"{R}/figures/fig5_temperature_{{store}}.{{ext}}", store=TAU_STORES, ext=["png", "pdf"]),
        size=f"{R}/tables/datastore_size.md",
        tau=f"{R}/tables/temperature.md",
    params:
        cfg=cfg_json("knn", "retrieval", "datastore_size", "temperature", "profile"),
    log:
        f"{R}/logs/figures.log",
    benchmark:
        f"{R}/benchmarks/figures.tsv"
    shell:
        knnlm("figures", "figures") + " --sweeps {input} --fig-dir {R}/figures --tables-dir {R}/tables > {log} 2>&1"
