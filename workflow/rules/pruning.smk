# A smaller datastore (He et al. 2021, Sec. 4.2, Table 3; knnlm.experiments.pruning): every datastore entry's own
# FAISS neighbours in the full store's index (one search of every key, pruning.neighbours each at pruning.nprobe),
# greedy merging to each pruned share of pruning.ratios against an equal-size random subset and the full datastore
# (table, figure and comparisons 'pruning'), scored from the full store's cached search of Table 3's pair.
PRUNING = dict(store="full", **GAINS_KEY)


knnlm_rule(
    "datastore_neighbours",
    "pruning.neighbours",
    input=files(
        **datastore("{key}"),
        index=artifact("index"),
        index_meta=artifact("index_meta"),
    ),
    output=files(
        ids=artifact("dstore_nb_ids"),
        dists=artifact("dstore_nb_dists"),
        meta=artifact("dstore_nb_meta"),
    ),
    cfg=cfg_json("index", "pruning"),
    threads=THREADS,
)


knnlm_rule(
    "write_pruning",
    "pruning.table",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        lm_logprobs=per_split("lm_logprobs"),
        targets=per_split("targets"),
        documents=per_split("documents"),
        # valid is scored on the tuning sample when the run has one (as every store scored on every token)
        tuning_sample=lambda wc: (
            artifact("tuning_sample", lm=wc.lm, split="valid") if RETRIEVAL["tuning_documents"] else []
        ),
        score=artifact("score", **PRUNING),
        dstore_nb_ids=artifact("dstore_nb_ids", **PRUNING),
        dstore_nb_meta=artifact("dstore_nb_meta", **PRUNING),
        **{n: per_split(n, **PRUNING) for n in ("nb_ids", "nb_dists", "nb_meta")},
    ),
    output=files(
        csv=artifact("table", table="pruning", ext="csv"),
        md=in_report(
            artifact("table", table="pruning", ext="md"), caption=report_caption("pruning"), category="Beyond the paper"
        ),
        cmp_csv=artifact("table", table="pruning_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="pruning", ext="png"),
            caption=report_caption("pruning"),
            category="Beyond the paper",
        ),
        pdf=artifact("figure", figure="pruning", ext="pdf"),
    ),
    cfg=cfg_json("knn", "temperature", "pruning", "stats", "profile"),
    threads=THREADS,
)


TARGETS["pruning"] = tables("pruning")
