"""The regime map (knnlm.experiments.regime): its effects table, and the tiny run's 'regime' target against a
recomputation from the settings JSONs it reads."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from knnlm.experiments import regime
from knnlm.experiments.findings import REGIME


def test_effects_of_the_claims_table_are_complete():
    ids = [e["id"] for e in regime.EFFECTS]
    assert len(ids) == len(set(ids)) >= 8
    for e in regime.EFFECTS:
        assert e["words"] and e["kind"] in ("ratio", "share")
        if isinstance(e.get("paper"), list):
            assert e["paper_value"] == pytest.approx(e["paper"][0] / e["paper"][1] - 1)
    gain = next(e for e in regime.EFFECTS if e["id"] == "knn_gain")
    assert gain["paper_value"] == pytest.approx(19.174 / 21.75 - 1)


@pytest.mark.parametrize("entry,message", [
    ({"id": "x", "name": "n", "a": "base", "b": "base", "words": "w", "paper": [1, 2], "colour": 1},
     "key 'regime_effects.0': Additional properties are not allowed ('colour' was unexpected)"),
    ({"id": "x", "name": "n", "a": "base", "words": "w", "paper": [1, 2]}, "key 'regime_effects.0': 'b' is a required property"),
    ({"id": "x", "name": "n", "a": "base", "b": "base", "words": "w"}, "key 'regime_effects.0': expected "),
    ({"id": "x", "name": "n", "a": "base", "b": "base", "words": "w", "paper": [1, 2], "kind": "odds"},
     "key 'regime_effects.0.kind': expected enum ['ratio', 'share'], found 'odds'"),
])
def test_a_bad_effect_is_refused_naming_the_file(tmp_path, entry, message):
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": [], "regime_effects": [entry]}))
    with pytest.raises(ValueError) as e:
        regime.load_effects(p)
    assert str(p) in str(e.value) and message in str(e.value)


def test_setting_names_add_tau_star_to_the_knn_sides_only():
    e = {"a": "faiss_mask_faiss_score", "b": "base"}
    assert regime.setting_names(e, "tuned", "ffn/l2") == ("ffn/l2:faiss_mask_faiss_score τ*", "ffn/l2:base")
    assert regime.setting_names({"a": "att/ip:x", "b": "y"}, "1", "ffn/l2") == ("att/ip:x", "ffn/l2:y")


def test_effect_statistics_match_their_definition():
    """A ratio is ppl_a / ppl_b at every point (log scale), a share (ppl_base − ppl_a) / (ppl_base − ppl_b) (linear),
    picked from stacked's point-major order, for 2 points of 3 settings each."""
    names = ["att/l2:base", "att/l2:x", "ffn/l2:x"]
    p = np.array([[20.0, 18.0, 19.0, 30.0, 24.0, 27.0]])  # point 0: base 20, att 18, ffn 19; point 1: 30, 24, 27
    fn, scale = regime.effect_statistic("ratio", 2, names, "ffn/l2:x", "att/l2:x")
    assert scale == "log" and np.allclose(fn(p), [[19 / 18, 27 / 24]])
    fn, scale = regime.effect_statistic("share", 2, names, "ffn/l2:x", "att/l2:x")
    assert scale == "linear" and np.allclose(fn(p), [[(20 - 19) / (20 - 18), (30 - 27) / (30 - 24)]])


def _ppl(s, split, setting):
    return math.exp(sum(s["doc_nll"][split][setting]) / sum(s["doc_words"][split]))


