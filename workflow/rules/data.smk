# Data: raw WikiText splits -> (sliced) copies + word counts -> sentencepiece BPE -> fairseq binarised data.

if CFG["data"]["download"]:

    rule download:
        output:
            [str(p) for p in split_files(CFG).values()],
        params:
            cfg=cfg_json("data"),
        log:
            f"{R}/logs/download.log",
        shell:
            knnlm("download", "download") + " > {log} 2>&1"


# ancient(): the raw corpus is external (often a shared, re-mounted directory whose mtimes change); its
# content is pinned by data.sha256 where given, so a newer mtime alone does not rerun the whole DAG.
rule prepare_data:
    input:
        [ancient(str(p)) for p in split_files(CFG).values()],
    output:
        expand(f"{R}/data/wiki.{{split}}.tokens", split=SPLITS),
        wordcounts=f"{R}/data/wordcounts.json",
    params:
        cfg=cfg_json("data"),
    log:
        f"{R}/logs/prepare_data.log",
    benchmark:
        f"{R}/benchmarks/prepare_data.tsv"
    shell:
        knnlm("prepare-data", "prepare_data") + " --out-dir {R}/data > {log} 2>&1"


rule bpe:
    input:
        expand(f"{R}/data/wiki.{{split}}.tokens", split=SPLITS),
    output:
        model=f"{R}/bpe/spm.model",
        bpe=expand(f"{R}/bpe/{{split}}.bpe", split=SPLITS),
        stats=f"{R}/bpe/bpe_stats.json",
    params:
        cfg=cfg_json("bpe"),
    threads: THREADS
    log:
        f"{R}/logs/bpe.log",
    benchmark:
        f"{R}/benchmarks/bpe.tsv"
    shell:
        knnlm("bpe", "bpe") + " --data-dir {R}/data --out-dir {R}/bpe > {log} 2>&1"


rule preprocess:
    input:
        expand(f"{R}/bpe/{{split}}.bpe", split=SPLITS),
    output:
        directory(f"{R}/data-bin"),
    params:
        cfg=cfg_json(),
    threads: THREADS
    log:
        f"{R}/logs/preprocess.log",
    benchmark:
        f"{R}/benchmarks/preprocess.tsv"
    shell:
        knnlm("preprocess", "preprocess") + " --bpe-dir {R}/bpe --out-dir {output} > {log} 2>&1"
