"""The findings' rules table (knnlm.experiments.findings.rules_table): every rule that replaces or qualifies a verdict
is described in the claims table, and each row it touches records the verdict it would have had without it."""
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from knnlm.experiments import findings
from knnlm.experiments.findings import CLAIMS, RULES, TAU1_OFF, _tested, load_rules, rules_table


def test_every_rule_the_engine_applies_is_described_in_the_claims_table():
    source = Path(findings.__file__).read_text(encoding="utf-8")
    applied = set(re.findall(r'rules\.append\(\("([^"]+)"', source))
    assert len(applied) >= 8 and applied == set(RULES)
    for r in RULES.values():
        assert r["basis"].startswith("ours:") or re.search(r"(Sec\.|App\.|Table|Figure) ", r["basis"]), r


def _row(**kw):
    return pd.Series({"comparison": "att/L2 vs base", "relative difference": -0.1, "CI low": -0.12, "CI high": -0.08,
                      "verdict": "lower", "documents": 62, "effective documents": 36.0, **kw})


def test_each_rule_records_the_verdict_it_withheld():
    c = next(c for c in CLAIMS if c["id"] == "table1.1")  # the kNN-LM beats the base LM (paper: lower)
    plain = _tested(c, _row(), "", {}, 20)
    assert plain["verdict"] == "reproduced" and plain["_rules"] == []
    off = _tested(c, _row(), "", {}, 20, tau1_off="att/L2")
    assert off["verdict"] == TAU1_OFF and off["_rules"] == [("τ = 1 off τ*", "reproduced")]
    few = _tested(c, _row(), "", {}, 40, tau1_off="att/L2")  # too few documents first: the τ = 1 rule has no verdict
    assert few["verdict"].startswith("inconclusive (62") and few["_rules"] == [("too few documents", "reproduced")]
    worse = _tested(c, _row(verdict="higher", **{"CI low": 0.01, "CI high": 0.05}), "", {}, 20, base_undertrained=True)
    assert worse["verdict"] == "contradicted (base LM under-trained)"
    assert worse["_rules"] == [("base LM under-trained", "contradicted")]
    premise = _tested(c, _row(premise="the LM did not memorise"), "", {}, 20)
    assert premise["verdict"].startswith("not tested") and premise["_rules"] == [("premise absent", "reproduced")]
    t = rules_table([plain, off, few, worse, premise]).set_index("rule")
    assert list(t.index) == list(RULES)  # every rule, touched or not
    assert t.loc["τ = 1 off τ*", "rows"] == 1 and t.loc["τ = 1 off τ*", "would be reproduced"] == 1
    assert t.loc["base LM under-trained", "would be contradicted"] == 1
    assert t.loc["under-trained alternative", "rows"] == 0
    assert t["rows"].sum() == 4


def test_a_rule_without_an_entry_is_refused():
    with pytest.raises(ValueError, match="'made up'.*lacks"):
        rules_table([{"_rules": [("made up", "reproduced")]}])


def test_a_bad_rule_entry_is_refused_naming_the_file(tmp_path):
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": [], "rules": {"x": {"effect": "hides", "does": "d", "basis": "ours: b"}}}))
    with pytest.raises(ValueError, match=f"{p}: not a valid claims table: key 'rules.x.effect': expected enum "
                                         r"\['replaces', 'qualifies'\] \(the row gets another verdict"):
        load_rules(p)


def test_the_tiny_findings_carry_the_rules_table(tiny_run):
    import json

    base = tiny_run["root"] / "lms" / "base"
    out = json.loads((base / "findings.json").read_text())
    table = {r["rule"]: r for r in out["rules"]}
    assert list(table) == list(RULES)
    touched = [name for r in out["rows"] for name, _ in r.get("rules") or []]
    for name, r in table.items():
        assert r["rows"] == touched.count(name) == \
            r["would be reproduced"] + r["would be contradicted"] + r["would be neither"]
    text = (base / "findings.md").read_text()
    assert "Rules: every rule" in text and all(f"| {name} " in text for name in RULES)
    # a row's verdict says what its last replacing rule made of it
    for r in out["rows"]:
        if any(name == "τ = 1 off τ*" for name, _ in r.get("rules") or []):
            assert r["verdict"].startswith(TAU1_OFF)


