# The corpus: raw splits -> (sliced) copies + word counts -> sentencepiece BPE -> fairseq binarised data.
# Corpus-level artifacts are shared by every base LM of the run that uses this tokenizer; each LM's tokens
# get their own documents (a Hugging Face LM tokenises the text itself).

if CFG["data"]["download"]:

    rule download:
        output:
            splits=[str(p) for p in split_files(CFG).values()],
        params:
            cfg=cfg_json("data"),
            io=io(),
        log:
            log_of("download"),
        conda:
            ENV
        shell:
            knnlm("spine.download")


# ancient(): the raw corpus (a folder or one archive) is often a shared, re-mounted directory or a fresh clone whose
# mtimes change; its content is pinned by data.sha256 (checked by this job), so a newer mtime alone does not rerun
# the whole DAG.
rule prepare_data:
    input:
        raw=[ancient(str(p)) for p in data_inputs(CFG)],
    output:
        splits=[P("split_tokens", split=s) for s in SPLITS],
        wordcounts=P("wordcounts"),
    params:
        cfg=cfg_json("data"),
        io=io(),
    log:
        log_of("prepare_data"),
    benchmark:
        bench_of("prepare_data")
    conda:
        ENV
    shell:
        knnlm("spine.prepare_data")


rule bpe:
    input:
        splits=[P("split_tokens", split=s) for s in SPLITS],
    output:
        model=P("bpe_model"),
        vocab=P("bpe_vocab"),
        bpe=[P("bpe_split", split=s) for s in SPLITS],
        stats=P("bpe_stats"),
    params:
        cfg=cfg_json("bpe"),
        io=io(),
    threads: THREADS
    log:
        log_of("bpe"),
    benchmark:
        bench_of("bpe")
    conda:
        ENV
    shell:
        knnlm("spine.bpe")


rule preprocess:
    input:
        bpe=[P("bpe_split", split=s) for s in SPLITS],
    output:
        data_bin=directory(P("data_bin")),
    params:
        cfg=cfg_json(),
        io=io(),
    threads: THREADS
    log:
        log_of("preprocess"),
    benchmark:
        bench_of("preprocess")
    conda:
        ENV
    shell:
        knnlm("spine.preprocess")


rule token_lines:
    input:
        bpe=P("bpe_split"),
    output:
        out=P("token_lines"),
    wildcard_constraints:
        lm=lm_constraint(FAIRSEQ_LMS),  # a Hugging Face LM's dump_queries_hf writes its own
    params:
        cfg=cfg_json(),
        io=io(),
    log:
        log_of("token_lines", "lm", "split"),
    benchmark:
        bench_of("token_lines", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("spine.token_lines")


rule documents:
    input:
        text=P("split_tokens"),
        token_lines=P("token_lines"),
    output:
        out=P("documents"),
    params:
        cfg=cfg_json("stats"),
        io=io(),
    log:
        log_of("documents", "lm", "split"),
    benchmark:
        bench_of("documents", "lm", "split")
    conda:
        ENV
    shell:
        knnlm("spine.documents")
