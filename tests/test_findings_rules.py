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
    assert all(r["verdict"] != "not run (" for r in found["rows"])
