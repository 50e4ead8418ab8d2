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


@pytest.mark.dag  # runs Snakemake (lint)
def test_snakemake_lint_is_clean(tmp_path):
    r = subprocess.run(SNAKEMAKE + ["--lint", "-s", "workflow/Snakefile", "--configfile", "configs/tiny.yaml",
                                    "--config", f"results_dir={tmp_path}"], cwd=PROJECT_ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "Congratulations" in r.stdout + r.stderr, r.stdout[-4000:] + r.stderr[-4000:]


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
