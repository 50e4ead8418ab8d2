"""What a newcomer reads is run: every `snakemake` command of the README, the docs, the config headers and the
Snakefile's header is dry-run (targets before --configfile, real targets, real configs and profiles), and the
workflow passes `snakemake --lint`."""
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import PROJECT_ROOT, SNAKEMAKE

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "docs").glob("*.md")),
             *sorted(str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "configs").glob("*.yaml")),
             "workflow/Snakefile", "profiles/local/config.yaml", "profiles/slurm/config.yaml"]
COMMAND = re.compile(r"(?:\.venv/bin/)?snakemake((?: +[-\w./<>=]+)+)")


def snakemake_commands(text: str) -> list[str]:
    """The argument strings of the snakemake commands of a document: inside `code` spans, fenced blocks and
    comment lines ('#   snakemake ...'), up to the end of the span or line, or a parenthesised remark."""
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    spans += [m.group(1) for m in re.finditer(r"^#\s+(.*)$", text, flags=re.M)]
    out = []
    for span in spans:
        for line in span.splitlines():
            for m in COMMAND.finditer(line.split("(")[0]):
                out.append(m.group(1).strip())
    return out


def commands() -> dict[str, list[str]]:
    """{normalised argument string: documents that give it}; --report commands, bare `snakemake <target>` mentions
    without a --configfile and the README's example ablation are left out (the report needs a finished run; a bare
    target names no config; the example's target exists once its files are added)."""
    found: dict[str, list[str]] = {}
    for doc in DOCUMENTS:
        for args in snakemake_commands((PROJECT_ROOT / doc).read_text(encoding="utf-8")):
            if "--report" in args or "--configfile" not in args or "my_ablation" in args:
                continue  # the README's example target is run by test_readme_ablation_example_runs
            args = re.sub(r"configs/<[a-z]+>\.yaml", "configs/tiny.yaml", args)
            found.setdefault(args, []).append(doc)
    return found


COMMANDS = commands()


def test_documents_name_snakemake_commands():
    """The extraction finds the README's main command and the config headers' cluster commands (else the dry runs
    below would pass by finding nothing)."""
    assert "--profile profiles/local --configfile configs/wikitext2.yaml" in COMMANDS
    assert any("configs/wikitext103_knnlm.yaml" in c for c in COMMANDS)
    assert snakemake_commands("#   snakemake --configfile configs/x.yaml table1") == ["--configfile configs/x.yaml table1"]


