# The findings report: each claim of the paper this run tests, the paper's numbers, ours with its 95 % CI
# and a verdict computed from the CI (knnlm.experiments.findings). The settings of the smallest store of
# 'temperature.ratios' (att/L2 when swept; scored on every token when 'retrieval.small_store_all_tokens') test the
# paper's 5 %-datastore claims (Sec. 5, Figures 4 and 5a); on the retrieval scope, against the full store's, that a
# larger datastore is better (Sec. 4, Figure 2).
_SMALL_KEY = dict(
    key="att" if "att" in DATASTORE_SIZE["key_types"] else DATASTORE_SIZE["key_types"][0],
    metric="l2" if "l2" in DATASTORE_SIZE["metrics"] else DATASTORE_SIZE["metrics"][0],
)
SMALL_SETTINGS = (
    {}
    if SMALL_STORE == "full"
    else {
        "small_store": artifact("settings", store=SMALL_ALL_TOKENS or SMALL_STORE, **_SMALL_KEY),
        "size_store": artifact(
            "settings", store=SMALL_STORE, **_SMALL_KEY
        ),  # against the full store's: Figure 2's claim
        "full_store": artifact("settings", store="full", **_SMALL_KEY),
    }
)
# the largest subset of 'datastore_size.ratios' (the paper's 90 %) against the full store: no diminishing returns
_LARGE = store_name(max([r for r in DATASTORE_SIZE["ratios"] if r < 1] or [1]))
if SMALL_SETTINGS and _LARGE not in ("full", SMALL_STORE):
    SMALL_SETTINGS["large_store"] = artifact("settings", store=_LARGE, **_SMALL_KEY)
# every store of 'datastore_size.ratios' and the full one: Sec. 4.2's "decreases almost linearly" (3 stores or more)
_CURVE = [store_name(r) for r in sorted(set(DATASTORE_SIZE["ratios"]) | {1.0})]
if SMALL_SETTINGS and len(_CURVE) >= 3:
    SMALL_SETTINGS["size_curve"] = [artifact("settings", store=s, **_SMALL_KEY) for s in _CURVE]
# He et al. 2021's PCA-reduced keys (half the dimensions in the paper), cited in Sec. 5.2 as another approximation:
# the first PCA store of 'stores.extra' against the full one, same (key, metric) and scope
PCA_SETTINGS = (
    {}
    if len(PCA_STORES) < 2
    else {
        "pca_store": artifact("settings", store=PCA_STORES[1], **_SMALL_KEY),
        "pca_full": artifact("settings", store="full", **_SMALL_KEY),
    }
)

knnlm_rule(
    "write_findings",
    "findings.findings",
    input=files(
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        # its headroom: the best valid perplexity of the LMs trained on from it without dropout (App. E.6.1's)
        headroom=[artifact("lm_training", lm=n) for n in OVERFIT] if BACKEND[PRIMARY].trained else [],
        documents=per_split("documents"),  # the resampling unit each row names
        table1=artifact("table", table="table1_comparisons", ext="csv"),
        # the regime table: the base LM's perplexity (Table 1) and its vocabulary (the rows per vocabulary entry)
        table1_table=artifact("table", table="table1", ext="csv"),
        vocabulary=artifact("data_bin") if BACKEND[PRIMARY].run_tokens else artifact("model_card", lm=PRIMARY),
        # Table 3's claims on every token when 'retrieval.table3_all_tokens' (table3_all), else on the scope
        table3=artifact(
            "table", table="table3_all_comparisons" if FULL_ALL_TOKENS else "table3_comparisons", ext="csv"
        ),
        table3_table=artifact("table", table="table3_all" if FULL_ALL_TOKENS else "table3", ext="csv"),
        # the settings of Table 3's pair (per-document NLL): the gain of tuning τ compared between settings
        table3_settings=artifact("settings", store=FULL_ALL_TOKENS or "full", **TABLE3_KEY),
        parametric=artifact("table", table="parametric_comparisons", ext="csv") if PLAIN_W_SM else [],
        # App. A: each base LM's kNN-LM and their gains compared (when config 'table4' names more than the primary LM)
        table4=artifact("run_table", table="table4_comparisons", ext="csv") if len(BASE_LMS) > 1 else [],
        which_words=artifact("table", table="which_words_comparisons", ext="csv"),  # App. D
        hypotheses=artifact("table", table="hypotheses_comparisons", ext="csv") if PLAIN_W_SM else [],  # App. E.1-E.4
        # App. E.6.3 (when 'hypotheses.interpolated_loss' names key types W_ds is trained for)
        interpolated_loss=(
            artifact("table", table="interpolated_loss_comparisons", ext="csv") if ILOSS and PLAIN_W_SM else []
        ),
        ensembling=artifact("table", table="ensembling_comparisons", ext="csv") if ENSEMBLE else [],  # App. E.5
        overfitting=artifact("table", table="overfitting_comparisons", ext="csv") if OVERFIT else [],  # App. E.6.1
        soft_labels=artifact("table", table="soft_labels_comparisons", ext="csv") if SOFT_LABEL else [],  # App. E.6.2
        # beyond the paper: Drozdov et al. 2022's claims (per-token gains, λ by retrieval quality), He et al. 2021's
        token_gains=artifact("table", table="token_gains_comparisons", ext="csv") if PLAIN_W_SM else [],
        lambda_by_quality=artifact("table", table="lambda_by_quality_comparisons", ext="csv") if PLAIN_W_SM else [],
        adaptive_retrieval=(
            artifact("table", table="adaptive_retrieval_comparisons", ext="csv") if PLAIN_W_SM else []
        ),  # He et al. 2021
        k_sweep=artifact("table", table="k_sweep_comparisons", ext="csv"),  # Khandelwal et al. 2020, Figure 4
        leakage=artifact("table", table="leakage_comparisons", ext="csv"),  # Borgeaud et al. 2022, Figure 6
        ngram=artifact("table", table="ngram_comparisons", ext="csv"),  # Khandelwal et al. 2020, Figure 7
        # the costliest follow-ups: only when 'extras.in_all' (else their rows say 'not run')
        retomaton=(
            artifact("table", table="retomaton_comparisons", ext="csv") if EXTRAS_IN_ALL else []
        ),  # Alon et al. 2022, Figure 3
        pruning=(
            artifact("table", table="pruning_comparisons", ext="csv") if EXTRAS_IN_ALL else []
        ),  # He et al. 2021, Table 3
        generation=(
            artifact("table", table="generation_comparisons", ext="csv") if EXTRAS_IN_ALL else []
        ),  # Wang et al. 2023
        **SMALL_SETTINGS,
        **PCA_SETTINGS,
    ),
    output=files(
        out=in_report(artifact("findings"), caption=report_caption("findings"), category="Findings"),
        rows=artifact("findings_rows"),  # the same rows with their claims' ids (the regime map joins on them)
        # the verdicts of the rows by part of the paper, at a glance (the README's figure, through docs/results.md)
        figure=in_report(
            artifact("figure", figure="findings_summary", ext="png"),
            caption=report_caption("default"),
            category="Findings",
        ),
    ),
    cfg=quoted_cfg(
        "stats",
        "extras",
        adaptive_softmax=not PLAIN_W_SM,
        knn={"k": CFG["knn"]["k"]},
        headroom_init_from={n: CFG["lms"][n].get("init_from") for n in OVERFIT},
    ),
)


TARGETS["findings"] = expand(artifact("findings"), lm=PRIMARY) + expand(
    artifact("figure", figure="findings_summary", ext="png"), lm=PRIMARY
)
