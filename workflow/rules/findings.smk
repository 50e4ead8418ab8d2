# The findings report (issue 9): each claim of the paper this run tests, the paper's numbers, ours with its 95 % CI
# and a verdict computed from the CI (knnlm.experiments.findings).

rule write_findings:
    input:
        table1=P("table", table="table1_comparisons", ext="csv"),
        table3=P("table", table="table3_comparisons", ext="csv"),
    output:
        out=report(P("findings"), caption=report_caption("findings"), category="Findings"),
    params:
        cfg=cfg_json(),
        io=io(),
    log:
        log_of("write_findings", "lm"),
    benchmark:
        bench_of("write_findings", "lm")
    conda:
        ENV
    shell:
        knnlm("findings.findings")


TARGETS["findings"] = expand(P("findings"), lm=LMS)
