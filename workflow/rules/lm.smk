# Base LM: fairseq-train of a pre-norm transformer_lm (plain softmax); best checkpoint on valid.
# Resumable: fairseq restarts from {R}/lm/fairseq/checkpoint_last.pt after a kill.

rule train_lm:
    input:
        f"{R}/data-bin",
    output:
        f"{R}/lm/checkpoint.pt",
    params:
        cfg=cfg_json("lm"),
    threads: THREADS
    resources:
        mem_mb=8000,
    log:
        f"{R}/logs/train_lm.log",
    benchmark:
        f"{R}/benchmarks/train_lm.tsv"
    shell:
        knnlm("train-lm", "train_lm")
        + " --data-bin {input} --work-dir {R}/lm/fairseq --out {output} --log {log}.fairseq > {log} 2>&1"
