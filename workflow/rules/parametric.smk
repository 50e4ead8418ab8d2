# Parametric alternatives to the datastore (Sec. 4, App. C): trained on the dumped keys with the LM frozen.
# One job per (variant, key type); variants are listed in knnlm.alternatives.
from knnlm.alternatives import variants

PAR = CFG["parametric"]
VARIANTS = variants(CFG)
PAR_TABLES = ["table2"]
PAR_TABLES += ["table5"] if PAR["n_values"] and PAR["key_types"] else []
PAR_TABLES += ["table6"] if PAR["adaptive"]["by"] and PAR["adaptive"]["key_types"] else []
PAR_TABLES += ["table7"] if PAR["mos"]["mixtures"] and PAR["mos"]["variants"] and PAR["mos"]["key_types"] else []
PAR_TABLES += ["clustered"] if PAR["clustered"]["key_types"] else []

wildcard_constraints:
    variant=r"nv\d+|adaptive-(freq|loss)|mos\d+-(only|embed)|cluster\d+",


rule word_stats:
    input:
        key_file=f"{R}/datastore/keys_ffn.npy",
        vals=f"{R}/datastore/vals.npy",
        ckpt=f"{R}/lm/checkpoint.pt",
    output:
        f"{R}/parametric/word_stats.npz",
    params:
        cfg=cfg_json("parametric"),
    threads: THREADS
    log:
        f"{R}/logs/word_stats.log",
    benchmark:
        f"{R}/benchmarks/word_stats.tsv"
    shell:
        knnlm("word-stats", "word_stats")
        + " --datastore {R}/datastore --checkpoint {input.ckpt} --out {output} > {log} 2>&1"


rule train_parametric:
    input:
        key_file=f"{R}/datastore/keys_{{key}}.npy",
        vals=f"{R}/datastore/vals.npy",
        ckpt=f"{R}/lm/checkpoint.pt",
        queries=expand(f"{R}/queries/{{split}}/queries_{{{{key}}}}.npy", split=EVAL_SPLITS),
        wordcounts=f"{R}/data/wordcounts.json",
        stats=lambda wc: [f"{R}/parametric/word_stats.npz"] if wc.variant.startswith("adaptive") else [],
    output:
        f"{R}/parametric/{{variant}}_{{key}}/result.json",
    params:
        cfg=cfg_json("parametric", "knn"),
        stats=lambda wc: f"--word-stats {R}/parametric/word_stats.npz" if wc.variant.startswith("adaptive") else "",
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        f"{R}/logs/train_parametric_{{variant}}_{{key}}.log",
    benchmark:
        f"{R}/benchmarks/train_parametric_{{variant}}_{{key}}.tsv"
    shell:
        knnlm("train-parametric", "train_parametric", "variant={wildcards.variant} key={wildcards.key}")
        + " --variant {wildcards.variant} --key {wildcards.key} --root {R} --out-dir {R}/parametric/{wildcards.variant}_{wildcards.key}"
        " --checkpoint {input.ckpt} {params.stats} > {log} 2>&1"


rule tables_parametric:
    input:
        results=[f"{R}/parametric/{v}_{k}/result.json" for v, k in VARIANTS],
        scores=expand(f"{R}/scores/{{key}}_{{metric}}.json", key=KEYS, metric=METRICS),
        lm=expand(f"{R}/queries/{{split}}/lm_logprobs.npy", split=EVAL_SPLITS),
        wordcounts=f"{R}/data/wordcounts.json",
    output:
        tables=expand(f"{R}/tables/{{t}}.md", t=PAR_TABLES),
        fig3=expand(f"{R}/figures/fig3_nv.{{ext}}", ext=["png", "pdf"]),
    params:
        cfg=cfg_json("parametric", "knn", "profile"),
    log:
        f"{R}/logs/tables_parametric.log",
    benchmark:
        f"{R}/benchmarks/tables_parametric.tsv"
    shell:
        knnlm("tables-parametric", "tables_parametric")
        + " --results {input.results} --scores {input.scores} --queries-root {R}/queries"
        " --wordcounts {input.wordcounts} --tables-dir {R}/tables --fig-dir {R}/figures > {log} 2>&1"
