"""The package's layers: no import circle between modules, and no module imports one of a higher layer.

The layers, lowest first (a module may import its own layer's modules and lower ones):
  files       io, paths                                  reading and writing artifacts, the layout's one owner
  datastore   knnlm.datastore                            keys, vals and queries on disk; the store kinds
  run         config, job, data, tracking, slurm         the validated config, one job, the corpus, MLflow, SLURM
  statistics  knnlm.statistics                           documents, intervals, verdicts, coverage
  search      knnlm.search                               IVFPQ, exact search, selection kernels, the scope
  scoring     knnlm.scoring                              Eq. 5, τ and λ, the settings, per-token quality
  lm          knnlm.lm                                   the backends (fairseq, Hugging Face) and their training
  parametric  parametric                                 W_ds and the parametric alternatives (Sec. 4)
  report      knnlm.report                               tables, figures, the front page, a run's times
  jobs        knnlm.experiments, api, generate, bundle, score, harness, importer, adopt, cli   what Snakemake runs and a
              researcher calls
Every import counts, inside functions too (they are read from the source, not from a running interpreter).
"""
import ast
import os
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "knnlm"
LAYERS = [
    ("files", {"io", "paths"}),
    ("datastore", {"datastore"}),
    ("run", {"config", "job", "data", "tracking", "slurm"}),
    ("statistics", {"statistics"}),
    ("search", {"search"}),
    ("scoring", {"scoring"}),
    ("lm", {"lm"}),
    ("parametric", {"parametric"}),
    ("report", {"report"}),
    ("jobs", {"experiments", "api", "generate", "bundle", "score", "harness", "importer", "adopt", "cli", "__main__", ""}),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """Whether 'knnlm.a.b' is a module or package of the source tree (not a name inside one)."""
    path = PACKAGE.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def imported_module(node: ast.ImportFrom, package: str) -> str | None:
    """The absolute knnlm module a `from ... import` names (relative ones resolved from `package`), None for another
    package's."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module if node.module and node.module.split(".")[0] == "knnlm" else None


def imports(path: Path) -> set[str]:
    """The knnlm modules `path` imports (absolute names; 'from . import x' resolved to the module x where it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "knnlm"}
        elif isinstance(node, ast.ImportFrom):
            mod = imported_module(node, package)
            if mod is None:
                continue
            subs = {f"{mod}.{a.name}" for a in node.names if _is_module(f"{mod}.{a.name}")}
            out |= subs or {mod}
    out.discard(name)
    return out


def layer_of(module: str) -> int:
    """The index in LAYERS of a module 'knnlm.<top>[...]'; AssertionError for a module no layer names."""
    top = module.split(".")[1] if "." in module else ""
    for i, (_, tops) in enumerate(LAYERS):
        if top in tops:
            return i
    raise AssertionError(f"{module}: no layer of tests/test_layers.py names {top!r}; add it to LAYERS")


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    for m in GRAPH:
        layer_of(m)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
                 for m, deps in GRAPH.items() for d in deps if layer_of(d) > layer_of(m))
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_circle():
    """No cycle among modules (a package's __init__ counts as a module): found by depth-first search."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(GRAPH.get(m, ())):
            if d not in GRAPH:
                continue
            if state.get(d) == "open":
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_the_checks_fail_on_a_bad_graph(monkeypatch):
    """The two checks themselves: a circle and an upward import are both found and named."""
    monkeypatch.setitem(GRAPH, "knnlm.io", GRAPH["knnlm.io"] | {"knnlm.report.tables"})
    with pytest.raises(AssertionError, match=r"knnlm.io \(files\) imports knnlm.report.tables \(report\)"):
        test_no_import_from_a_lower_layer_to_a_higher_one()
    monkeypatch.setitem(GRAPH, "knnlm.paths", GRAPH["knnlm.paths"] | {"knnlm.io"})
    monkeypatch.setitem(GRAPH, "knnlm.io", GRAPH["knnlm.io"] | {"knnlm.paths"})
    with pytest.raises(pytest.fail.Exception, match="import circle: knnlm.io -> knnlm.paths -> knnlm.io"):
        test_no_import_circle()


def _defined(module: str) -> set[str]:
    """Names a module of the package ('knnlm', 'knnlm.a.b') defines at its top level (or the submodules of a
    package)."""
    path = PACKAGE.parent / module.replace(".", "/")
    names = {p.stem for p in path.iterdir() if p.suffix == ".py" or p.is_dir()} if path.is_dir() else set()
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Try):  # try: from x import Y / except ImportError: Y = object
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_every_import_of_the_package_names_something_that_exists():
    """Every `from knnlm... import name` (relative ones too, inside functions too) in the package, the tests and the
    benchmarks names a module that exists and a name it defines: a moved function leaves no import behind that fails
    only when its job runs."""
    root = PACKAGE.parent
    files = [*PACKAGE.rglob("*.py"), *(root.parent / "tests").glob("*.py"), *(root.parent / "benchmarks").glob("*.py")]
    bad = []
    for path in files:
        in_package = PACKAGE in path.parents
        name = module_name(path) if in_package else ""
        package = (name if path.name == "__init__.py" else name.rpartition(".")[0]) if in_package else ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or (node.level and not in_package):
                continue
            mod = imported_module(node, package)
            if mod is None:
                continue
            if not _is_module(mod):
                bad.append(f"{path.relative_to(root.parent)}:{node.lineno}: no module {mod}")
                continue
            missing = [a.name for a in node.names if a.name != "*" and a.name not in _defined(mod)]
            if missing:
                bad.append(f"{path.relative_to(root.parent)}:{node.lineno}: {mod} has no {', '.join(missing)}")
    assert not bad, "\n".join(bad)


def test_jobs_that_read_caches_start_without_torch_scipy_stats_or_mlflow(tmp_path):
    """A job's start is part of its time, and most jobs of the DAG read caches and compute in numpy: they must not pay
    for torch (~2 s), scipy.stats (~1 s) or MLflow (~7 s) at import. Here the modules of the FAISS search, the real
    score, the findings and the intervals are imported, the real score and an interval computed, and a run spooled
    with a live curve point as under Snakemake; none of the three may have been imported."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "sys.path.insert(0, 'src')\n"
            "import knnlm.experiments.retrieval, knnlm.experiments.findings, knnlm.datastore.dump\n"
            "from knnlm.search.real_score import recompute_distances\n"
            "from knnlm.statistics.intervals import estimate\n"
            "from knnlm import cli\n"
            "keys = np.ones((5, 4), np.float16)\n"
            "assert recompute_distances(keys, np.zeros((2, 4), np.float32), np.zeros((2, 3), np.int64), 'l2').shape == (2, 3)\n"
            "nll = np.random.default_rng(0).uniform(1, 2, (2, 30))\n"
            "estimate(lambda p: p, nll, np.ones(30), {'documents': 2})\n"
            f"job = cli.Job(cfg={{'name': 't', 'results_dir': {str(tmp_path)!r}}}, rule='m.train')\n"
            "cli.resolve = lambda name: (lambda j: (j.curve(1, {'valid_nll': 1.0}), {'metrics': {'a': 1.0}})[1])\n"
            "cli.run_job('m.train', job)\n"
            "print(sorted(m for m in ('torch', 'scipy.stats', 'mlflow') if m in sys.modules))\n")
    env = {**os.environ, "KNNLM_MLFLOW_SPOOL": str(tmp_path / "spool"), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parents[1], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
    assert len(list((tmp_path / "spool").glob("*.json"))) == 2  # the point and the run


def test_the_api_imports_without_the_hugging_face_extra():
    """The Hugging Face stack is the optional extra 'hf' (pyproject): with transformers, tokenizers, safetensors and
    huggingface_hub unimportable, the API, the fairseq LM and the job entry point import, and asking for a Hugging
    Face LM says which extra to install instead of a bare ImportError."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "sys.path.insert(0, 'src')\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('transformers', 'tokenizers', 'safetensors', 'huggingface_hub'):\n"
            "            raise ImportError(f'blocked: {name}')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from knnlm import KNNLM\n"
            "import knnlm.api, knnlm.lm.fairseq, knnlm.lm.hf, knnlm.cli\n"
            "try:\n"
            "    knnlm.lm.hf.load_hf('gpt2')\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parents[1], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'pip install ".[hf]"' in r.stdout and "blocked: transformers" in r.stdout, r.stdout
    import tomllib

    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.split(">")[0] in ("transformers", "tokenizers", "safetensors",
                                                                          "huggingface-hub")]
    assert {d.split(">")[0] for d in project["optional-dependencies"]["hf"]} == {
        "transformers", "tokenizers", "safetensors", "huggingface-hub"}
