"""Bad input: config schema, data paths, truncated / mismatched artifacts, atomic writes."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import SNAKEMAKE, rss_mb
from knnlm.config import PROJECT_ROOT, ConfigError, check_data, load_config, validate_config
from knnlm.io import ArtifactError, atomic_path, check_manifest, create_npy, open_npy, save_npy, write_json


def base_cfg(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for s in ("train", "valid", "test"):
        (d / f"wiki.{s}.tokens").write_text(" = A = \n the cat sat \n")
    return {"name": "t", "data": {"dir": str(d)}}


def test_temperature_grid_and_store_names():
    from knnlm.config import temperatures
    from knnlm.datastore.stores import store_name, store_ratio

    cfg = {"temperature": {"start": 0.0, "stop": 3.0, "step": 0.1}}
    taus = temperatures(cfg)
    assert len(taus) == 31 and taus[0] == 0.0 and taus[10] == 1.0 and taus[-1] == 3.0
    assert store_name(1.0) == "full" and store_name(0.05) == "r0.05" and store_ratio("r0.05") == 0.05
    with pytest.raises(ValueError, match="full"):
        store_ratio("half")


def test_stores_sharing_keys_or_index():
    """An '-ivf<k>' store shares its base store's exact search, not its index; an '-alltokens' store shares its base
    store's index (same rows and seed), not its exact search (its scope differs)."""
    from knnlm.datastore.stores import same_index_store, same_keys_store

    assert same_index_store("r0.05-alltokens") == "r0.05" and same_keys_store("r0.05-alltokens") == "r0.05-alltokens"
    assert same_index_store("full-ivf2-alltokens") == "full-ivf2" and same_keys_store("full-ivf2-alltokens") == "full-alltokens"
    assert same_index_store("r0.2-draw2-ivf3") == "r0.2-draw2-ivf3" and same_keys_store("r0.2-draw2-ivf3") == "r0.2-draw2"
    assert same_index_store("full") == same_keys_store("full") == "full"
    # '-np<n>': the same index and exact search, searched with n lists (a point of the probe sweep)
    assert same_index_store("r0.05-np4") == "r0.05" and same_keys_store("r0.05-np4") == "r0.05"
    assert same_index_store("full-ivf2-np8-alltokens") == "full-ivf2" and same_keys_store("full-ivf2-np8-alltokens") == "full-alltokens"
    from knnlm.datastore.stores import probe_store, same_search_store
    # the full store's own FAISS search covers every token: 'full-alltokens' reads it; a subset's covers the scope
    assert same_search_store("full-alltokens") == "full" and same_search_store("r0.05-alltokens") == "r0.05-alltokens"
    assert probe_store("r0.05-alltokens", 4) == "r0.05-np4-alltokens" and probe_store("full", 16) == "full-np16"


def test_defaults_filled(tmp_path):
    cfg = validate_config(base_cfg(tmp_path))
    assert cfg["knn"]["k"] == 1024 and cfg["index"]["metrics"] == ["l2", "ip"] and cfg["lm"]["decoder_layers"] == 4
    assert cfg["results_dir"] == "results"


@pytest.mark.parametrize("patch, key, expected", [
    ({"knn": {"k": "many"}}, "knn.k", "integer"),
    ({"index": {"metrics": ["cosine"]}}, "index.metrics.0", "enum"),
    ({"lm": {"decoder_layerz": 3}}, "lm", "decoder_layerz"),
    ({"eval": {"context_window": 999}}, "eval.context_window", "tokens_per_sample"),
    ({"generation": {"prefix_tokens": 200}}, "generation.prefix_tokens", "window of base LM"),
    ({"temperature": {"ratios": [0.3]}}, "temperature.ratios", "datastore_size.ratios"),
    ({"datastore_size": {"ratios": [0]}}, "datastore_size.ratios.0", "0"),
    ({"parametric": {"mos": {"mixtures": [1]}}}, "parametric.mos.mixtures.0", "2"),
    # a key type or metric the artifacts do not have: named before any job runs
    ({"datastore": {"key_types": ["ffn"]}, "retrieval": {"key_types": ["att"]}}, "retrieval.key_types", "dumps ['ffn']"),
    ({"index": {"metrics": ["l2"]}, "retrieval": {"metrics": ["ip"]}}, "retrieval.metrics", "builds ['l2']"),
    ({"datastore": {"key_types": ["ffn"]}, "retrieval": {"key_types": ["ffn"]}, "datastore_size": {"key_types": ["ffn"]},
      "parametric": {"key_types": ["ffn"], "mos": {"key_types": ["ffn"]}, "adaptive": {"key_types": ["ffn"]},
                     "clustered": {"key_types": ["ffn"]}}, "variance": {"index_seeds": [2]}},
     "variance.key_type", "dumps ['ffn']"),
    ({"datastore": {"key_types": ["ffn"]}, "retrieval": {"key_types": ["ffn"]}, "datastore_size": {"key_types": ["ffn"]},
      "parametric": {"key_types": ["ffn"]}}, "parametric.adaptive.key_types", "dumps ['ffn']"),
    # App. E.6: LMs trained from another LM of the run
    ({"lms": {"base": {"source": "train"}, "o": {"source": "train", "init_from": "nope"}}}, "lms.o.init_from", "'nope'"),
    ({"lms": {"base": {"source": "train"}, "o": {"source": "train", "init_from": "base",
                                                   "lm": {"decoder_layers": 1}}}}, "lms.o.init_from", "decoder_layers"),
    ({"lms": {"base": {"source": "train", "init_from": "o"}, "o": {"source": "train", "init_from": "base"}}},
     "lms.base.init_from", "cycle"),
    ({"lms": {"base": {"source": "train"}, "s": {"source": "train", "teacher": "s"}}}, "lms.s.teacher", "another LM"),
    ({"lms": {"base": {"source": "train"}, "s2": {"source": "train"}}, "hypotheses": {"overfit_lms": ["s2"]}},
     "hypotheses.overfit_lms", "'s2'"),
    ({"lms": {"base": {"source": "train"}, "s2": {"source": "train"}, "s": {"source": "train", "teacher": "s2"}},
      "hypotheses": {"soft_label_lms": ["s"]}}, "hypotheses.soft_label_lms", "primary LM 'base'"),
    # Table 4's rows: base LMs of 'lms' with the primary one
    ({"lms": {"base": {"source": "train"}, "s2": {"source": "train"}}, "table4": {"lms": ["s2"]}}, "table4.lms",
     "primary LM 'base'"),
    ({"lms": {"base": {"source": "train"}, "o": {"source": "train", "init_from": "base"}}, "table4": {"lms": ["base", "o"]}},
     "table4.lms", "['base', 'o']"),
])
def test_schema_errors_name_the_key(tmp_path, patch, key, expected):
    cfg = base_cfg(tmp_path)
    cfg.update(patch)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, "my.yaml")
    msg = str(e.value)
    assert f"'{key}'" in msg and expected in msg and "my.yaml" in msg


