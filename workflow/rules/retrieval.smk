# faiss IVFPQ per (key type, metric), then the top-k neighbour cache for valid and test.

rule build_index:
    input:
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        ckpt=f"{R}/lm/checkpoint.pt",
    output:
        index=f"{R}/index/{{key}}_{{metric}}.faiss",
        meta=f"{R}/index/{{key}}_{{metric}}.faiss.json",
    params:
        cfg=cfg_json("index"),
    threads: THREADS
    resources:
        mem_mb=16000,
    log:
        f"{R}/logs/build_index_{{key}}_{{metric}}.log",
    benchmark:
        f"{R}/benchmarks/build_index_{{key}}_{{metric}}.tsv"
    shell:
        knnlm("build-index", "build_index", "key={wildcards.key} metric={wildcards.metric}")
        + " --datastore {R}/datastore --key {wildcards.key} --metric {wildcards.metric} --out {output.index}"
        " --checkpoint {input.ckpt} > {log} 2>&1"


rule search:
    input:
        index=f"{R}/index/{{key}}_{{metric}}.faiss",
        meta=f"{R}/index/{{key}}_{{metric}}.faiss.json",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
        manifest=f"{R}/queries/{{split}}/manifest.json",
    output:
        ids=f"{R}/neighbours/{{key}}_{{metric}}_{{split}}_ids.npy",
        dists=f"{R}/neighbours/{{key}}_{{metric}}_{{split}}_dists.npy",
        meta=f"{R}/neighbours/{{key}}_{{metric}}_{{split}}.json",
    params:
        cfg=cfg_json("index", "knn"),
    threads: THREADS
    log:
        f"{R}/logs/search_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/search_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("search", "search", "key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --index {input.index} --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --split {wildcards.split}"
        " --out-prefix {R}/neighbours/{wildcards.key}_{wildcards.metric}_{wildcards.split} > {log} 2>&1"
