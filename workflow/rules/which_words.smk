# Which words gain from approximate neighbours (Xu et al. 2023, App. D, Figures 6 and 7; beyond the paper, the
# kNN-LM's gains by the target's training frequency): on the store, keys and metric of Table 3's claims.
WHICH_WORDS = dict(store=FULL_ALL_TOKENS or "full", **TABLE3_KEY)


knnlm_rule(
    "write_which_words",
    "which_words.which_words",
    input=files(
        unpack(lambda wc: {**settings_inputs(**WHICH_WORDS)(wc), **token_source(wc)}),
        lm_training=lm_training(),  # the base LM's convergence, in the caption
    ),
    output=files(
        csv=artifact("table", table="which_words", ext="csv"),
        md=in_report(
            artifact("table", table="which_words", ext="md"), caption=report_caption("which_words"), category="App. D"
        ),
        freq_csv=artifact("table", table="which_words_frequency", ext="csv"),
        freq_md=in_report(
            artifact("table", table="which_words_frequency", ext="md"),
            caption=report_caption("which_words"),
            category="App. D",
        ),
        cmp_csv=artifact("table", table="which_words_comparisons", ext="csv"),
        points=artifact("table", table="which_words_points", ext="json"),
        fig6=[
            in_report(
                artifact("figure", figure="fig6_word_length", ext=e),
                caption=report_caption("which_words"),
                category="App. D",
            )
            for e in ("png", "pdf")
        ],
        fig7=[
            in_report(
                artifact("figure", figure="fig7_bigram_entropy", ext=e),
                caption=report_caption("which_words"),
                category="App. D",
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_with_keys("hypotheses", ("min_occurrences", "frequency_buckets"), "knn", "retrieval", "stats", "profile"),
    io=io(fixed=WHICH_WORDS),
    threads=THREADS,
)


TARGETS["which_words"] = tables("which_words")
