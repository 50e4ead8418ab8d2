# One LM pass over train (datastore keys att + ffn, vals) and once over valid/test (queries, LM log-probs).

rule dump_datastore:
    input:
        ckpt=f"{R}/lm/checkpoint.pt",
        data=f"{R}/data-bin",
    output:
        key_files=expand(f"{R}/datastore/keys_{{key}}.npy", key=["att", "ffn"]),
        vals=f"{R}/datastore/vals.npy",
        manifest=f"{R}/datastore/manifest.json",
    params:
        cfg=cfg_json("eval"),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        f"{R}/logs/dump_datastore.log",
    benchmark:
        f"{R}/benchmarks/dump_datastore.tsv"
    shell:
        knnlm("dump-datastore", "dump_datastore")
        + " --checkpoint {input.ckpt} --data-bin {input.data} --out-dir {R}/datastore > {log} 2>&1"


rule dump_queries:
    input:
        ckpt=f"{R}/lm/checkpoint.pt",
        data=f"{R}/data-bin",
        wordcounts=f"{R}/data/wordcounts.json",
    output:
        targets=f"{R}/queries/{{split}}/targets.npy",
        lm=f"{R}/queries/{{split}}/lm_logprobs.npy",
        queries=expand(f"{R}/queries/{{{{split}}}}/queries_{{key}}.npy", key=["att", "ffn"]),
        manifest=f"{R}/queries/{{split}}/manifest.json",
    params:
        cfg=cfg_json("eval"),
    threads: THREADS
    log:
        f"{R}/logs/dump_queries_{{split}}.log",
    benchmark:
        f"{R}/benchmarks/dump_queries_{{split}}.tsv"
    shell:
        knnlm("dump-queries", "dump_queries", "split={wildcards.split}")
        + " --checkpoint {input.ckpt} --data-bin {input.data} --split {wildcards.split}"
        " --out-dir {R}/queries/{wildcards.split} --wordcounts {input.wordcounts} > {log} 2>&1"
