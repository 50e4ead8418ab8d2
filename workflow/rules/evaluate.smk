# p_kNN from the neighbour cache, λ tuned on valid, reported on valid and test; Table 1.

rule score:
    input:
        vals=f"{R}/datastore/vals.npy",
        manifest=f"{R}/datastore/manifest.json",
        wordcounts=f"{R}/data/wordcounts.json",
        neighbours=expand(f"{R}/neighbours/{{{{key}}}}_{{{{metric}}}}_{{split}}{{ext}}", split=EVAL_SPLITS,
                          ext=["_ids.npy", "_dists.npy", ".json"]),
        lm=expand(f"{R}/queries/{{split}}/lm_logprobs.npy", split=EVAL_SPLITS),
    output:
        json=f"{R}/scores/{{key}}_{{metric}}.json",
        knn=expand(f"{R}/scores/{{{{key}}}}_{{{{metric}}}}_{{split}}_knn_logprobs.npy", split=EVAL_SPLITS),
    params:
        cfg=cfg_json("knn"),
    log:
        f"{R}/logs/score_{{key}}_{{metric}}.log",
    benchmark:
        f"{R}/benchmarks/score_{{key}}_{{metric}}.tsv"
    shell:
        knnlm("score", "score", "key={wildcards.key} metric={wildcards.metric}")
        + " --datastore {R}/datastore --queries-root {R}/queries"
        " --neighbours-prefix {R}/neighbours/{wildcards.key}_{wildcards.metric} --key {wildcards.key}"
        " --metric {wildcards.metric} --wordcounts {input.wordcounts}"
        " --out-prefix {R}/scores/{wildcards.key}_{wildcards.metric} > {log} 2>&1"


rule table1:
    input:
        scores=expand(f"{R}/scores/{{key}}_{{metric}}.json", key=KEYS, metric=METRICS),
        lm=expand(f"{R}/queries/{{split}}/lm_logprobs.npy", split=EVAL_SPLITS),
        wordcounts=f"{R}/data/wordcounts.json",
    output:
        csv=f"{R}/tables/table1.csv",
        md=f"{R}/tables/table1.md",
    params:
        cfg=cfg_json("knn", "profile"),
    log:
        f"{R}/logs/table1.log",
    benchmark:
        f"{R}/benchmarks/table1.tsv"
    shell:
        knnlm("table1", "table1")
        + " --queries-root {R}/queries --wordcounts {input.wordcounts} --scores {input.scores}"
        " --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"