def test_tiny_regime_slopes_match_a_refit_from_the_settings(tiny_run):
    root = tiny_run["root"]
    cfg = yaml.safe_load(Path("configs/tiny.yaml").read_text())
    k = cfg["knn"]["k"]
    out = json.loads((root / "lms" / "base" / "tables" / "regime_trends.json").read_text())
    rows = {(r["axis"], r["effect"], r["temperature"], r["split"]): r for r in out["trends"]}
    # every effect on every axis has a test row: a trend, or why not (the variants this config leaves out)
    variants = {f"{k}/{m}" for k, m in [(cfg["regime"]["key_type"], cfg["regime"]["metric"])] + cfg["regime"]["variants"]}
    for e in regime.EFFECTS:
        for axis in regime.AXES:
            for t in e["temperatures"]:
                r = rows[(axis, e["id"], regime.TEMPERATURES[t], "test")]
                named = {s.rpartition(":")[0] for s in (e["a"], e["b"]) if ":" in s}
                if not named <= variants:
                    assert r["trend"].startswith("not run (variants") and "slope" not in r, r
    import pandas as pd

    pts = pd.read_csv(root / "lms" / "base" / "tables" / "regime_lm.csv")
    lms = list(dict.fromkeys(pts["point"]))
    assert len(lms) >= 2
    # the kNN-LM's gain at τ = 1 along the LM axis, recomputed from each LM's full-store settings JSON
    main = f"{cfg['regime']['key_type']}_{cfg['regime']['metric']}"
    ss = [json.loads((root / "lms" / n / "stores" / "full" / "settings" / f"{main}.json").read_text()) for n in lms]
    ppl_lm = np.array([_ppl(s, "test", "base") for s in ss])
    effect = np.array([_ppl(s, "test", "faiss_mask_faiss_score") / _ppl(s, "test", "base") - 1 for s in ss])
    x = -np.log(ppl_lm)  # the LM axis grows toward the paper's regime as the perplexity falls
    slope = np.polyfit(x, effect, 1)[0]
    r = rows[("lm", "knn_gain", "τ = 1", "test")]
    assert r["slope"]["value"] == pytest.approx(slope, rel=1e-9)
    assert r["slope"]["lo"] < r["slope"]["value"] < r["slope"]["hi"]
    assert r["orientation"] == "axis falls"
    near = int(np.argmin(np.abs(np.log(ppl_lm) - math.log(REGIME["lm"]["paper"]))))
    assert r["nearest point"] == lms[near]
    g = pts[(pts["effect"] == "knn_gain") & (pts["temperature"] == "τ = 1") & (pts["split"] == "test")]
    got = dict(zip(g["point"], g["effect (%)"]))
    for n, v in zip(lms, effect):
        assert got[n] == pytest.approx(100 * v, rel=1e-6)
    # the verdict follows the slope's interval and the paper's side of the nearest point
    if r["slope"]["lo"] > 0 or r["slope"]["hi"] < 0:
        gap = r["paper's value (%)"] / 100 - effect[near]
        assert r["trend"] in (("toward" if np.sign(gap) == np.sign(slope) else "away"),) or \
            r["trend"].startswith("inconclusive")
    else:
        assert r["trend"] == "flat" or r["trend"].startswith("inconclusive")


def test_tiny_regime_axes_grow_with_their_settings(tiny_run):
    tables = tiny_run["root"] / "lms" / "base" / "tables"
    import pandas as pd

    store = pd.read_csv(tables / "regime_store.csv")
    store = store[(store["split"] == "test") & (store["effect"] == "knn_gain") & (store["temperature"] == "τ = 1")]
    assert len(store) >= 2 and store["axis value"].is_monotonic_increasing  # subsets in ratio order: rows / entry
    scan = pd.read_csv(tables / "regime_scan.csv")
    scan = scan[(scan["split"] == "test") & (scan["effect"] == "knn_gain") & (scan["temperature"] == "τ = 1")]
    assert len(scan) >= 2 and scan["axis value"].is_monotonic_increasing  # nprobe ascending: keys scanned / k
    assert scan["recall@k"].between(0, 1).all() and scan["recall@k"].iloc[-1] > scan["recall@k"].iloc[0]
    # the findings rows an effect follows, each beside its trends: one row per findings row of those claims
    found = json.loads((tiny_run["root"] / "lms" / "base" / "findings.json").read_text())["rows"]
    followed = {c for e in regime.EFFECTS for c in e["claims"]}
    beside = pd.read_csv(tiny_run["root"] / "lms" / "base" / "findings_regime.csv")
    assert len(beside) == sum(r["claim id"] in followed for r in found) > 0
    assert set(beside["verdict"]) <= {r["verdict"] for r in found}
    gain = next(e for e in regime.EFFECTS if e["id"] == "knn_gain")["claims"]  # measured on every axis of the run
    assert beside[beside["claim id"].isin(gain)][f"trend: {REGIME['lm']['name']}"].str.match(
        r"(toward|away|flat|inconclusive)").all()
    assert beside[f"trend: {REGIME['lm']['name']}"].str.match(r"(toward|away|flat|inconclusive|not run)").all()
    figs = tiny_run["root"] / "lms" / "base" / "figures"
    for e in regime.EFFECTS:
        assert (figs / f"regime_{e['id']}.png").stat().st_size > 1000


def _trend(axis, effect, temperature, trend, lo, hi):
    return {"axis": axis, "effect": effect, "temperature": temperature, "split": "test", "trend": trend,
            "reaches": "no", "withheld": "", "nearest point": "p", "factor to the paper's regime": "×7.4",
            "slope": {"value": (lo + hi) / 2, "lo": lo, "hi": hi}}


