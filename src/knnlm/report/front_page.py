"""The front page of `snakemake --report` (workflow/report/workflow.rst): the findings summary of a run, as
reStructuredText. Read while the Snakefile is parsed, so it imports nothing heavy."""
from __future__ import annotations

import re

from ..paths import Layout


def _findings_rows(md: str) -> tuple[str, list[dict]]:
    """The 'Summary:' sentence and the claim rows (dicts by column) of a findings report (Markdown)."""
    summary = next((line for line in md.splitlines() if line.startswith("Summary:")), "")
    tables, block = [], []
    for line in md.splitlines() + [""]:  # the report's tables (the regime table first): the one with verdicts
        if line.startswith("|"):
            block.append(line)
        elif block:
            tables.append(block)
            block = []
    for lines in tables:
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if "verdict" in header and len(lines) >= 3:
            return summary, [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    return summary, []


def front_page(cfg: dict, layout: Layout, lm: str) -> str:
    """The findings part of the report's front page (workflow/report/workflow.rst), as reStructuredText: the
    findings report's summary and, per claim the paper makes, its verdict and the units it rests on; or a line
    saying the findings report is not written yet."""
    findings = layout.path("findings", lm=lm)
    if not findings.exists():
        return (f"The findings report (``{findings}``) is not written yet: run ``snakemake findings`` (or ``all``) "
                "with this config, then ``--report`` again.")
    summary, rows = _findings_rows(findings.read_text())

    def esc(text: str) -> str:  # reStructuredText inline markup characters in claims (τ*, a_b) as plain text
        return re.sub(r"([*`_|\\])", r"\\\1", text)

    out = [f"From ``{findings}`` (the whole report, with every interval, is under *Findings* below). {esc(summary)}", ""]
    for r in rows:
        if r.get("test", "").startswith("the paper"):
            units = r.get("units", r.get("documents", "-"))
            out.append(f"- {esc(r['section'])}, {esc(r['claim'])} ({esc(r['comparison (a vs b)'])}): "
                       f"**{esc(r['verdict'])}**" + (f", {esc(units)}" if units not in ("-", "") else ""))
    return "\n".join(out)
