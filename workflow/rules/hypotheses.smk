# The hypotheses the paper rejects that need no training (Xu et al. 2023, Sec. 6, App. E.1-E.4): on Table 1's
# artifacts (the full store's FAISS neighbours of every valid and test token) and the LM's output matrix W_sm.
HYP_METRIC = TABLE3_KEY["metric"]

# App. E.6.3: W_ds trained on the interpolated loss, for the key types of 'hypotheses.interpolated_loss' that W_ds
# (nv1) is trained for (its comparisons go to the findings).
ILOSS = [(v, k) for v, k in interpolated_loss_variants(CFG) if ("nv1", k) in parametric_variants(CFG)]  # and W_ds
# App. E.5 (an extra): other LMs of 'lms' over this run's tokens, ensembled with the primary LM
ENSEMBLE = CFG["hypotheses"]["ensemble_lms"]
for _name in ENSEMBLE:
    if _name not in CFG["lms"] or _name == PRIMARY or not BACKEND[_name].run_tokens:
        raise ConfigError(
            f"config key 'hypotheses.ensemble_lms': expected names of config 'lms' other than the primary "
            f"LM {PRIMARY!r} whose source is 'train' or 'fairseq' (this run's tokens), found {_name!r}"
        )
# App. E.6.1 / E.6.2 (extras): LMs trained from the primary LM (config 'lms.<name>.init_from' / 'teacher', validated
# by knnlm.config), each alone and interpolated with it; they get no row of Table 4
OVERFIT = CFG["hypotheses"]["overfit_lms"]
SOFT_LABEL = CFG["hypotheses"]["soft_label_lms"]


def with_base_inputs(names):
    """Named inputs of an App. E table of other LMs over the primary LM's tokens (E.5, E.6): every trained LM's
    training.json, the base LM's and each of `names`' per-split log-probs and targets ('lm_<name>', 'targets_<name>'),
    the kNN component of Table 1 (full store, Table 3's pair) at its τ* tuned on valid, like the LMs' weights ('knn',
    and 'score' naming τ*), and the documents."""
    return dict(
        lm_training=[artifact("lm_training", lm=n) for n in [PRIMARY] + names if BACKEND[n].trained],
        lm_logprobs=per_split("lm_logprobs"),
        targets=per_split("targets"),
        **{f"lm_{n}": per_split("lm_logprobs", lm=n) for n in names},
        **{f"targets_{n}": per_split("targets", lm=n) for n in names},
        knn=per_split("knn_logprobs_tuned", store="full", **TABLE3_KEY),
        score=artifact("score", store="full", **TABLE3_KEY),
        documents=per_split("documents"),
    )