def test_table4_lms_default_and_choice(tmp_path):
    """table4_lms: every LM of 'lms' not trained from another one, or those of 'table4.lms' in the order of 'lms'."""
    from knnlm.config import table4_lms

    lms = {"base": {"source": "train"}, "s2": {"source": "train"}, "small": {"source": "train"},
           "o": {"source": "train", "init_from": "base"}}
    base = base_cfg(tmp_path)
    cfg = validate_config({**base, "lms": lms})
    assert table4_lms(cfg) == ["base", "s2", "small"]
    cfg = validate_config({**base, "lms": lms, "table4": {"lms": ["small", "base"]}})
    assert table4_lms(cfg) == ["base", "small"]


def test_missing_data_dir_names_path_and_key(tmp_path):
    cfg = validate_config({"name": "t", "data": {"dir": str(tmp_path / "nope")}})
    with pytest.raises(ConfigError, match=r"data\.dir.*nope"):
        check_data(cfg)


def test_missing_split_names_file(tmp_path):
    cfg = validate_config(base_cfg(tmp_path))
    (Path(cfg["data"]["dir"]) / "wiki.valid.tokens").unlink()
    with pytest.raises(ConfigError, match=r"data\.dir.*wiki\.valid\.tokens"):
        check_data(cfg)


def test_download_mode_skips_data_check(tmp_path):
    """A data.dir that does not exist is an error naming it, unless the corpus is to be downloaded there."""
    missing = {"name": "t", "data": {"dir": str(tmp_path / "nope")}}
    with pytest.raises(ConfigError, match=r"data\.dir.*nope"):
        check_data(validate_config(missing))
    assert check_data(validate_config({**missing, "data": {**missing["data"], "download": True}})) is None


def test_all_shipped_configs_validate():
    for p in sorted((PROJECT_ROOT / "configs").glob("*.yaml")):
        cfg = load_config(p)
        assert cfg["name"] == p.stem


@pytest.mark.dag  # runs Snakemake (a dry run of the DAG)
def test_snakemake_reports_bad_config(tmp_path):
    cfg = base_cfg(tmp_path)
    cfg["knn"] = {"k": -3}
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(cfg))
    r = subprocess.run(SNAKEMAKE + ["-n", "-s", "workflow/Snakefile", "--configfile", str(p)], cwd=PROJECT_ROOT,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "'knn.k'" in r.stdout + r.stderr


@pytest.mark.dag  # runs Snakemake (a dry run of the DAG)
def test_snakemake_reports_missing_data(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "data": {"dir": str(tmp_path / "absent")}}))
    r = subprocess.run(SNAKEMAKE + ["-n", "-s", "workflow/Snakefile", "--configfile", str(p)], cwd=PROJECT_ROOT,
                       capture_output=True, text=True)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "data.dir" in out and "absent" in out


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}


