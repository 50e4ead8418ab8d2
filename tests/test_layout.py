"""The artifact layout has one owner (knnlm.paths), stores are prepared and opened by kind (knnlm.datastore.stores),
jobs find their files by name (knnlm.cli)."""
import re
from pathlib import Path

import numpy as np
import pytest

from knnlm.job import Job
from knnlm.cli import resolve
from knnlm.config import PROJECT_ROOT, ConfigError, validate_config
from knnlm.io import ArtifactError
from knnlm.paths import PATTERNS, WILDCARDS, Layout
from knnlm.datastore.stores import open_store, prepare_store, store_kind_of, store_wildcard


def test_layout_patterns_and_paths(tmp_path):
    L = Layout(tmp_path, "run")
    assert L.pattern("keys", key="att") == str(tmp_path / "run" / "lms" / "{lm}" / "datastore" / "keys_att.npy")
    assert L.path("nb_ids", lm="base", store="r0.05", key="ffn", metric="l2", split="test") == \
        tmp_path / "run" / "lms/base/stores/r0.05/neighbours/ffn_l2_test_ids.npy"
    with pytest.raises(ValueError, match=r"needs wildcard\(s\) \['split'\]"):
        L.path("nb_ids", lm="base", store="full", key="ffn", metric="l2")
    with pytest.raises(KeyError, match="unknown artifact 'nope'"):
        L.path("nope")


def test_no_path_pattern_outside_the_layout():
    """File names of the layout appear in no other source file: paths are written once (knnlm.paths)."""
    files, dirs = [], []
    for pat in PATTERNS.values():
        base = Path(pat).name
        literal = re.sub(r"\{[^}]*\}", "", base)
        if "." in base and len(literal) >= 5:  # a file: its name with every wildcard open, e.g. keys_\S+\.npy
            files.append(re.compile("(?:^|/)" + "".join(
                f"(?:{WILDCARDS[part[1:-1]]}|\\{{[^}}]*\\}})" if part[1:-1] in WILDCARDS else r"[^/\s]+" if part.startswith("{")
                else re.escape(part) for part in re.split(r"(\{[^}]*\})", base) if part) + r"(?=$|\s)"))
        elif "{" not in base:  # a fixed directory name, e.g. data-bin, as a path component
            dirs.append(base)
    sources = [p for d in ("src", "workflow", "benchmarks") for p in (PROJECT_ROOT / d).rglob("*")
               if p.suffix in (".py", ".smk") or p.name == "Snakefile"]
    hits = []
    for p in sources:
        if p.name == "paths.py":
            continue
        for lit in re.findall(r"[\"']([^\"'\n]*)[\"']", p.read_text()):
            if lit.startswith(("wiki.", "expected a directory with wiki.", " (a WikiText zip)")):
                continue  # the raw corpus's own file names (config.RAW_SPLIT_NAME), an input, not an artifact
            if any(f.search(lit) for f in files) or any(f"/{d}" in lit or f"{d}/" in lit for d in dirs):
                hits.append(f"{p.relative_to(PROJECT_ROOT)}: {lit!r}")
    assert not hits, hits


def _datastore(n=3000, d=24, seed=0):
    rng = np.random.default_rng(seed)
    # anisotropic keys: a few directions carry most of the variance
    keys = (rng.normal(size=(n, d)) * np.linspace(3, 0.1, d)).astype(np.float16)
    return keys, {"N": n, "D": d, "checkpoint_sha256": "c" * 64}


CFG = {"datastore_size": {"seed": 1}, "index": {"seed": 1}}


def test_subsets_are_nested():
    from knnlm.datastore.stores import subsample_rows

    small, large = subsample_rows(10_000, 0.05, 7), subsample_rows(10_000, 0.25, 7)
    assert len(small) == 500 and len(large) == 2500 and np.isin(small, large).all()
    assert not np.array_equal(subsample_rows(10_000, 0.05, 8), small)


def test_subset_store(tmp_path):
    keys, man = _datastore()
    meta = prepare_store("r0.1", "att", keys, man, CFG, tmp_path / "s")
    st = open_store(tmp_path / "s", keys, man)
    assert meta["size"] == 300 == st.size and st.rows is not None and np.all(np.diff(st.rows) > 0)
    assert st.keys is keys and st.transform is None
    with pytest.raises(ArtifactError, match="another datastore"):
        open_store(tmp_path / "s", keys, {**man, "N": 10})


def test_pca_store_projects_keys_and_queries(tmp_path):
    from knnlm.search.exact import exact_topk

    keys, man = _datastore()
    meta = prepare_store("pca6", "att", keys, man, CFG, tmp_path / "p")
    st = open_store(tmp_path / "p", keys, man)
    assert meta["dim"] == 6 == st.keys.shape[1] and st.rows is None and 0.5 < meta["explained_variance"] < 1
    # the store's keys are the keys under the same projection as the queries
    x = np.asarray(keys, np.float32)
    np.testing.assert_allclose(np.asarray(st.keys, np.float32), st.project(x), atol=2e-2, rtol=1e-2)
    # the projection is the top-6 principal subspace: it keeps most of the variance, and is orthonormal
    y = st.project(x)
    assert y.var(0).sum() / x.var(0).sum() == pytest.approx(meta["explained_variance"], rel=1e-2)
    # exact search in the reduced space = brute force on the projected keys
    q = np.random.default_rng(1).normal(size=(7, 24)).astype(np.float32)
    ids, d = exact_topk(st.keys, st.project(q), 5, "l2", 512, 4, 8)
    ref = ((st.project(q)[:, None, :] - np.asarray(st.keys, np.float32)[None]) ** 2).sum(-1)
    np.testing.assert_allclose(d, np.sort(ref, 1)[:, :5], rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match=r"PCA dimension must be in \[1, 23\]"):
        prepare_store("pca24", "att", keys, man, CFG, tmp_path / "bad")