def test_a_target_after_configfile_is_refused(tmp_path):
    """--configfile takes several files: a target after it is read as a config file, and the dry run fails. The
    dry runs below catch a document that writes a command so."""
    r = subprocess.run(SNAKEMAKE + ["-n", "--configfile", "configs/tiny.yaml", "table1", "--config",
                                    f"results_dir={tmp_path}"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert r.returncode != 0


@pytest.mark.dag  # runs Snakemake (dry runs)
@pytest.mark.parametrize("args", sorted(COMMANDS))
def test_documented_command_dry_runs(args, tmp_path):
    argv = shlex.split(args)
    if "--profile" not in argv:
        argv = ["-s", "workflow/Snakefile"] + argv
    r = subprocess.run(SNAKEMAKE + argv + ["-n", "--config", f"results_dir={tmp_path}"], cwd=PROJECT_ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"{COMMANDS[args]}: snakemake {args}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"


def readme_ablation() -> dict[str, str]:
    """{path: text} of the README's 'Adding an ablation' example: its rule file, module and test."""
    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# (\S+?):?[ \n][^\n]*\n?.*?)```", text, flags=re.S)
    return {path: body for body, path in blocks if "my_ablation" in path}


@pytest.mark.dag  # runs the README's new rule on the tiny DAG's outputs
def test_readme_ablation_example_runs(tiny_run, tmp_path):
    """The README's ablation (a rule file and a module) runs as written, in a copy of the workflow, on a copy of the
    tiny run's full-store settings, and writes the table its test reads; rule and module stay short."""
    import shutil

    import pandas as pd

    files = readme_ablation()
    assert sorted(files) == ["src/knnlm/experiments/my_ablation.py", "tests/test_my_ablation.py",
                             "workflow/rules/my_ablation.smk"]
    assert sum(len(files[p].splitlines()) for p in files if not p.startswith("tests/")) <= 35
    repo = tmp_path / "repo"
    for d in ("workflow", "src", "configs", "profiles"):
        shutil.copytree(PROJECT_ROOT / d, repo / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(PROJECT_ROOT / "environment.yml", repo)
    for path, body in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(body)
    results = tmp_path / "results"
    settings = Path("tiny/lms/base/stores/full/settings")
    shutil.copytree(tiny_run["results_dir"] / settings, results / settings)
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run(SNAKEMAKE + ["my_ablation", "-s", "workflow/Snakefile", "--cores", "1", "--allowed-rules",
                                    "write_my_ablation", "--configfile", *tiny_run["configfiles"][:1],
                                    *[str(Path(c).resolve()) for c in tiny_run["configfiles"][1:]],
                                    "--config", f"results_dir={results}"],
                       cwd=repo, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    df = pd.read_csv(results / "tiny/lms/base/tables/my_ablation.csv")
    assert len(df) == 3 and set(df["setting"]) == {"faiss_mask_faiss_score", "faiss_mask_real_score",
                                                   "real_mask_real_score"}
    assert (results / "tiny/logs/write_my_ablation_base.log").is_file()


def dangling_references(text: str) -> list[str]:
    """The `knnlm.<module>[.<name>]` references of a text that name no module of src/knnlm, or a name its module does
    not define (test_layers' view of the package: its modules and their top-level names)."""
    from test_layers import _defined, _is_module

    bad = []
    for ref in sorted(set(re.findall(r"\bknnlm(?:\.\w+)+", text))):
        parts = ref.split(".")
        i = len(parts)
        while i > 1 and not _is_module(".".join(parts[:i])):
            i -= 1
        if i < len(parts) and parts[i] not in _defined(".".join(parts[:i])):
            bad.append(ref)
    return bad


def test_every_knnlm_reference_resolves():
    """Every `knnlm.x.y` the docs, the rules, the configs and the code's own docstrings name exists (a module, or a
    name defined in it): a moved function leaves no stale pointer."""
    files = [*DOCUMENTS, *[str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "workflow").rglob("*.smk")],
             *[str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "src").rglob("*.py")],
             *[str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "workflow" / "report").glob("*.rst")],
             "workflow/schemas/config.schema.yaml"]
    bad = {f: refs for f in files if (refs := dangling_references((PROJECT_ROOT / f).read_text(encoding="utf-8")))}
    assert not bad, bad
    assert dangling_references("knnlm.statistics.intervals.no_such_function, knnlm.nomodule") == [
        "knnlm.nomodule", "knnlm.statistics.intervals.no_such_function"]


@pytest.mark.parametrize("script", sorted(p.name for p in (PROJECT_ROOT / "benchmarks").glob("bench_*.py")) +
                         ["rehearsal.py"])
def test_benchmark_script_starts(script):
    """Each benchmark script the docs name imports what it uses (a moved function fails here, not when a user runs
    it): `--help` exits 0."""
    import sys

    r = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=PROJECT_ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def _results_rows() -> list[dict]:
    from knnlm.report.front_page import _findings_rows

    return _findings_rows((PROJECT_ROOT / "docs" / "results.md").read_text(encoding="utf-8"))[1]


def test_the_readme_first_screen_shows_the_answer_in_40_lines():
    """The README's first screen (up to its first heading after the main job) is at most 40 lines: what it answers,
    the quick trial, the headline verdicts and their figure, then the main job; its numbers are the generated ones:
    each verdict count and the row count of docs/results.md's findings table, the main job's measured job time from
    its budget table, and the figure, a file beside it."""
    from collections import Counter

    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    details = lines.index("## Details")
    first = "\n".join(lines[:details])
    assert details <= 40, f"the first screen is {details} lines"
    assert first.index("configs/quick.yaml") < first.index("## What it finds") < first.index("configs/wikitext2.yaml")
    rows = _results_rows()
    counts = Counter(r["verdict"].split(" (")[0] for r in rows)
    said = dict((k, int(n)) for n, k in re.findall(r"(\d+) (reproduced|contradicted|inconclusive|reported|not tested|"
                                                     r"not run)", " ".join(first.split())))
    assert said == dict(counts), (said, counts)
    assert f"Of the main job's {len(rows)} findings rows" in " ".join(first.split())
    budget = (PROJECT_ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    measured = re.search(r"^\| all +\| +\d+ \| +([\d.]+) \|", budget, flags=re.M).group(1)
    assert "measured on amd (min)" in budget  # the CPU kind the README names
    assert f"{measured} min of job time on 2 cores of an AMD EPYC" in " ".join(first.split())
    figure = re.search(r"!\[[^]]*\]\(([^)]+)\)", first).group(1)
    assert (PROJECT_ROOT / figure).is_file() and figure == "docs/findings_summary.png"


def test_the_verdict_legend_names_every_verdict_the_engine_gives():
    """docs/verdicts.md, the legend every findings report links instead of pasting, has an entry for each verdict
    kind the summary figure stacks (a row of another kind fails the figure), and every verdict of docs/results.md's
    findings table is of one of those kinds."""
    from knnlm.experiments.findings import LEGEND
    from knnlm.report.figures import VERDICT_KINDS

    legend = (PROJECT_ROOT / "docs" / "verdicts.md").read_text(encoding="utf-8")
    for kind in VERDICT_KINDS:
        assert re.search(rf"^\| \*\*{kind}[ *(]", legend, flags=re.M), kind
    assert {r["verdict"].split(" (")[0] for r in _results_rows()} <= set(VERDICT_KINDS)
    assert "docs/verdicts.md" in LEGEND


def test_the_main_config_states_the_numbers_its_code_derives():
    """The numbers configs/wikitext2.yaml's comments give for its index and search follow from the code at the main
    job's datastore size (docs/results.md's regime table, generated): the PQ code's bytes at the LM's D, the lists
    and probe counts of the full store and of the 5 % subset (knnlm.search.index.resolve_index_params), and Table 3's
    block sample in docs/reference.md is the config's 'retrieval.table3_fraction'."""
    import yaml

    from knnlm.config import section_defaults
    from knnlm.search.index import resolve_index_params

    text = (PROJECT_ROOT / "configs" / "wikitext2.yaml").read_text(encoding="utf-8")
    cfg = yaml.safe_load(text)
    d, k = cfg["lm"]["decoder_embed_dim"], cfg["knn"]["k"]
    n = int(re.search(r"\(([\d,]+) rows over [\d,]+ entries\)", (PROJECT_ROOT / "docs" / "results.md").read_text())
            .group(1).replace(",", ""))
    index = {**section_defaults("index"), **cfg["index"]}
    full, small = resolve_index_params(index, n, d, k), resolve_index_params(index, int(0.05 * n), d, k)
    comment = " ".join(line.lstrip("# ").strip() for line in text.splitlines() if line.lstrip().startswith("#"))
    code = re.search(r"PQ codes of D/16 bytes \((\d+) B at D = (\d+)\)", comment)
    assert (int(code.group(1)), int(code.group(2))) == (full["code_size"], d)
    lists = re.search(r"\((\d+) lists for the [\d.]+M keys: nprobe (\d+); the 5 % subset: (\d+) of (\d+)\)", comment)
    assert tuple(map(int, lists.groups())) == (full["ncentroids"], full["nprobe"], small["nprobe"], small["ncentroids"])
    assert f"its probe count ({small['nprobe']} of {small['ncentroids']})" in comment
    assert f"2,048 (its index.nprobe)" in comment and full["ncentroids"] == 2048
    reference = " ".join((PROJECT_ROOT / "docs" / "reference.md").read_text(encoding="utf-8").split())
    share = f"{cfg['retrieval']['table3_fraction']:.0%}".replace("%", " %")
    assert f"Table 3's pair is scored on a block sample of test and of valid's tuning sample, {share} of their tokens" \
        in reference


def test_the_cpu_tile_the_reference_states_is_the_codes():
    """docs/reference.md's CPU score tile (queries × a range of keys set by the L2 cache) is knnlm.search.exact's, and
    the tile follows the cache: 4,096 keys at 2 MiB of L2, 1,024 at 512 KiB."""
    from knnlm.search import exact

    lo, hi = exact.TILE_KEYS_RANGE
    reference = " ".join((PROJECT_ROOT / "docs" / "reference.md").read_text(encoding="utf-8").split())
    assert f"tiles of {exact.TILE_QUERIES} queries × {lo:,} to {hi:,} keys" in reference
    assert lo <= exact.TILE_KEYS <= hi
    for l2, keys in ((2 << 20, 4096), (512 << 10, 1024)):
        assert exact.tile_keys(l2) == keys
        assert f"{keys:,} with" in reference


def test_every_key_of_the_config_schema_is_described():
    """README: 'workflow/schemas/config.schema.yaml documents every key': each key at every depth (sections, their
    keys, an LM entry's keys) has a description, which a bad value's error quotes."""
    import yaml

    schema = yaml.safe_load((PROJECT_ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    missing, seen = [], 0

    def walk(node, path):
        nonlocal seen
        for key, sub in (node.get("properties") or {}).items():
            seen += 1
            if not (isinstance(sub, dict) and str(sub.get("description", "")).strip()):
                missing.append(".".join(path + [key]))
            if isinstance(sub, dict):
                walk(sub, path + [key])
                for part, name in (("additionalProperties", "<name>"), ("items", "[]")):
                    if isinstance(sub.get(part), dict):
                        walk(sub[part], path + [key, name])

    walk(schema, [])
    assert seen > 200 and not missing, f"{len(missing)} of {seen} keys undescribed: {missing}"
    assert "`workflow/schemas/config.schema.yaml` documents every key" in (PROJECT_ROOT / "README.md").read_text()


def test_a_target_the_readme_lists_exists_or_its_row_names_its_condition(tmp_path):
    """Every target of the README's table (a backticked name in its first column, or named in the row's text as a
    target) is a rule of the tiny, quick and main configs' DAGs; a target one of them lacks is listed with the config
    key it needs ('when config ...')."""
    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    rules = {}
    for config in ("configs/tiny.yaml", "configs/quick.yaml", "configs/wikitext2.yaml"):
        r = subprocess.run(SNAKEMAKE + ["--list-rules", "--configfile", config, "--config", f"results_dir={tmp_path}"],
                           cwd=PROJECT_ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        rules[config] = set(r.stdout.split())
    checked = 0
    for row in rows:
        first, rest = row.split(" | ", 1)
        for name in re.findall(r"`(\w+)`", first) + re.findall(r"`(variance|probe_sweep|followups)`", rest):
            lacking = [c for c, names in rules.items() if name not in names]
            checked += 1
            if lacking:
                assert re.search(rf"`{name}`[^|]*?when config", row) or re.search(
                    rf"the last three when config", row) and name in ("ensembling", "overfitting", "soft_labels"), \
                    f"target {name!r} is missing from {lacking} and its README row names no condition"
    assert checked >= 20


def test_prose_lines_of_the_docs_stay_readable():
    """The README's and the hand-written docs' prose (outside tables and code blocks) wraps at 120 characters, with a
    little room for a link: no line of 1,500 characters a reader must scroll."""
    for doc in ("README.md", "docs/reference.md", "docs/statistics.md", "docs/running.md", "docs/scale.md",
                "docs/verdicts.md"):
        fence = False
        for n, line in enumerate((PROJECT_ROOT / doc).read_text(encoding="utf-8").splitlines(), 1):
            fence ^= line.startswith("```")
            if not fence and not line.startswith(("|", "```")):
                assert len(line) <= 140, f"{doc}:{n}: {len(line)} characters"