def test_create_npy_failure_leaves_no_file(tmp_path):
    target = tmp_path / "keys.npy"
    with pytest.raises(KeyboardInterrupt):
        with create_npy(target, (10, 4), np.float16) as a:
            a[:5] = 1
            raise KeyboardInterrupt
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_truncated_npy_is_detected(tmp_path):
    p = tmp_path / "keys.npy"
    save_npy(p, np.ones((100, 8), np.float16))
    assert open_npy(p, (100, 8), np.float16).shape == (100, 8)
    with pytest.raises(ArtifactError, match="shape"):
        open_npy(p, (99, 8), np.float16)
    with pytest.raises(ArtifactError, match="dtype"):
        open_npy(p, (100, 8), np.float32)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 10])
    with pytest.raises(ArtifactError, match="truncated"):
        open_npy(p)
    with pytest.raises(ArtifactError, match="missing"):
        open_npy(tmp_path / "none.npy")


def test_manifest_mismatch(tmp_path):
    check_manifest({"checkpoint_sha256": "a", "N": 3}, {"checkpoint_sha256": "a"}, "ds")
    with pytest.raises(ArtifactError, match=r"(?s)another checkpoint.*checkpoint_sha256: manifest has .a., expected .b."):
        check_manifest({"checkpoint_sha256": "a"}, {"checkpoint_sha256": "b"}, "datastore x")


@pytest.mark.parametrize("writer", ["save_npy", "create_npy", "write_json"])
def test_a_full_disk_leaves_no_artifact(tmp_path, writer):
    """A job that hits the file-size limit (EFBIG; a full disk gives ENOSPC the same way) fails, and nothing is
    left under the artifact's final name or its temporary name (ulimit -f in a child shell)."""
    out = tmp_path / ("a.json" if writer == "write_json" else "a.npy")
    body = {"save_npy": f"save_npy({str(out)!r}, np.ones((512, 512)))",
            "create_npy": f"with create_npy({str(out)!r}, (512, 512), np.float64) as a:\n    a[:] = 1",
            "write_json": f"write_json({str(out)!r}, {{'x': list(range(200000))}})"}[writer]
    code = ("import signal\nimport numpy as np\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "from knnlm.io import create_npy, save_npy, write_json\n" + body)
    r = subprocess.run(["bash", "-c", f"ulimit -f 64 && {sys.executable} -c \"$0\"", code], capture_output=True,
                       text=True, cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
    assert r.returncode != 0 and "OSError" in r.stderr, r.stderr[-2000:]  # EFBIG, or numpy: "n requested and m written"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, max_lines, expected", [
    (b" = A = \n caf\xe9 au lait \n", None, r"wiki\.test\.tokens is not valid UTF-8 \(line 2, byte b'\\xe9 au'"),
    (b"\n \n\n", None, r"wiki\.test\.tokens \(test\) has no words; expected text, found 3 blank line\(s\)"),
    (b"\n\n text later \n", 2, r"has no words in its first 2 lines \(data\.max_lines\.test\)"),
])
def test_bad_corpus_is_named_before_it_becomes_an_artifact(tmp_path, content, max_lines, expected):
    """A split that is not UTF-8, or has no words, fails prepare_data with the file, line and what was found, and
    leaves no prepared split behind."""
    from knnlm.data import prepare_splits

    cfg = validate_config(base_cfg(tmp_path))
    if max_lines:
        cfg["data"]["max_lines"] = {"test": max_lines}
    (Path(cfg["data"]["dir"]) / "wiki.test.tokens").write_bytes(content)
    out = {s: tmp_path / "out" / f"{s}.tokens" for s in ("train", "valid", "test")}
    with pytest.raises(ConfigError, match=expected):
        prepare_splits(cfg, out, tmp_path / "out" / "wordcounts.json")
    assert not out["test"].exists() and not (tmp_path / "out" / "wordcounts.json").exists()


def test_atomic_path_removes_what_a_killed_writer_left(tmp_path):
    """A writer killed mid-write leaves `<name>.tmp-<pid>`; the next writer of the same artifact removes it (and
    never touches another artifact's temporaries)."""
    (tmp_path / "a.npy.tmp-99999").write_bytes(b"half")
    (tmp_path / "a.npy.tmp-88888").mkdir()
    (tmp_path / "b.npy.tmp-99999").write_bytes(b"other")
    save_npy(tmp_path / "a.npy", np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy.tmp-99999"]


def test_any_corpus_by_file_names(tmp_path):
    """A corpus in another layout (Penn Treebank's ptb.<split>.txt) is named per split in 'data.files';
    a wrong name fails before any job, naming the file and the key."""
    from knnlm.config import split_files
    from knnlm.data import prepare_splits

    d = tmp_path / "ptb"
    d.mkdir()
    for s in ("train", "valid", "test"):
        (d / f"ptb.{s}.txt").write_text(" the cat sat on the mat \n a dog barked \n")
    cfg = validate_config({"name": "p", "data": {"dir": str(d), "files": {s: f"ptb.{s}.txt" for s in ("train", "valid", "test")}}})
    check_data(cfg)
    assert split_files(cfg)["valid"] == d / "ptb.valid.txt"
    out = {s: tmp_path / "out" / f"{s}.tokens" for s in ("train", "valid", "test")}
    stats = prepare_splits(cfg, out, tmp_path / "out" / "wordcounts.json")
    assert stats["test"]["words"] == 6 + 3 + 2  # whitespace words + one <eos> per line
    cfg["data"]["files"]["test"] = "ptb.tst.txt"
    with pytest.raises(ConfigError, match=r"'data\.dir'.*ptb\.tst\.txt.*'data\.files'"):
        check_data(cfg)


def test_hf_dataset_download_writes_the_split_files(tmp_path, monkeypatch):
    """data.hf_dataset: each split's rows become one line each of the split file (datasets.load_dataset stood in)."""
    import sys
    import types

    from knnlm.data import count_words, download

    rows = {"train": [" = A = \n", " a b c \n", ""], "validation": [" v w\n"], "test": ["t\n", " u"]}

    class DS:
        def __init__(self, r):
            self.r, self.column_names = r, ["text"]

        def __len__(self):
            return len(self.r)

        def __getitem__(self, k):
            return self.r

    fake = types.SimpleNamespace(load_dataset=lambda name, config, split: DS(rows[split]))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    cfg = load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"data": {"dir": str(tmp_path), "download": True,
                                                                         "hf_dataset": {"name": "x/wikitext"}}})
    download(cfg)
    assert (tmp_path / "wiki.train.tokens").read_text() == " = A = \n a b c \n\n"
    assert count_words(tmp_path / "wiki.test.tokens") == {"lines": 2, "words": 4}
    cfg["data"]["hf_dataset"]["text_field"] = "content"
    with pytest.raises(ConfigError, match="has no column 'content'"):
        download(cfg)


