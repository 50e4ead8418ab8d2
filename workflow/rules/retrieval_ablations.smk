# Table 3: approximate (FAISS) vs exact ("real") mask and score, on the query scope of config 'retrieval'.
RA = CFG["retrieval"]


rule real_score:
    input:
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        ids=f"{R}/neighbours/{{key}}_{{metric}}_{{split}}_ids.npy",
        meta=f"{R}/neighbours/{{key}}_{{metric}}_{{split}}.json",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
    output:
        f"{R}/neighbours/{{key}}_{{metric}}_{{split}}_realdists.npy",
    params:
        cfg=cfg_json("retrieval"),
    threads: THREADS
    log:
        f"{R}/logs/real_score_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/real_score_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("real-score", "real_score", "key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --datastore {R}/datastore --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --neighbours-prefix {R}/neighbours/{wildcards.key}_{wildcards.metric}_{wildcards.split}"
        " --out {output} > {log} 2>&1"


rule exact_search:
    input:
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        manifest=f"{R}/datastore/manifest.json",
        queries=f"{R}/queries/{{split}}/queries_{{key}}.npy",
    output:
        ids=f"{R}/exact/{{key}}_{{metric}}_{{split}}_ids.npy",
        dists=f"{R}/exact/{{key}}_{{metric}}_{{split}}_dists.npy",
        meta=f"{R}/exact/{{key}}_{{metric}}_{{split}}.json",
    params:
        cfg=cfg_json("retrieval", "knn"),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        f"{R}/logs/exact_search_{{key}}_{{metric}}_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/exact_search_{{key}}_{{metric}}_{{split}}.tsv"
    shell:
        knnlm("exact-search", "exact_search", "key={wildcards.key} metric={wildcards.metric} split={wildcards.split}")
        + " --datastore {R}/datastore --queries-dir {R}/queries/{wildcards.split} --key {wildcards.key}"
        " --metric {wildcards.metric} --out-prefix {R}/exact/{wildcards.key}_{wildcards.metric}_{wildcards.split}"
        " > {log} 2>&1"


rule table3:
    input:
        expand(f"{R}/neighbours/{{key}}_{{metric}}_{{split}}_realdists.npy", key=RA["key_types"],
               metric=RA["metrics"], split=EVAL_SPLITS),
        expand(f"{R}/exact/{{key}}_{{metric}}_{{split}}_ids.npy", key=RA["key_types"], metric=RA["metrics"],
               split=EVAL_SPLITS),
        expand(f"{R}/scores/{{key}}_{{metric}}.json", key=RA["key_types"], metric=RA["metrics"]),
    output:
        csv=f"{R}/tables/table3.csv",
        md=f"{R}/tables/table3.md",
    params:
        cfg=cfg_json("retrieval", "knn", "profile"),
    log:
        f"{R}/logs/table3.log",
    benchmark:
        f"{R}/benchmarks/table3.tsv"
    shell:
        knnlm("table3", "table3") + " --root {R} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"