knnlm_rule(
    "write_hypotheses",
    "hypotheses.hypotheses",
    input=files(
        unpack(output_layer),  # W_sm
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        **queries(),
        **{f"queries_{k}": per_split("queries", key=k) for k in KEYS},
        **{f"nb_ids_{k}": per_split("nb_ids", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        **{f"nb_meta_{k}": per_split("nb_meta", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        **{f"knn_{k}": per_split("knn_logprobs", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        # the kNN-LM at its τ tuned on valid: E.1 and E.2's twins, tuned on the same valid tokens, are compared with it
        **{f"knn_tuned_{k}": per_split("knn_logprobs_tuned", store="full", key=k, metric=HYP_METRIC) for k in KEYS},
        scores=[artifact("score", store="full", key=k, metric=HYP_METRIC) for k in KEYS],
        documents=per_split("documents"),
    ),
    output=files(
        csv=artifact("table", table="hypotheses", ext="csv"),
        md=in_report(
            artifact("table", table="hypotheses", ext="md"), caption=report_caption("hypotheses"), category="App. E"
        ),
        cmp_csv=artifact("table", table="hypotheses_comparisons", ext="csv"),
    ),
    cfg=cfg_with_keys(
        "hypotheses", ("topk", "sparsify_temperatures", "max_lp_words"), "knn", "temperature", "stats", "profile"
    ),
    threads=THREADS,
)


TARGETS["hypotheses"] = tables("hypotheses") if PLAIN_W_SM else []  # E.1 and E.4 read W_sm


# E.6.3: W_ds trained on the interpolated loss (parametric variant 'iloss<100 λ>', rule train_parametric) against
# W_ds on the plain loss (nv1), for ILOSS (rules/common.smk).


knnlm_rule(
    "write_interpolated_loss",
    "hypotheses.interpolated_loss",
    input=files(
        lm_training=lm_training(),
        lm_logprobs=per_split("lm_logprobs"),
        documents=per_split("documents"),
        **{f"iloss_result_{k}": artifact("parametric_result", variant=v, key=k) for v, k in ILOSS},
        **{f"iloss_{k}": per_split("parametric_logprobs", variant=v, key=k) for v, k in ILOSS},
        **{
            f"w_ds_result_{k}": artifact("parametric_result", variant=interpolated_loss_reference(v), key=k)
            for v, k in ILOSS
        },
        **{
            f"w_ds_{k}": per_split("parametric_logprobs", variant=interpolated_loss_reference(v), key=k)
            for v, k in ILOSS
        },
    ),
    output=files(
        csv=artifact("table", table="interpolated_loss", ext="csv"),
        md=in_report(
            artifact("table", table="interpolated_loss", ext="md"),
            caption=report_caption("hypotheses"),
            category="App. E",
        ),
        cmp_csv=artifact("table", table="interpolated_loss_comparisons", ext="csv"),
    ),
    cfg=cfg_json("knn", "stats", "profile"),
)


if ILOSS:
    TARGETS["hypotheses"] = TARGETS["hypotheses"] + (tables("interpolated_loss") if PLAIN_W_SM else [])


# E.5 (an extra, like Table 4): the other LMs of 'hypotheses.ensemble_lms' ensembled with the primary LM, against the
# kNN component of Table 1 (full store, Table 3's key type and metric).
knnlm_rule(
    "write_ensembling",
    "hypotheses.ensembling",
    input=files(
        **with_base_inputs(ENSEMBLE),
    ),
    output=files(
        csv=artifact("table", table="table8", ext="csv"),
        md=in_report(
            artifact("table", table="table8", ext="md"), caption=report_caption("hypotheses"), category="App. E"
        ),
        cmp_csv=artifact("table", table="ensembling_comparisons", ext="csv"),
        fig8=[
            in_report(
                artifact("figure", figure="fig8_ensembling", ext=e),
                caption=report_caption("hypotheses"),
                category="App. E",
            )
            for e in ("png", "pdf")
        ],
    ),
    cfg=cfg_json("lms", "knn", "stats", "profile"),
    constraints=dict(
        lm=names_constraint([PRIMARY]),
    ),
)


if ENSEMBLE:
    TARGETS["ensembling"] = tables("table8")


# E.6.1 and E.6.2 (extras, like Table 4): LMs trained from the primary LM, each interpolated with it, against the kNN-LM
# of Table 1 (full store, Table 3's pair): 'hypotheses.overfit_lms' trained it further to overfit (Table 9);
# 'hypotheses.soft_label_lms' are fresh LMs on its soft labels, next to the one-hot LMs of 'hypotheses.ensemble_lms'.
knnlm_rule(
    "write_overfitting",
    "hypotheses.overfitting",
    input=files(
        **with_base_inputs(OVERFIT),
    ),
    output=files(
        csv=artifact("table", table="table9", ext="csv"),
        md=in_report(
            artifact("table", table="table9", ext="md"), caption=report_caption("hypotheses"), category="App. E"
        ),
        cmp_csv=artifact("table", table="overfitting_comparisons", ext="csv"),
    ),
    cfg=cfg_with_keys("hypotheses", ("overfit_lms",), "knn", "stats", "profile"),
    constraints=dict(
        lm=names_constraint([PRIMARY]),
    ),
)


knnlm_rule(
    "write_soft_labels",
    "hypotheses.soft_labels",
    input=files(
        **with_base_inputs(SOFT_LABEL + ENSEMBLE),
    ),
    output=files(
        csv=artifact("table", table="soft_labels", ext="csv"),
        md=in_report(
            artifact("table", table="soft_labels", ext="md"), caption=report_caption("hypotheses"), category="App. E"
        ),
        cmp_csv=artifact("table", table="soft_labels_comparisons", ext="csv"),
    ),
    cfg=cfg_with_keys("hypotheses", ("soft_label_lms",), "lms", "knn", "stats", "profile"),
    constraints=dict(
        lm=names_constraint([PRIMARY]),
    ),
)


if OVERFIT:
    TARGETS["overfitting"] = tables("table9")
if SOFT_LABEL:
    TARGETS["soft_labels"] = tables("soft_labels")