def test_dump_refuses_keys_outside_fp16(tmp_path):
    """A hidden state beyond fp16's range would be stored as inf: the dump names the key file and rows, and
    leaves no datastore behind."""
    import torch

    from knnlm.lm import LMPass
    from knnlm.datastore.dump import dump_datastore

    def states(split, with_log_probs):
        for start in (0, 4):
            att = torch.ones(4, 3)
            if start == 4:
                att[1, 2] = 1e5  # > 65504
            yield {"att": att, "ffn": torch.zeros(4, 3), "target": torch.arange(4)}

    lm = LMPass(n=lambda split: 8, d=3, states=states, identity=lambda split: {})
    paths = {"att": tmp_path / "att.npy", "ffn": tmp_path / "ffn.npy"}
    with pytest.raises(ArtifactError, match=r"att.npy: non-finite att keys in rows 4\.\.7"):
        dump_datastore(lm, paths, tmp_path / "vals.npy", tmp_path / "manifest.json", threads=1)
    assert not any(p.exists() for p in [*paths.values(), tmp_path / "vals.npy", tmp_path / "manifest.json"])


def test_release_rows_keeps_a_writers_rss_flat(tmp_path):
    """A 64 MB output filled in row chunks through create_npy: with release_rows after each chunk the process's RSS
    grows by under 16 MB, without it by over 48 MB (so the check can fail), and the file holds every row either
    way (the pages go back to the file, not away)."""
    from knnlm.io import create_npy, open_npy, release_rows

    rows, cols, chunk = 2048, 8192, 128
    for release in (True, False):
        path = tmp_path / f"out_{release}.npy"
        with create_npy(path, (rows, cols), np.float32) as out:
            before = rss_mb()
            for a in range(0, rows, chunk):
                out[a:a + chunk] = np.arange(a, a + chunk, dtype=np.float32)[:, None]
                if release:
                    release_rows(out, a, a + chunk)
            grown = rss_mb() - before
        assert (grown < 16) if release else (grown > 48), (release, grown)
        back = open_npy(path, (rows, cols), np.float32)
        assert np.array_equal(back[:, 0], np.arange(rows, dtype=np.float32)) and (back[:, -1] == back[:, 0]).all()
    release_rows(np.zeros((4, 4)), 0, 4)  # not a memmap: no-op


def test_release_rows_on_a_read_only_memmap(tmp_path):
    """A reader of a 64 MB .npy (open_npy, mode 'r') that releases each chunk after use ends with its RSS grown by
    under 16 MB, one that does not by over 48 MB, and both read the same values."""
    from knnlm.io import open_npy, release_rows, save_npy

    rows, cols, chunk = 2048, 8192, 128
    path = tmp_path / "in.npy"
    save_npy(path, np.repeat(np.arange(rows, dtype=np.float32)[:, None], cols, axis=1))
    for release in (True, False):
        arr = open_npy(path, (rows, cols), np.float32)
        before, total = rss_mb(), 0.0
        for a in range(0, rows, chunk):
            total += float(np.asarray(arr[a:a + chunk]).sum())
            if release:
                release_rows(arr, a, a + chunk)
        grown = rss_mb() - before
        del arr
        assert total == float(cols) * rows * (rows - 1) / 2
        assert (grown < 16) if release else (grown > 48), (release, grown)


