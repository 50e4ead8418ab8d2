# Generation (Wang et al. 2023, arXiv 2305.14625; knnlm.experiments.generation): prefixes of test articles continued by
# the kNN-LM of Table 1 (Table 3's pair, FAISS mask and score at its τ* and λ), by the base LM alone and by the
# articles' own tokens (teacher forcing), batched; per step the entropies of p_kNN and p_LM, their slopes on the step
# (table, figure and comparisons 'generation'). Runs the LM and the FAISS index; no cache is read.
GENERATION = dict(store="full", **GAINS_KEY)


def generation_lm(wc):
    """The base LM's weights, and for an LM of the run's BPE tokens its dictionary and BPE model."""
    b = BACKEND[wc.lm]
    out = {b.weights_input: lm_weights(wc.lm)}
    if b.run_tokens:
        out["data_bin"] = artifact("data_bin")
        if CFG["bpe"]["type"] != "none":
            out["bpe_model"] = artifact("bpe_model")
    return out


knnlm_rule(
    "write_generation",
    "generation.table",
    input=files(
        unpack(generation_lm),
        lm_training=lm_training(),  # the base LM's convergence, in the caption
        **datastore(),
        targets=artifact("targets", split="test"),
        documents=per_split("documents"),
        score=artifact("score", **GENERATION),
        index=artifact("index", **GENERATION),
        nb_meta=artifact("nb_meta", split="test", **GENERATION),
    ),
    output=files(
        csv=artifact("table", table="generation", ext="csv"),
        md=in_report(
            artifact("table", table="generation", ext="md"),
            caption=report_caption("generation"),
            category="Beyond the paper",
        ),
        cmp_csv=artifact("table", table="generation_comparisons", ext="csv"),
        png=in_report(
            artifact("figure", figure="generation", ext="png"),
            caption=report_caption("generation"),
            category="Beyond the paper",
        ),
        pdf=artifact("figure", figure="generation", ext="pdf"),
    ),
    cfg=cfg_json("knn", "generation", "stats", "profile", "lms", "lm", "bpe"),
    threads=THREADS,
)


TARGETS["generation"] = tables("generation")
