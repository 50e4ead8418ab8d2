# Parametric alternatives to the datastore (Xu et al. 2023, Sec. 4, App. C): trained on the dumped keys with the
# LM frozen; one job per (variant, key type) of config section 'parametric' (knnlm.experiments.parametric).
PAR_TABLES = parametric_tables(CFG)
VARIANTS = parametric_variants(CFG)
# The kNN-LM at equal rows (App. B-C): the paper's reference (att/IP when the run has them) on the store of exactly the
# rows the alternatives train on (TRAINING_SUBSET), when they train on a subset ('parametric.train_tokens')
SUBSET_KNN = (
    dict(store=TRAINING_SUBSET, key="att" if "att" in KEYS else KEYS[0], metric="ip" if "ip" in METRICS else METRICS[0])
    if CFG["parametric"]["train_tokens"] is not None
    else {}
)


knnlm_rule(
    "word_stats",
    "parametric.word_stats",
    input=files(
        unpack(output_layer),
        **datastore("ffn"),
    ),
    output=files(
        out=artifact("word_stats"),
        row_logprobs=artifact("train_lm_logprobs"),  # log p_LM(val) of every datastore row (App. E.6.3's loss)
    ),
    cfg=cfg_json("parametric"),
    threads=THREADS,
)


knnlm_rule(
    "train_parametric",
    "parametric.train_parametric",
    input=files(
        unpack(output_layer),
        **datastore("{key}"),
        **queries(key="{key}"),
        wordcounts=artifact("wordcounts"),
        word_stats=lambda wc: artifact("word_stats", lm=wc.lm) if wc.variant.startswith("adaptive") else [],
        # the interpolated loss (App. E.6.3) needs p_LM of every training row, computed once by word_stats
        row_logprobs=lambda wc: artifact("train_lm_logprobs", lm=wc.lm) if wc.variant.startswith("iloss") else [],
    ),
    output=files(
        result=artifact("parametric_result"),
        logprobs=per_split("parametric_logprobs"),
    ),
    cfg=cfg_json("parametric", "knn"),
    io=io(work_dir=artifact("parametric_dir")),
    threads=THREADS,
    resources=dict(
        mem_mb=8000,
    ),
)


knnlm_rule(
    "write_parametric",
    "parametric.tables",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        results=[artifact("parametric_result", variant=v, key=k) for v, k in VARIANTS],
        scores=expand(artifact("score", store="full"), key=KEYS, metric=METRICS, allow_missing=True),
        lm_logprobs=per_split("lm_logprobs"),
        wordcounts=artifact("wordcounts"),
        knn_logprobs=[
            artifact("knn_logprobs", store="full", key=k, metric=m, split=s)
            for k in KEYS
            for m in METRICS
            for s in EVAL_SPLITS
        ],
        knn_tuned=[
            artifact("knn_logprobs_tuned", store="full", key=k, metric=m, split=s)
            for k in KEYS
            for m in METRICS
            for s in EVAL_SPLITS
        ],
        par_logprobs=[
            artifact("parametric_logprobs", variant=v, key=k, split=s) for v, k in VARIANTS for s in EVAL_SPLITS
        ],
        documents=per_split("documents"),
        **(
            dict(
                subset_score=artifact("score", **SUBSET_KNN),
                subset_knn=per_split("knn_logprobs", **SUBSET_KNN),
                subset_tuned=per_split("knn_logprobs_tuned", **SUBSET_KNN),
            )
            if SUBSET_KNN
            else {}
        ),
    ),
    output=files(
        cmp_csv=artifact("table", table="parametric_comparisons", ext="csv"),
        cmp_md=in_report(
            artifact("table", table="parametric_comparisons", ext="md"),
            caption=report_caption("parametric"),
            category="Parametric",
        ),
        csv=[artifact("table", table=t, ext="csv") for t in PAR_TABLES],
        md=[
            in_report(artifact("table", table=t, ext="md"), caption=report_caption("parametric"), category="Parametric")
            for t in PAR_TABLES
        ],
        fig3=[
            in_report(
                artifact("figure", figure="fig3_nv", ext=e), caption=report_caption("fig3"), category="Parametric"
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("parametric", "knn", "stats", "profile"),
)


TARGETS["parametric"] = tables(*PAR_TABLES) if PLAIN_W_SM else []  # they read W_sm