def test_iter_chunks_releases_the_rows_it_went_over(tmp_path):
    """iter_chunks covers 0..n once, in order; the arrays it is given leave the RSS chunk by chunk (RssFile), while
    the same read without them keeps every page."""
    from knnlm.io import iter_chunks

    assert list(iter_chunks(10, 4)) == [(0, 4), (4, 8), (8, 10)] and list(iter_chunks(0, 4)) == []
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        list(iter_chunks(10, 0))
    rows, dim = 16384, 1024  # 64 MB of float32
    save_npy(tmp_path / "a.npy", np.ones((rows, dim), dtype=np.float32))
    grown = {}
    for release in (False, True):
        arr = open_npy(tmp_path / "a.npy", (rows, dim), np.float32)
        before, total = rss_mb("RssFile"), 0.0
        for s, e in iter_chunks(rows, 1024, *([arr] if release else [])):
            total += float(arr[s:e].sum())
        grown[release] = rss_mb("RssFile") - before
        assert total == rows * dim
        del arr
    assert grown[False] > 48 and grown[True] < 16, grown


@pytest.mark.dag  # runs Snakemake (dry runs of the DAG)
def test_extras_leave_all_when_config_says_so(tmp_path):
    """With 'extras.in_all' false, `all` plans every section of the paper (Table 4's LMs, the PCA store, App. E.5-E.6's
    LMs, the findings) and none of the extras: no IVFPQ seed or subset draw, no probe count, no RetoMaton,
    greedy-merging or generation job, and the findings read none of their tables; `snakemake extras` plans them all,
    `snakemake followups` the three follow-ups (and the datastore's own neighbours). With the default (true), `all`
    plans everything."""
    def planned(target, *extra):
        r = subprocess.run(SNAKEMAKE + [target, "-n", "--forceall", "-s", "workflow/Snakefile", "--configfile",
                                        "configs/tiny.yaml", *extra, "--config", f"results_dir={tmp_path}"],
                           cwd=PROJECT_ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout

    off = tmp_path / "extras_off.yaml"
    off.write_text("extras:\n  in_all: false\n")
    rules = ("rule write_retomaton:", "rule write_pruning:", "rule datastore_neighbours:", "rule write_generation:")
    checks = ("-ivf", "-draw", "-np1", "tables/variance.md", "tables/probe_sweep.md")
    paper = ("/pca", "tables/table4.md", "findings.md")  # the tiny config trains no App. E.5-E.6 LMs
    left_out, extras = planned("all", str(off)), planned("extras", str(off))
    followups, default = planned("followups", str(off)), planned("all")
    assert "rule write_findings:" in left_out and not any(r in left_out for r in rules)
    assert not any(c in left_out for c in checks) and all(p in left_out for p in paper)
    assert not any(f"{t}_comparisons" in left_out for t in ("retomaton", "pruning", "generation"))
    assert all(r in extras for r in rules) and all(c in extras for c in checks)
    assert "rule write_findings:" not in extras
    assert all(r in followups for r in rules) and not any(c in followups for c in checks)
    assert all(r in default for r in rules) and all(c in default for c in checks)


def test_shipped_corpus_is_read_from_its_archive_and_checked(tmp_path):
    """configs/tiny.yaml reads WikiText-2 from the archive shipped in corpora/ (no folder outside the repository):
    the prepared splits are its slices, the whole splits match data.sha256, and the word counts are WikiText's."""
    from knnlm.data import prepare_splits

    cfg = load_config(PROJECT_ROOT / "configs" / "tiny.yaml")
    cfg["data"]["archive"] = str(PROJECT_ROOT / cfg["data"]["archive"])
    check_data(cfg)
    out = {s: tmp_path / f"{s}.tokens" for s in ("train", "valid", "test")}
    stats = prepare_splits(cfg, out, tmp_path / "wordcounts.json")
    assert {s: v["lines"] for s, v in stats.items()} == {"train": 400, "valid": 60, "test": 60}
    assert out["valid"].read_text(encoding="utf-8").splitlines()[1] == " = Homarus gammarus = "
    cfg["data"]["max_lines"] = None
    full = prepare_splits(cfg, out, tmp_path / "wordcounts.json")
    assert full["valid"]["words"] == 217646 and full["test"]["lines"] == 4358  # corpora/README.md


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_archive_members_by_name_and_sha256(tmp_path, fmt):
    """data.archive: splits are found by file name in any folder of a .tar.gz or .zip; a split that differs from
    data.sha256, a missing member, a missing archive or both dir and archive fail naming the config key."""
    import hashlib
    import shutil

    from knnlm.data import prepare_splits

    src = Path(base_cfg(tmp_path)["data"]["dir"])
    archive = Path(shutil.make_archive(str(tmp_path / "corpus"), "gztar" if fmt == "tar.gz" else "zip", tmp_path, "data"))
    good = hashlib.sha256((src / "wiki.valid.tokens").read_bytes()).hexdigest()
    cfg = validate_config({"name": "t", "data": {"archive": str(archive), "sha256": {"wiki.valid.tokens": good}}})
    check_data(cfg)
    out = {s: tmp_path / "out" / f"{s}.tokens" for s in ("train", "valid", "test")}
    stats = prepare_splits(cfg, out, tmp_path / "out" / "wordcounts.json")
    assert out["valid"].read_bytes() == (src / "wiki.valid.tokens").read_bytes() and stats["valid"]["words"] == 8
    assert stats["valid"]["source"].endswith("wiki.valid.tokens") and str(archive) in stats["valid"]["source"]
    cfg["data"]["sha256"] = {"wiki.test.tokens": "0" * 64}
    with pytest.raises(ConfigError, match=r"'data\.sha256\.wiki\.test\.tokens': expected 0{64}"):
        prepare_splits(cfg, out, tmp_path / "out" / "wordcounts.json")
    cfg["data"]["sha256"], cfg["data"]["files"] = None, {"test": "ptb.test.txt"}
    with pytest.raises(ConfigError, match=r"'data\.archive'.*no (member|file) named 'ptb\.test\.txt'"):
        prepare_splits(cfg, out, tmp_path / "out" / "wordcounts.json")
    with pytest.raises(ConfigError, match=r"'data\.archive'.*does not exist"):
        check_data(validate_config({"name": "t", "data": {"archive": str(tmp_path / "none.tar.xz")}}))
    with pytest.raises(ConfigError, match=r"exactly one of 'data\.dir'.*'data\.archive'"):
        check_data(validate_config({"name": "t", "data": {"archive": str(archive), "dir": str(src)}}))


def test_nothing_reads_outside_the_repository():
    """The shipped configs, tests and README commands need no folder beside the clone (the corpus is in corpora/)."""
    files = [*(PROJECT_ROOT / "configs").glob("*.yaml"), *(PROJECT_ROOT / "tests").glob("*.py"), PROJECT_ROOT / "README.md"]
    offenders = [str(p.relative_to(PROJECT_ROOT)) for p in files if "../shared" in p.read_text() and p.name != Path(__file__).name]
    assert not offenders


def test_lm_schedule_is_passed_to_fairseq():
    """Config 'lm.lr_scheduler': 'cosine' (a half-cosine to 0 at max_update, how the shipped wikitext2 LMs reached
    their plateau) or the default 'inverse_sqrt', as fairseq-train arguments."""
    from knnlm.lm.training import train_command

    cfg = load_config(PROJECT_ROOT / "configs" / "wikitext2.yaml")
    cmd = train_command(cfg["lm"], "data-bin", "save", 2)
    assert cmd[cmd.index("--lr-scheduler") + 1] == "cosine" and cmd[cmd.index("--min-lr") + 1] == "0"
    assert cmd[cmd.index("--max-update") + 1] == str(cfg["lm"]["max_update"])
    plain = train_command({**cfg["lm"], "lr_scheduler": "inverse_sqrt"}, "data-bin", "save", 2)
    assert plain[plain.index("--lr-scheduler") + 1] == "inverse_sqrt" and "--min-lr" not in plain
    assert load_config(PROJECT_ROOT / "configs" / "tiny.yaml")["lm"]["lr_scheduler"] == "inverse_sqrt"  # the default


def test_a_corrupt_index_file_is_named(tmp_path):
    """A faiss index cut short, replaced by other bytes or missing gives ArtifactError naming the file (not a faiss
    RuntimeError from deep inside the search)."""
    import faiss

    from knnlm.search.index import read_index

    x = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    index = faiss.IndexIVFPQ(faiss.IndexFlatL2(16), 16, 8, 4, 8)
    index.train(x)
    index.add(x)
    good = tmp_path / "att_l2.faiss"
    faiss.write_index(index, str(good))
    assert read_index(good).ntotal == 2000
    cut = tmp_path / "cut.faiss"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    junk = tmp_path / "junk.faiss"
    junk.write_bytes(b"\x93NUMPY" + bytes(200))
    flat = tmp_path / "flat.faiss"
    faiss.write_index(faiss.IndexFlatL2(16), str(flat))
    for path in (cut, junk, flat, tmp_path / "none.faiss"):
        with pytest.raises(ArtifactError, match=re.escape(str(path))):
            read_index(path)


def test_merge_topk_refuses_mismatched_shards():
    """merge_topk's checks: a shard with another number of queries, ids and distances of different shapes, an output
    of another shape, k above the shards' candidates, an unknown metric: ValueError saying what was found."""
    from knnlm.search.exact import merge_topk

    ids, d = np.zeros((5, 4), np.int64), np.zeros((5, 4), np.float32)
    out = (np.empty((5, 3), np.int64), np.empty((5, 3), np.float32))
    for parts, o, k, metric, msg in (
            ([(ids, d), (ids[:4], d[:4])], out, 3, "l2", "parts must be"),
            ([(ids, d[:, :3])], out, 3, "l2", "parts must be"),
            ([(ids, d)], (out[0][:, :2], out[1]), 3, "l2", "parts must be"),
            ([(ids[:, :2], d[:, :2])], out, 3, "l2", r"k must be in \[1, 2\]"),
            ([(ids, d)], out, 3, "cos", "metric must be")):
        with pytest.raises(ValueError, match=msg):
            merge_topk(parts, k, metric, o, progress=False)


def test_checkpoints_load_without_running_code(tmp_path):
    """knnlm.io.load_checkpoint: tensors, plain types, argparse.Namespace (fairseq's published checkpoints) and numeric
    numpy arrays load with weights_only=True; any other object is refused naming the file and the object, unless the
    file's sha256 is the trusted one (a config's pinned lms.<lm>.sha256)."""
    import argparse
    import datetime

    import torch

    from knnlm.io import ArtifactError, load_checkpoint, sha256_file

    ok = tmp_path / "ok.pt"
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(arch="transformer_lm", lr=[0.1]),
                "cache": np.arange(3, dtype=np.float32), "n": 3}, ok)
    st = load_checkpoint(ok)
    assert st["args"].arch == "transformer_lm" and st["cache"].tolist() == [0.0, 1.0, 2.0] and st["n"] == 3
    bad = tmp_path / "bad.pt"
    torch.save({"model": {"w": torch.ones(2)}, "when": datetime.date(2020, 1, 2)}, bad)
    with pytest.raises(ArtifactError, match=r"bad.pt: refused to load: .*datetime.date.*pin its sha256"):
        load_checkpoint(bad)
    with pytest.raises(ArtifactError, match="refused to load"):
        load_checkpoint(bad, trusted_sha256="0" * 64)
    assert load_checkpoint(bad, trusted_sha256=sha256_file(bad))["when"] == datetime.date(2020, 1, 2)


