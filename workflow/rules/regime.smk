# The regime map (knnlm.experiments.regime): each effect of claims.yaml 'regime_effects' at several points of three
# axes (the base LMs of 'regime.lms', the store subsets of 'regime.ratios', the probe counts of 'regime.nprobe') and its
# trend toward the paper's regime. Every point is a store's settings JSON (rule settings) for the map's (key, metric)
# and each of 'regime.variants'; target 'regime', outside 'all' (its own budget: config 'budget.regime').
import importlib.resources

import yaml

RG = CFG["regime"]
REGIME_VARIANTS = [(RG["key_type"], RG["metric"])] + [tuple(v) for v in RG["variants"]]
REGIME_STORES = [store_name(r) for r in sorted(RG["ratios"])]
REGIME_SCAN = [probe_store("full", n) for n in sorted(RG["nprobe"])] + ["full"]


# the map's own (key, metric) with all three mask/score settings; each variant with FAISS mask + FAISS score alone
# (the settings_faiss job; the effects comparing keys or metrics need no exact search)
REGIME_POINTS = {
    "lm": [
        settings_point(n, "full", k, m, (k, m) == REGIME_VARIANTS[0]) for n in RG["lms"] for k, m in REGIME_VARIANTS
    ],
    "store": [
        settings_point(PRIMARY, s, k, m, (k, m) == REGIME_VARIANTS[0])
        for s in REGIME_STORES
        for k, m in REGIME_VARIANTS
    ],
    "scan": [
        settings_point(PRIMARY, s, k, m, (k, m) == REGIME_VARIANTS[0]) for s in REGIME_SCAN for k, m in REGIME_VARIANTS
    ],
}
# the effects' ids, read from the claims table without importing the experiment (the DAG stays light to build)
REGIME_EFFECTS = [
    e["id"]
    for e in yaml.safe_load(
        (importlib.resources.files("knnlm.experiments") / "claims.yaml").read_text(encoding="utf-8")
    )["regime_effects"]
]


knnlm_rule(
    "write_regime",
    "regime.regime_map",
    input=files(
        lm_training=lm_training(PRIMARY),  # the primary LM's convergence, in the captions
        vocabulary=artifact("data_bin"),  # the dictionary: rows per vocabulary entry
        **{f"{axis}_points": pts for axis, pts in REGIME_POINTS.items()},
    ),
    output=files(
        **{
            f"{axis}_{x}": (
                in_report(
                    artifact("table", lm=PRIMARY, table=f"regime_{axis}", ext=x),
                    caption=report_caption("default"),
                    category="Regime map",
                )
                if x == "md"
                else artifact("table", lm=PRIMARY, table=f"regime_{axis}", ext=x)
            )
            for axis in ("lm", "store", "scan", "trends")
            for x in ("csv", "md")
        },
        trends_json=artifact("table", lm=PRIMARY, table="regime_trends", ext="json"),
        **regime_figures(REGIME_EFFECTS),
    ),
    cfg=quoted_cfg("knn", "stats", "profile", regime={**RG, "stores": REGIME_STORES, "scan_stores": REGIME_SCAN}),
    wildcards=(),
)


knnlm_rule(
    "write_findings_regime",
    "regime.findings_trends",
    input=files(
        findings_rows=artifact("findings_rows", lm=PRIMARY),  # the findings rows with their claims' ids
        trends=artifact("table", lm=PRIMARY, table="regime_trends", ext="json"),
    ),
    output=files(
        csv=artifact("findings_regime", lm=PRIMARY, ext="csv"),
        md=in_report(
            artifact("findings_regime", lm=PRIMARY, ext="md"), caption=report_caption("default"), category="Regime map"
        ),
    ),
    cfg=quoted_cfg(),
    wildcards=(),
)


rule regime:
    input:
        artifact("table", lm=PRIMARY, table="regime_trends", ext="md"),
        artifact("findings_regime", lm=PRIMARY, ext="md"),
        *[f for fs in regime_figures(REGIME_EFFECTS, "png").values() for f in fs],