def test_findings_beside_trends_pick_the_rows_temperature_and_count_by_trend(tmp_path):
    """Each findings row an effect follows gets that effect's trend at the row's own temperature (τ* where its
    comparison names τ*), on every axis; the summary counts verdict × trend per axis; an effect naming a claim the
    findings have no row of is refused, naming the file."""
    from knnlm.io import ArtifactError, write_json
    from knnlm.job import Job

    gain = next(e for e in regime.EFFECTS if e["id"] == "knn_gain")
    c1, c6 = gain["claims"][:2]
    rows = [{"claim id": c1, "section": "s", "claim": "c", "comparison (a vs b)": "att/L2 vs base",
             "ours (test, 95% CI)": "-1 %", "verdict": "reproduced"},
            {"claim id": c6, "section": "s", "claim": "c", "comparison (a vs b)": "att/L2 τ* vs base",
             "ours (test, 95% CI)": "-2 %", "verdict": "contradicted (its sign: reproduced)"}]
    others = [c for e in regime.EFFECTS if e["id"] != "knn_gain" for c in e["claims"]]
    rows += [{"claim id": c, "section": "s", "claim": "c", "comparison (a vs b)": "x vs y",
              "ours (test, 95% CI)": "0", "verdict": "not run"} for c in others]
    trends = [_trend("lm", "knn_gain", "τ = 1", "toward", 0.01, 0.03), _trend("lm", "knn_gain", "τ*", "away", -0.03, -0.01),
              {"axis": "scan", "split": "test", "trend": "not run (1 point(s) of config 'regime'; a trend needs 2)"}]
    write_json(tmp_path / "rows.json", {"rows": rows, "summary": {}})
    write_json(tmp_path / "trends.json", {"trends": trends, "effects": []})
    job = Job(input={"findings_rows": str(tmp_path / "rows.json"), "trends": str(tmp_path / "trends.json")},
              output={"csv": str(tmp_path / "f.csv"), "md": str(tmp_path / "f.md")}, cfg={"name": "t"})
    regime.findings_trends(job)
    import pandas as pd

    t = pd.read_csv(tmp_path / "f.csv").set_index("claim id")
    lm = f"trend: {REGIME['lm']['name']}"
    assert t.loc[c1, lm].startswith("toward: slope +2.00 pp/e-fold [+1.00, +3.00]")
    assert t.loc[c6, lm].startswith("away: slope -2.00")
    assert t.loc[c1, f"trend: {REGIME['scan']['name']}"].startswith("not run (1 point")
    text = (tmp_path / "f.md").read_text()
    summary = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.split("Summary:")[1].split("\n\n")[1]
               .splitlines()[2:]]
    counts = {(a, v, t): int(n) for a, v, t, n in summary}
    assert counts[(REGIME["lm"]["name"], "reproduced", "toward")] == 1
    assert counts[(REGIME["lm"]["name"], "contradicted", "away")] == 1
    assert counts[(REGIME["scan"]["name"], "not run", "not run")] == len(others)
    write_json(tmp_path / "rows.json", {"rows": rows[1:], "summary": {}})
    with pytest.raises(ArtifactError, match=f"rows.json.*knn_gain.*{c1}"):
        regime.findings_trends(job)


def test_faiss_only_settings_equal_the_full_settings_faiss_setting(tiny_run, tmp_path):
    """Rule settings_faiss (the regime map's key and metric variants) is the settings job without the exact search and
    the real score: on the tiny run's full store its FAISS mask + FAISS score equals the full settings JSON's (per-
    document NLL, τ*, λ), it has no other setting, and its recall is not claimed."""
    import json
    import re
    import shlex

    from conftest import run_snakemake
    from knnlm.experiments.retrieval import settings
    from knnlm.job import Job

    full = tiny_run["root"] / "lms" / "base" / "stores" / "full" / "settings" / "ffn_l2.json"
    r = run_snakemake("-n", "-p", "-f", str(full), "--configfile", *tiny_run["configfiles"], "--config",
                      f"results_dir={tiny_run['results_dir']}")
    command = shlex.split(re.search(r"python -m knnlm retrieval\.settings (.*?) >", r.stdout).group(1))
    cfg, io = (json.loads(command[command.index(flag) + 1]) for flag in ("--cfg", "--io"))
    inputs = {n: v for n, v in io["input"].items() if n not in ("real_dists", "exact_ids", "exact_dists", "exact_meta")}
    out = tmp_path / "ffn_l2_faiss.json"
    settings(Job(cfg=cfg, input=inputs, output={"out": str(out)}, wildcards=io["wildcards"], rule="settings_faiss"))
    got, want = json.loads(out.read_text()), json.loads(full.read_text())
    ff = "faiss_mask_faiss_score"
    assert set(got["settings"]) == set(got["tuned"]) == {ff} and got["recall"] == {"valid": None, "test": None}
    for split in ("valid", "test"):
        for name in (ff, ff + " τ*", "base"):
            np.testing.assert_allclose(got["doc_nll"][split][name], want["doc_nll"][split][name], rtol=1e-12)
    assert got["tuned"][ff]["tau"] == want["tuned"][ff]["tau"] and got["settings"][ff]["lambda"] == \
        want["settings"][ff]["lambda"]
    assert got["scan"] == want["scan"] and got["doc_ids"] == want["doc_ids"]