def test_fairseq_lm_with_foreign_objects_is_refused(tiny_run, tmp_path):
    """fairseq's own loader runs under the same allowlist: the tiny LM's checkpoint with one foreign object added is
    refused with an ArtifactError naming the config key and the file, before any of its objects is built."""
    import datetime

    import torch

    from knnlm.io import ArtifactError
    from knnlm.lm.fairseq import load_fairseq_lm

    st = torch.load(tiny_run["root"] / "lms/base/checkpoint.pt", map_location="cpu", weights_only=True)
    st["extra_state"] = {"saved": datetime.date(2020, 1, 2)}
    bad = tmp_path / "checkpoint.pt"
    torch.save(st, bad)
    with pytest.raises(ArtifactError, match=r"config key 'lms.base': .*checkpoint.pt: refused to load"):
        load_fairseq_lm(bad, tiny_run["root"] / "data-bin", "lms.base")


@pytest.mark.parametrize("key, value", [
    ("results_dir", "out$(touch PWNED)"), ("results_dir", "out`touch PWNED`"), ("results_dir", "a b"),
    ("results_dir", "out;touch PWNED"), ("results_dir", "../elsewhere"), ("results_dir", "a/../../b"),
    ("results_dir", ".."), ("results_dir", "."), ("name", ".."), ("name", "."), ("name", "a b"), ("name", "x/y"),
    ("name", "$(touch PWNED)"), ("lms", {"..": {"source": "train"}}), ("lms", {"a;b": {"source": "train"}}),
])
def test_names_and_paths_that_would_leave_their_folder_or_reach_a_shell_are_refused(key, value):
    """results_dir, name and the LMs' names refuse '.', '..', spaces and shell metacharacters, naming the key and
    the value; ordinary paths (absolute, with './', '+' or dots inside a name) pass."""
    cfg = yaml.safe_load((PROJECT_ROOT / "configs" / "tiny.yaml").read_text())
    with pytest.raises(ConfigError, match=f"config key '{key}'.*found"):
        validate_config({**cfg, key: value})
    for ok in ("/tmp/pytest-of-root/results_1.x", "./results", "runs/2026+a"):
        validate_config({**cfg, "results_dir": ok})
    validate_config({**cfg, "name": "tiny.v2"})