def test_every_claim_of_the_claims_table_has_a_row(tiny_run):
    """No silent claim: each entry of claims.yaml yields at least one findings row, a measurement or a 'not run (why)'
    row, and the Summary counts every row."""
    import json

    found = json.loads((tiny_run["root"] / "lms" / "base" / "findings.json").read_text())
    ids = {r["claim id"] for r in found["rows"]}
    assert ids == {c["id"] for c in CLAIMS}, sorted({c["id"] for c in CLAIMS} - ids)
    assert sum(found["summary"].values()) == len(found["rows"])
    assert not [r["claim id"] for r in found["rows"] if r["verdict"] == "not run"]  # each 'not run' says why
    assert any(r["verdict"] == "not run (no 'size_curve' table in this run)" for r in found["rows"])


def test_the_tau_rule_reads_every_kind_alike():
    """The τ = 1 rule is no flag of the claims table: a claim of ours beyond the paper compared at τ = 1 (the best
    kNN-LM against the learned W_ds) is read like the paper's own, reported where its kNN-LM's τ* beats τ = 1 on
    valid and tested where it does not; a row with a τ* side, a reported claim and a row without a τ-tuned side (an
    n-gram comparison) are never read at τ = 1, and their test column does not say so."""
    from knnlm.experiments.findings import _tau1_sides

    assert not any("tau1" in e for e in yaml.safe_load(findings.CLAIMS_FILE.read_text())["claims"])
    ours = next(c for c in CLAIMS if c["id"] == "parametric.7")
    assert ours["kind"] == "ours" and ours["tau1"]
    t1 = pd.DataFrame([{"split": "valid", "comparison": "att/L2 τ* vs att/L2", "verdict": v} for v in ["lower"]])
    r = _row(comparison="kNN-LM att/L2 vs W_ds (learned) att", verdict="lower")
    assert _tau1_sides(ours, r, {"table1": (t1, "")}) == {"att/L2": "lower"}
    assert _tested(ours, r, "", {}, 20, tau1_off="att/L2", at_tau1=True)["verdict"] == TAU1_OFF
    t1.loc[0, "verdict"] = "inconclusive"  # τ* no better than τ = 1 on valid: the τ = 1 row carries the verdict
    assert _tau1_sides(ours, r, {"table1": (t1, "")}) == {"att/L2": "inconclusive"}
    row = _tested(ours, r, "", {}, 20, tau1_off="", at_tau1=True)
    assert row["verdict"] == "reproduced" and row["test"].endswith(", at τ = 1")
    tuned = next(c for c in CLAIMS if c["id"] == "parametric.9")
    assert _tau1_sides(tuned, _row(comparison="kNN-LM att/L2 τ* vs W_ds (learned) att"), {"table1": (t1, "")}) == {}
    assert not next(c for c in CLAIMS if c["reported"])["tau1"]
    ngram = next(c for c in CLAIMS if c["id"] == "ngram.2")
    r = _row(comparison="kNN-LM vs LM + n-gram (n tuned on valid)")
    ng = pd.DataFrame([{"split": "valid", "comparison": "kNN-LM vs base", "verdict": "lower"}])
    assert _tau1_sides(ngram, r, {"ngram": (ng, "")}) == {}
    assert not _tested(ngram, r, "", {}, 20, at_tau1=False)["test"].endswith("τ = 1")


