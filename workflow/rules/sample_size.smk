# How large a sample a measurement on part of a split needs (docs/statistics.md, "How large a sample"): the
# intervals of Table 3's comparisons on proportional block samples of the every-token store against every token.
# Not part of 'all': a measurement made once on a run whose 'full-alltokens' store scores every test token
# (retrieval.table3_fraction: 1), whose result sets the share the configs' samples take.
if FULL_EVERY_TOKEN:
    SAMPLE_SIZE = dict(store=FULL_EVERY_TOKEN, **TABLE3_KEY)

    knnlm_rule(
        "write_sample_size",
        "sample_size.table",
        input=files(
            unpack(settings_inputs(**SAMPLE_SIZE)),
            settings=artifact("settings", **SAMPLE_SIZE),  # its τ grid as extended there
        ),
        output=files(
            csv=artifact("table", table="sample_size", ext="csv"),
            md=artifact("table", table="sample_size", ext="md"),
        ),
        cfg=cfg_json("knn", "retrieval", "temperature", "stats", "profile"),
        io=io(fixed=SAMPLE_SIZE),
        threads=THREADS,
    )

    rule sample_size:
        input:
            tables("sample_size"),