@pytest.mark.dag  # runs Snakemake
def test_an_injected_results_dir_runs_nothing(tmp_path):
    """`--config results_dir='out$(touch PWNED)'` fails before any job, naming the key, and runs no shell command:
    no file PWNED appears."""
    r = subprocess.run(SNAKEMAKE + ["-s", str(PROJECT_ROOT / "workflow" / "Snakefile"), "--cores", "1",
                                    "--configfile", str(PROJECT_ROOT / "configs" / "tiny.yaml"),
                                    "--config", "results_dir=out$(touch PWNED)"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "config key 'results_dir'" in r.stdout + r.stderr
    assert not (tmp_path / "PWNED").exists() and not list(tmp_path.glob("out*"))


@pytest.mark.dag  # runs Snakemake (a dry run of the DAG)
def test_an_own_corpus_with_a_small_lm_needs_no_other_section(tmp_path):
    """A minimal config for a new corpus (three split files) and a 2-layer LM with a 64-token window dry-runs
    'table1': the defaults that depend on the LM's window (eval.context_window, generation's prefix and length) are
    derived from it, not refused for a section the user never asked for."""
    cfg = base_cfg(tmp_path)
    cfg["lm"] = {"decoder_layers": 2, "decoder_embed_dim": 32, "decoder_ffn_embed_dim": 64,
                 "decoder_attention_heads": 2, "tokens_per_sample": 64}
    cfg["results_dir"] = str(tmp_path / "results")
    filled = validate_config(cfg)
    assert filled["eval"]["context_window"] == 32 and (filled["generation"]["prefix_tokens"],
                                                       filled["generation"]["new_tokens"]) == (16, 32)
    p = tmp_path / "own.yaml"
    p.write_text(yaml.safe_dump(cfg))
    r = subprocess.run(SNAKEMAKE + ["table1", "-n", "-s", "workflow/Snakefile", "--configfile", str(p)],
                       cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "train_lm" in r.stdout and "table1" in r.stdout
    # a value the user sets is still checked against the window
    bad = {**cfg, "generation": {"prefix_tokens": 40, "new_tokens": 40}}
    with pytest.raises(ConfigError, match=r"'generation.prefix_tokens' \+ 'generation.new_tokens' \+ 1"):
        validate_config(bad)


def test_schema_errors_say_what_the_key_is_not_a_schema_dump():
    """A section given as a string (malformed --config YAML: knn=k:32) names the key, the type expected and how to
    write it, not the section's whole schema; a key with a pattern shows its description, not the regex; a bound
    names itself."""
    from knnlm.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"knn": "k:32"})
    msg = str(e.value)
    assert "config key 'knn': expected object (the kNN distribution of Eq. 5" in msg and "found 'k:32'" in msg
    assert "--config values are YAML" in msg
    assert "properties" not in msg and "lambda_steps" not in msg
    with pytest.raises(ConfigError) as e:
        load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"name": "a b"})
    assert "config key 'name': expected string (experiment name" in str(e.value) and "pattern" not in str(e.value)
    with pytest.raises(ConfigError, match=r"config key 'knn.k': expected integer, minimum 1 \(neighbours per query;.*"
                                          r"\), found 0"):
        load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"knn": {"k": 0}})


