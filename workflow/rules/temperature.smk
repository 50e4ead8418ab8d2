# Temperature (Xu et al. 2023, Sec. 5, Figure 5): the τ × λ sweep from a store's cached neighbours (no new
# search), for the stores of config 'temperature.ratios' and the (key, metric) pairs of 'datastore_size'.
TAU_STORES = [store_name(r) for r in CFG["temperature"]["ratios"]]


rule tau_sweep:
    input:
        **SETTINGS_INPUTS,
    output:
        out=P("tau_sweep"),
    params:
        cfg=cfg_json("knn", "retrieval", "temperature", "stats"),
        io=io(),
    threads: THREADS
    log:
        log_of("tau_sweep", "lm", "store", "key", "metric"),
    benchmark:
        bench_of("tau_sweep", "lm", "store", "key", "metric")
    conda:
        ENV
    shell:
        knnlm("temperature.tau_sweep")


rule write_temperature:
    input:
        sweeps=expand(P("tau_sweep"), store=TAU_STORES, key=DS["key_types"], metric=DS["metrics"], allow_missing=True),
    output:
        csv=P("table", table="temperature", ext="csv"),
        md=report(P("table", table="temperature", ext="md"), caption=report_caption("temperature"),
                  category="Temperature"),
        fig5=[report(P("figure", figure=f"fig5_temperature_{s}", ext=e), caption=report_caption("fig5"),
                     category="Temperature") for s in TAU_STORES for e in ("png", "pdf")],
    params:
        cfg=cfg_json("knn", "retrieval", "temperature", "profile"),
        io=io(),
    log:
        log_of("write_temperature", "lm"),
    benchmark:
        bench_of("write_temperature", "lm")
    conda:
        ENV
    shell:
        knnlm("temperature.figures")


TARGETS["temperature"] = tables("temperature")
