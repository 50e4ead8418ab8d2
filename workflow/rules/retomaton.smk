# Fewer searches (Alon et al. 2022, RetoMaton, Sec. 5.1, Figure 3; knnlm.experiments.retomaton): pointers from each
# retrieved entry to its successor, a search only when fewer than a threshold of them survive (each threshold of
# retomaton.min_pointers, and a search at every token), against the kNN-LM of the same cache and random
# skipping at the same fraction of saved searches (table, figure and comparisons 'retomaton'). On the store, keys and
# metric of Table 3's claims, FAISS neighbours with real scores: reads the search and real-score caches, no new search.
RETOMATON = dict(store=FULL_ALL_TOKENS or "full", **TABLE3_KEY)
RETOMATON_READS = (
    "manifest",
    "vals",
    "queries_manifest",
    "targets",
    "lm_logprobs",
    "scope",
    "tuning_sample",
    "table3_sample",
    "nb_ids",
    "nb_meta",
    "real_dists",
    "documents",
)


knnlm_rule(
    "write_retomaton",
    "retomaton.table",
    input=files(
        unpack(lambda wc: {n: p for n, p in settings_inputs(**RETOMATON)(wc).items() if n in RETOMATON_READS}),
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        key_file=artifact("keys", key=RETOMATON["key"]),
        queries=per_split("queries", key=RETOMATON["key"]),
        real_meta=per_split("real_meta", **RETOMATON),
    ),
    output=files(
        csv=artifact("table", table="retomaton", ext="csv"),
        md=in_report(
            artifact("table", table="retomaton", ext="md"),
            caption=report_caption("retomaton"),
            category="Beyond the paper",
        ),
        cmp_csv=artifact("table", table="retomaton_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="retomaton", ext="png"),
            caption=report_caption("retomaton"),
            category="Beyond the paper",
        ),
        pdf=artifact("figure", figure="retomaton", ext="pdf"),
    ),
    cfg=cfg_json("knn", "temperature", "retomaton", "retrieval", "stats", "profile"),
    io=io(fixed=RETOMATON),
    threads=THREADS,
)


TARGETS["retomaton"] = tables("retomaton")