def test_a_train_split_too_small_to_train_on_is_refused_naming_it(tmp_path):
    """fairseq-train is not started on a train split of fewer than MIN_TRAIN_WINDOWS windows of tokens_per_sample
    tokens (a one-line train split): the error names the binarized split, its tokens and the tokens needed."""
    import torch
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    from knnlm.lm.training import MIN_TRAIN_WINDOWS, check_train_split

    def binarize(lines, d):
        d.mkdir()
        b = MMapIndexedDatasetBuilder(str(d / "train.bin"), dtype=np.int32)
        for n in lines:
            b.add_item(torch.arange(4, 4 + n, dtype=torch.int32))
        b.finalize(str(d / "train.idx"))
        return d

    one_line = binarize([9], tmp_path / "one")  # one line of 9 tokens
    with pytest.raises(ArtifactError, match=rf"train.bin: the train split has 9 tokens, too few .* at least "
                                            rf"{MIN_TRAIN_WINDOWS} windows of config 'lm.tokens_per_sample' = 64"):
        check_train_split(one_line, 64)
    assert check_train_split(binarize([70, 70], tmp_path / "two"), 64) == 140


def test_a_tau_grid_that_cannot_resolve_tau_is_refused():
    """A τ grid of one value (start = stop) cannot tune τ: refused before any job, naming the keys and the grid."""
    with pytest.raises(ConfigError, match=r"config keys 'temperature.start', 'stop', 'step' \(1.0, 1.0, 0.5\) give the "
                                          r"τ grid \[1.0\]: tuning τ needs at least 2 values"):
        load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"temperature": {"start": 1.0, "stop": 1.0}})


def test_k_beyond_the_smallest_store_of_a_dumped_datastore_is_refused_before_any_job(tmp_path):
    """With a datastore already dumped, config 'knn.k' larger than the smallest subset store the run searches is
    refused when the DAG is built, naming the key, the store's ratio and its keys; a fitting k passes."""
    from knnlm.config import check_k_fits_stores
    from knnlm.paths import Layout

    cfg = load_config(PROJECT_ROOT / "configs" / "tiny.yaml", {"results_dir": str(tmp_path)})
    lay = Layout.of(cfg)
    check_k_fits_stores(cfg, lay)  # nothing dumped yet: the search jobs check it
    lm = next(iter(cfg["lms"]))
    man = lay.path("datastore_manifest", lm=lm)
    man.parent.mkdir(parents=True)
    write_json(man, {"N": 1000, "D": 8})
    smallest = min(cfg["datastore_size"]["ratios"] + cfg["retrieval"]["probe_sweep"]["ratios"])
    fits = int(round(smallest * 1000))
    check_k_fits_stores({**cfg, "knn": {**cfg["knn"], "k": fits}}, lay)
    with pytest.raises(ConfigError, match=rf"config key 'knn.k' = {fits + 1:,}: the smallest store this run searches "
                                          rf"\(ratio {smallest:g} of the 1,000 keys of LM '{lm}'.*has {fits:,} keys"):
        check_k_fits_stores({**cfg, "knn": {**cfg["knn"], "k": fits + 1}}, lay)
    # dumped queries of 10^12 tokens: their neighbour caches would not fit the disk, whatever k
    for split in ("valid", "test"):
        qm = lay.path("queries_manifest", lm=lm, split=split)
        qm.parent.mkdir(parents=True)
        write_json(qm, {"T": 10 ** 12, "D": 8})
    with pytest.raises(ConfigError, match=r"config key 'knn.k' = 1: the full store's FAISS neighbour caches alone need "
                                          r"[0-9,.]+ GiB .* more than the [0-9,.]+ GiB free under"):
        check_k_fits_stores({**cfg, "knn": {**cfg["knn"], "k": 1}}, lay)
