"""The workflow as its ecosystem checks it: formatted by snakefmt (pyproject [tool.snakefmt]) and clean under
`snakemake --lint` with the tiny and the main config; both gates fail the suite as they would fail a CI step."""
import subprocess

import pytest

from conftest import PROJECT_ROOT, SNAKEMAKE

BIN = PROJECT_ROOT / ".venv" / "bin"


def test_the_workflow_is_formatted_by_snakefmt():
    snakefmt = BIN / "snakefmt"
    if not snakefmt.exists():
        pytest.fail(f"{snakefmt} is missing: scripts/setup.sh installs it (requirements.txt)")
    r = subprocess.run([str(snakefmt), "--check", "--diff", "workflow"], cwd=PROJECT_ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"snakefmt would change the workflow (run `.venv/bin/snakefmt workflow`):\n" \
                              f"{(r.stdout + r.stderr)[-4000:]}"
    from test_docs import readme_ablation

    rule = readme_ablation()["workflow/rules/my_ablation.smk"]  # the README's rule, as a researcher copies it
    r = subprocess.run([str(snakefmt), "--check", "--diff", "-"], input=rule, cwd=PROJECT_ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"the README's rule is not formatted as snakefmt formats it:\n{r.stdout + r.stderr}"


@pytest.mark.parametrize("config", ["configs/tiny.yaml", "configs/wikitext2.yaml"])
def test_snakemake_lint_finds_nothing(config, tmp_path):
    r = subprocess.run(SNAKEMAKE + ["--lint", "--configfile", config, "--config", f"results_dir={tmp_path}"],
                       cwd=PROJECT_ROOT, capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "your workflow is in a good condition" in out, out[-4000:]
