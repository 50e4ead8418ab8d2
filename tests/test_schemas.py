"""The files the package reads are checked against their schemas (src/knnlm/schemas) when read: an error names the
file, the key, what was expected and what was found, never a bare KeyError."""
import json

import numpy as np
import pytest

from knnlm.datastore.dump import open_datastore, open_queries
from knnlm.io import ArtifactError, read_checked_json, save_npy


def _store(tmp_path, **manifest):
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps(manifest))
    save_npy(tmp_path / "vals.npy", np.arange(4, dtype=np.int32))
    return man


def test_a_datastore_manifest_without_key_types_names_the_file_and_the_key(tmp_path):
    man = _store(tmp_path, split="train", N=4, D=2)
    with pytest.raises(ArtifactError) as e:
        open_datastore(man, tmp_path / "vals.npy")
    assert str(man) in str(e.value) and "'key_types' is a required property" in str(e.value)
    assert "snakemake -R" in str(e.value)


def test_a_bad_value_says_what_was_expected_and_found(tmp_path):
    man = _store(tmp_path, split="train", N=4, D=0, key_types=["att", "mlp"])
    with pytest.raises(ArtifactError) as e:
        open_datastore(man, tmp_path / "vals.npy")
    msg = str(e.value)
    assert "key 'D': expected integer, minimum 1" in msg and "found 0" in msg
    assert "key 'key_types.1': expected enum ['att', 'ffn']" in msg and "found 'mlp'" in msg


def test_a_good_manifest_opens(tmp_path):
    man = _store(tmp_path, split="train", N=4, D=2, key_types=["att"])
    keys, vals, m = open_datastore(man, tmp_path / "vals.npy")
    assert keys is None and list(vals) == [0, 1, 2, 3] and m["N"] == 4


def test_a_queries_manifest_without_its_token_count_is_refused(tmp_path):
    man = tmp_path / "q.json"
    man.write_text(json.dumps({"split": "test", "D": 2}))
    with pytest.raises(ArtifactError, match=r"q\.json: not a valid queries manifest.*'T' is a required property"):
        open_queries(man, tmp_path / "t.npy", tmp_path / "lp.npy")


def test_every_schema_of_the_package_is_a_valid_schema(tmp_path):
    import importlib.resources

    import jsonschema
    import yaml

    schemas = list((importlib.resources.files("knnlm") / "schemas").iterdir())
    assert len(schemas) >= 2
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(yaml.safe_load(s.read_text("utf-8")))
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        read_checked_json(tmp_path / "x.json", "no_such_format")


def test_spool_records_as_the_writers_write_them_are_valid(tmp_path):
    """A run record (spool_run, with every log_run argument a job gives) and a curve point (spool_points) pass the
    spool record's schema; one without its rule does not."""
    from knnlm import tracking

    cfg = {"name": "t", "results_dir": str(tmp_path)}
    run = tracking.spool_run(tmp_path, cfg, "score", {"lm": "base"}, extra={"log_error": "busy"},
                             params={"k": 8}, metrics={"ppl": 3.0, "inf": float("inf")}, artifacts=[tmp_path],
                             step_metrics={"x": [(1, 2.0)]}, start_time=1.0, status="FAILED", error="E", run_id=None)
    point = tracking.spool_points(tmp_path, cfg, "score", {"lm": "base"}, 3, {"loss": 1.5})
    for p in (run, point):
        assert read_checked_json(p, "spool_record")["rule"] == "score"
    rec = json.loads(run.read_text())
    del rec["rule"]
    run.write_text(json.dumps(rec))
    with pytest.raises(ArtifactError, match=r"not a valid MLflow spool record.*'rule' is a required property"):
        read_checked_json(run, "spool_record")


def test_every_score_of_the_tiny_run_is_valid_and_a_damaged_one_is_named(tiny_run, tmp_path):
    """Every kNN-LM score JSON the tiny run wrote passes its schema; one without its τ* entry is refused naming the
    file and the key (never a bare KeyError deep in a job)."""
    scores = sorted(p for p in tiny_run["root"].glob("lms/*/stores/*/scores/*.json") if not p.name.endswith(".sha256.json"))
    assert scores
    for p in scores:
        assert read_checked_json(p, "score")["tuned"]["temperature"] > 0
    bad = json.loads(scores[0].read_text())
    del bad["tuned"]
    (tmp_path / "s.json").write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match=r"s\.json: not a valid kNN-LM score .*'tuned' is a required property"):
        read_checked_json(tmp_path / "s.json", "score")


def test_every_settings_json_of_the_tiny_run_is_valid_and_a_damaged_one_is_named(tiny_run, tmp_path):
    """Every mask/score settings JSON the tiny run wrote passes its schema (the tables, the findings and the regime map
    read them through it); one without its τ* entries or with an unknown metric is refused naming the file and both
    keys."""
    paths = sorted(p for p in tiny_run["root"].glob("lms/*/stores/*/settings/*.json")
                   if not p.name.endswith(".sha256.json"))
    assert len(paths) > 5
    for p in paths:
        assert read_checked_json(p, "settings")["settings"]
    bad = json.loads(paths[0].read_text())
    del bad["tuned"]
    bad["metric"] = "cos"
    (tmp_path / "s.json").write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match=r"s\.json: not a valid mask/score settings .*'tuned' is a required "
                                            r"property; key 'metric': expected enum \['l2', 'ip'\]"):
        read_checked_json(tmp_path / "s.json", "settings")


def test_the_tiny_run_s_training_records_findings_rows_and_trends_are_valid(tiny_run, tmp_path):
    """The LM training records (read by the findings, the model cards, Table 4 and App. E), the findings rows and the
    regime map's trends (read by the regime map's findings join) of the tiny run and the shipped LMs pass their
    schemas; a damaged one is refused naming the file and the key."""
    from pathlib import Path

    trainings = sorted(tiny_run["root"].glob("lms/*/training.json")) + sorted(Path("pretrained").glob("*/*/training.json"))
    assert len(trainings) > 3
    for p in trainings:
        assert read_checked_json(p, "lm_training")["updates"] >= 0
    base = tiny_run["root"] / "lms" / "base"
    rows = read_checked_json(base / "findings.json", "findings_rows")["rows"]
    assert rows and all(r["verdict"] for r in rows)
    trends = read_checked_json(base / "tables" / "regime_trends.json", "regime_trends")["trends"]
    assert {t["axis"] for t in trends} >= {"lm"}
    bad = json.loads(trainings[0].read_text())
    bad["valid"] = [[645, -1.0]]
    del bad["converged"]
    (tmp_path / "t.json").write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match=r"t\.json: not a valid LM training record.*'converged' is a required "
                                            r"property.*key 'valid.0.1'"):
        read_checked_json(tmp_path / "t.json", "lm_training")
    found = json.loads((base / "findings.json").read_text())
    del found["rows"][0]["claim id"]
    (tmp_path / "f.json").write_text(json.dumps(found))
    with pytest.raises(ArtifactError, match=r"f\.json: not a valid findings rows.*'claim id' is a required property"):
        read_checked_json(tmp_path / "f.json", "findings_rows")