def test_each_row_names_its_own_regime():
    """A row's regime column reads the store it rests on: the 5 % store's rows per vocabulary entry for its sources,
    the kNN-LM on the alternatives' rows for a parametric row against it (its 'reference rows' over V), the full store
    otherwise, each with the row's value and the paper's; the scan axis is named for every source with a FAISS
    kNN-LM side."""
    from knnlm.experiments.findings import REGIME, SMALL_SOURCES, SUBSET, regime_label, row_regime_values

    full = {"lm": (161.4, "161.4"), "store": (339.0, "339"), "scan": (23.7, "23.7·k")}
    small = {**full, "store": (17.0, "17"), "scan": (22.0, "22·k")}
    by_store = {src: small for src in SMALL_SOURCES}
    claim = next(c for c in CLAIMS if c["source"] == "small_store")
    label = regime_label(claim, row_regime_values(full, by_store, "small_store", pd.Series({"comparison": "x"}), 7792))
    assert "datastore rows per vocabulary entry: 17, the paper's 5,000" in label and "22·k, the paper's 1,170·k" in label
    par = next(c for c in CLAIMS if c["id"] == "parametric.13")
    r = pd.Series({"comparison": f"kNN-LM att/IP{SUBSET} vs 2V embeddings att", "reference rows": 200000})
    assert "entry: 25.7, the paper's" in regime_label(par, row_regime_values(full, by_store, "parametric", r, 7792))
    r = pd.Series({"comparison": "kNN-LM att/IP vs 2V embeddings att", "reference rows": 2642889})
    assert "entry: 339, the paper's" in regime_label(par, row_regime_values(full, by_store, "parametric", r, 7792))
    assert regime_label(par, {k: (REGIME[k]["paper"], "") for k in REGIME}) == "the paper's"
    of_source = yaml.safe_load(findings.CLAIMS_FILE.read_text())["regime_of_source"]
    for src in ("parametric", "ensembling", "overfitting", "soft_labels", "ngram", "leakage", "pruning"):
        assert "scan" in of_source[src], src  # a FAISS kNN-LM side: the scan axis


def test_the_base_lm_is_under_trained_where_training_it_further_helped(tmp_path):
    """'Converged' is what was measured: a base LM whose own training stopped on a plateau is still under-trained
    when the LMs trained on from it (App. E.6.1's) lower its best valid perplexity by more than its convergence
    tolerance; the updates past the base LM add up along a chain of init_from."""
    import json

    from knnlm.experiments.findings import base_lm_undertrained, headroom
    from knnlm.job import Job

    def training(name, valid, **kw):
        p = tmp_path / name / "training.json"
        p.parent.mkdir()
        p.write_text(json.dumps({"valid": [[i, v] for i, v in enumerate(valid)], "updates": 1300, "tolerance": 0.01,
                                 "converged": "yes", **kw}))
        return str(p)

    base = training("base", [80.0, 64.5, 64.4], updates=6500)
    two, four = training("overfit-2ep", [60.5]), training("overfit-4ep", [59.2])
    job = Job(cfg={"headroom_init_from": {"overfit-2ep": "base", "overfit-4ep": "overfit-2ep"}},
              input={"lm_training": [base], "headroom": [two, four]})
    change, who, best = headroom(job)
    assert change == pytest.approx(59.2 / 64.4 - 1) and who == "overfit-4ep: 2,600 more updates" and best == 64.4
    def under(j):  # the rule as the findings apply it, on the headroom they read once
        return base_lm_undertrained(j, headroom(j))

    assert under(job).startswith("training it further lowered its best valid perplexity by 8.1 %")
    flat = training("flat", [64.2])  # −0.3 %: within the 1 % tolerance, converged
    assert under(Job(cfg={}, input={"lm_training": [base], "headroom": [flat]})) == ""
    falling = training("falling", [90.0, 70.0], converged="no (valid loss still falling)")
    assert under(Job(cfg={}, input={"lm_training": [falling]})).startswith("its valid perplexity")
    assert under(Job(cfg={}, input={})) == ""


def test_the_engine_has_no_branch_on_a_source_name():
    """What differs per source (its store, where its τ* rows are, its number format, its target, equal rows) is data
    of the claims table ('sources'): no comparison in the engine's code holds a claim's source against a name, and
    every source the table describes is one the engine builds."""
    import ast

    tree = ast.parse(Path(findings.__file__).read_text(encoding="utf-8"))

    def is_source(node):  # c["source"] (or any ...["source"])
        return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "source"

    def names(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return True
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names(e) for e in node.elts)

    branches = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(is_source(x) for x in [n.left, *n.comparators]) and any(names(x) for x in [n.left, *n.comparators])]
    assert not branches, branches
    doc = yaml.safe_load(findings.CLAIMS_FILE.read_text())
    built = set(doc["regime_of_source"])  # every source the engine builds has its regime axes
    assert set(findings.SOURCES) <= built and {c["source"] for c in CLAIMS} <= built
    assert set(findings.CONTRAST_SOURCES) == {"tuning", "small_tuning", "gaps", "small_gaps", "size_gaps"}
    for src, p in findings.SOURCES.items():
        assert (p.get("tau_star") or {}).get("table", "table1") in built, src
