"""Every job reads only the config sections its rule passes (params.cfg): a job that reads a section its rule left
out would fail with a KeyError only when it runs, after its upstream jobs. Checked here before anything runs: each
job of a forced dry run of the tiny DAG, its command's --cfg sections, against the sections its function reads
(job.cfg["..."], and what the functions it hands `job` or `job.cfg` to read, found in the source)."""
import ast
import json
import re
import shlex
import subprocess
from functools import lru_cache

import pytest

from conftest import PROJECT_ROOT, SNAKEMAKE
from test_layers import imported_module

PACKAGE = PROJECT_ROOT / "src" / "knnlm"
ALWAYS = {"name", "results_dir", "threads"}  # every rule's cfg has them (quoted_cfg)


@lru_cache(maxsize=None)
def module_tree(module: str) -> tuple[ast.Module, dict[str, str]]:
    """(AST, {imported name: 'module:function'}) of knnlm module 'a.b' (relative to knnlm)."""
    path = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        path = PACKAGE.joinpath(*module.split("."), "__init__.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = "knnlm." + (module.rpartition(".")[0] if path.name != "__init__.py" else module)
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            mod = imported_module(node, package.rstrip("."))[len("knnlm."):]
            for a in node.names:
                names[a.asname or a.name] = f"{mod}:{a.name}"
    return tree, names


def function(module: str, name: str) -> ast.FunctionDef | None:
    tree, _ = module_tree(module)
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _subscript_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


@lru_cache(maxsize=None)
def sections_read(module: str, name: str, role: str, param: str) -> frozenset[str]:
    """The config sections that function `name` of `module` reads with a KeyError when absent (x["section"], not
    .get) from its parameter `param`, a Job (role 'job': param.cfg) or a config dict (role 'cfg'), following the
    calls that pass it on to functions of the package."""
    fn = function(module, name)
    if fn is None:
        return frozenset()
    _, imported = module_tree(module)
    cfg_names = {param} if role == "cfg" else set()
    for node in ast.walk(fn):  # aliases: cfg = job.cfg
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if role == "job" and isinstance(v, ast.Attribute) and v.attr == "cfg" and \
                    isinstance(v.value, ast.Name) and v.value.id == param:
                cfg_names.add(node.targets[0].id)

    def is_cfg(e: ast.AST) -> bool:
        return (isinstance(e, ast.Name) and e.id in cfg_names) or (
            role == "job" and isinstance(e, ast.Attribute) and e.attr == "cfg" and isinstance(e.value, ast.Name)
            and e.value.id == param)

    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript) and is_cfg(node.value) and _subscript_key(node):
            out.add(_subscript_key(node))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            target = imported.get(node.func.id, f"{module}:{node.func.id}")
            mod, _, fname = target.partition(":")
            callee = function(mod, fname) if (PACKAGE.joinpath(*mod.split(".")).with_suffix(".py").is_file()
                                              or PACKAGE.joinpath(*mod.split(".")).is_dir()) else None
            if callee is None:
                continue
            params = [a.arg for a in callee.args.args]
            for i, arg in enumerate(node.args):
                if i >= len(params):
                    break
                if role == "job" and isinstance(arg, ast.Name) and arg.id == param:
                    out |= sections_read(mod, fname, "job", params[i])
                elif is_cfg(arg):
                    out |= sections_read(mod, fname, "cfg", params[i])
    return frozenset(out)


def planned_jobs(tmp_path) -> list[tuple[str, str, set[str]]]:
    """(rule, job, cfg sections) of every job of a forced dry run of the tiny config with the tests' LMs."""
    from conftest import headingless_data, tiny_lms

    configs = [str(headingless_data(tmp_path)), str(tiny_lms(tmp_path))]
    r = subprocess.run(SNAKEMAKE + ["-n", "-F", "-p", "-s", "workflow/Snakefile", "--configfile", "configs/tiny.yaml",
                                    *configs, "--config", f"results_dir={tmp_path}"], cwd=PROJECT_ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", r.stdout):
        m = re.match(r"(?:local)?rule (\w+):", block)
        cmd = re.search(r"-m knnlm (\S+) .*", block)
        if not (m and cmd):
            continue
        argv = shlex.split(cmd.group(0))
        jobs.append((m.group(1), argv[2], set(json.loads(argv[argv.index("--cfg") + 1]))))
    return jobs


@pytest.mark.dag  # a dry run of the DAG
def test_every_job_reads_only_the_config_sections_its_rule_passes(tmp_path):
    jobs = planned_jobs(tmp_path)
    assert len({j for _, j, _ in jobs}) > 30, "the dry run's commands were not found"
    missing = []
    for rule, job, given in sorted(set((r, j, frozenset(g)) for r, j, g in jobs)):
        module, _, name = job.partition(".")
        assert function(f"experiments.{module}", name), f"rule {rule}: job {job} has no function"
        read = sections_read(f"experiments.{module}", name, "job", "job")
        if read - given - ALWAYS:
            missing.append(f"rule {rule} (job {job}) reads config {sorted(read - given - ALWAYS)}, its rule passes "
                           f"{sorted(given - ALWAYS)}")
    assert not missing, "\n".join(missing)


def test_the_check_sees_reads_through_helpers():
    """The analysis follows job and job.cfg into helpers: table1.score reads 'knn' itself, and stats_options(job)
    reads 'stats' for the jobs that call it."""
    assert "knn" in sections_read("experiments.table1", "score", "job", "job")
    assert "stats" in sections_read("experiments.common", "stats_options", "job", "job")
    assert "stats" in sections_read("experiments.table1", "table1", "job", "job")