def test_unknown_store_kind_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="known kinds"):
        store_kind_of("half")
    assert re.fullmatch(store_wildcard(), "r0.05") and re.fullmatch(store_wildcard(), "pca128")
    assert not re.fullmatch(store_wildcard(), "half")
    assert re.fullmatch(store_wildcard(), "full-np4-alltokens") and re.fullmatch(store_wildcard(), "r0.05-draw2-ivf3-np1")
    assert not re.fullmatch(store_wildcard(), "full-alltokens-np4")
    d = tmp_path / "data"
    d.mkdir()
    for s in ("train", "valid", "test"):
        (d / f"wiki.{s}.tokens").write_text(" = A = \n")
    with pytest.raises(ConfigError, match="'stores.extra'.*'half'"):
        validate_config({"name": "t", "data": {"dir": str(d)}, "stores": {"extra": ["half"]}}, "my.yaml")


def test_job_names_its_files_and_jobs_resolve():
    j = Job(cfg={}, input={"a": "x", "l": ["p", "q"]}, output={"o": "y"}, rule="r")
    assert j.path("a") == Path("x") and j.paths("l") == [Path("p"), Path("q")] and j.paths("o") == [Path("y")]
    with pytest.raises(KeyError, match="rule r: no input or output named 'b'"):
        j.path("b")
    with pytest.raises(KeyError, match="list of 2 files"):
        j.path("l")
    assert resolve("table1.score").__name__ == "score"
    with pytest.raises(ValueError, match="module one of"):
        resolve("nomodule.x")
    with pytest.raises(ValueError, match="no function 'nope'"):
        resolve("retrieval.nope")


def test_recall_at_k_against_bruteforce():
    from knnlm.experiments.retrieval import recall_at_k

    rng = np.random.default_rng(0)
    exact = np.stack([rng.permutation(50)[:8] for _ in range(20)])
    approx = exact.copy()
    approx[:, :3] = rng.integers(50, 60, size=(20, 3))  # 3 of 8 wrong in every row
    approx[0, 3] = -1  # one missing neighbour
    ref = np.mean([len(set(a[a >= 0]) & set(e)) / 8 for a, e in zip(approx, exact)])
    assert recall_at_k(approx, exact) == pytest.approx(ref) and recall_at_k(exact, exact) == 1.0


def test_approximation_strength_is_held_constant_across_sizes():
    """Index defaults: the paper's 1 byte per 16 dims and probed fraction 32/4096 at every datastore size."""
    from knnlm.search.index import resolve_index_params

    cfg = {"ncentroids": "auto", "code_size": "auto", "train_size": "auto", "nprobe": "auto",
           "probe_fraction": 32 / 4096, "add_chunk": 65536, "seed": 1}
    full, small = resolve_index_params(cfg, 2_642_889, 256), resolve_index_params(cfg, 132_144, 256)
    assert full["code_size"] == small["code_size"] == 16 and full["bytes_per_dim"] == 1 / 16
    assert full["ncentroids"] == 2048 and full["nprobe"] == 16 and small["ncentroids"] == 512 and small["nprobe"] == 4
    assert full["probed_fraction"] == small["probed_fraction"] == 32 / 4096
    paper = resolve_index_params({**cfg, "ncentroids": 4096, "nprobe": 32}, 153_000_000, 1024)
    assert paper["code_size"] == 64 and paper["nprobe"] == 32


def test_a_stale_index_is_refused_not_searched():
    """An index built under other defaults (here 32 B codes, the old D/8) must not be searched silently when the
    config now resolves to D/16: the search names the index and says how to rebuild it."""
    from knnlm.search.index import check_index_matches, resolve_index_params
    from knnlm.io import ArtifactError

    cfg = {"ncentroids": "auto", "code_size": "auto", "train_size": "auto", "nprobe": "auto",
           "probe_fraction": 32 / 4096, "add_chunk": 65536, "seed": 1, "dims_per_code_byte": 16}
    params = resolve_index_params(cfg, 2_642_889, 256)
    check_index_matches({"ncentroids": 2048, "code_size": 16, "seed": 1}, params, "att_l2.faiss")
    with pytest.raises(ArtifactError, match=r"att_l2.faiss is stale \(code_size: built with 32, config resolves to 16\)"):
        check_index_matches({"ncentroids": 2048, "code_size": 32, "seed": 1}, params, "att_l2.faiss")
    assert resolve_index_params({**cfg, "dims_per_code_byte": 8}, 2_642_889, 256)["code_size"] == 32


def test_find_lists_the_files_of_an_artifact_with_their_wildcards(tmp_path):
    L = Layout(tmp_path, "run")
    made = [L.path("exact_meta", lm="base", store="r0.05", key="att", metric="l2", split="test"),
            L.path("exact_meta", lm="gpt2-tiny", store="full", key="ffn", metric="ip", split="valid")]
    for p in made:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    (made[0].parent / "att_l2_test_ids.npy").write_text("")  # another artifact beside them
    (made[0].parent / "att_cosine_test.json").write_text("")  # not a metric
    got = L.find("exact_meta")
    assert [p for _, p in got] == sorted(made)
    assert {tuple(sorted(w.items())) for w, _ in got} == {
        (("key", "att"), ("lm", "base"), ("metric", "l2"), ("split", "test"), ("store", "r0.05")),
        (("key", "ffn"), ("lm", "gpt2-tiny"), ("metric", "ip"), ("split", "valid"), ("store", "full"))}
    assert [w for w, _ in L.find("exact_meta", lm="base")] == [{"store": "r0.05", "key": "att", "metric": "l2",
                                                                "split": "test"}]
