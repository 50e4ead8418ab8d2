"""The report's cost model for the other CPU kind (knnlm.report.cost): GEMM work counted from a run's artifacts, and
each stage's estimate, against numbers worked by hand."""
import json

import numpy as np
import pandas as pd
import pytest

from knnlm.report import cost


def test_cpu_kind_from_model_names():
    assert cost.cpu_kind("Intel(R) Xeon(R) Processor") == "intel"
    assert cost.cpu_kind("AMD EPYC 7B13 64-Core Processor") == "amd"
    assert cost.cpu_kind("Apple M2") is None


def test_reference_rates_are_measured_for_both_kinds():
    assert set(cost.REFERENCE_RATES) == set(cost.EXACT_RATES) == {"intel", "amd"}
    assert all(r["gflops"] > 50 for r in cost.REFERENCE_RATES.values()) and min(cost.EXACT_RATES.values()) > 50


def test_parametric_flops_by_hand():
    # W_ds (nv1): R = V rows of D; 1,000 trained tokens fwd + bwd, 3 evaluations of 10 valid tokens, 1 scored stage
    # of 20 tokens: 1,000 · 4RD + (30 + 20) · 2RD
    nv1 = {"spec": {"kind": "nv", "n": 1}, "info": {"rows": 8}, "history": {"train_tokens": 1000, "evals": 3},
           "stages": {"trained": {}}}
    assert cost.parametric_flops(nv1, dim=4, vocab=8, valid_tokens=10, scored_tokens=20) == 1000 * 4 * 8 * 4 + 50 * 2 * 8 * 4
    # MoS R = 2: per token 2 · 2 · (V + D) · D forward; W_sm trained too doubles the backward
    mos = {"spec": {"kind": "mos", "mixtures": 2, "train_embed": True}, "info": {"mixtures": 2},
           "history": {"train_tokens": 10, "evals": 0}, "stages": {"trained": {}}}
    fwd = 2 * 2 * (8 + 4) * 4
    assert cost.parametric_flops(mos, dim=4, vocab=8, valid_tokens=10, scored_tokens=5) == 10 * 3 * fwd + 5 * fwd
    mos["spec"]["train_embed"] = False
    assert cost.parametric_flops(mos, dim=4, vocab=8, valid_tokens=10, scored_tokens=5) == 10 * 2 * fwd + 5 * fwd
    # a clustered datastore scored before and after fine-tuning, never trained
    cl = {"spec": {"kind": "cluster", "m": 1}, "info": {"rows": 8}, "stages": {"before": {}, "after": {}}}
    assert cost.parametric_flops(cl, dim=4, vocab=8, valid_tokens=10, scored_tokens=20) == 2 * 20 * 2 * 8 * 4


def _meta(path, flop, seconds, cpu, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"flop": flop, "seconds": seconds, "machine": {"cpu": cpu}, **extra}))


def test_exact_work_counts_each_scan_once(tmp_path):
    cpu = "Intel(R) Xeon(R) Processor"
    lm = tmp_path / "lms" / "base" / "stores"
    _meta(lm / "full" / "exact" / "att_l2_test.json", 100.0, 5.0, cpu)
    _meta(lm / "trainsubset" / "exact" / "att_l2_test.json", 100.0, 4.0, cpu)  # another search of the same size
    for store in ("r0.05", "r0.2", "r1.0"):  # one nested scan: every size's meta carries its flops and seconds
        _meta(lm / store / "exact" / "att_l2_valid.json", 40.0, 2.0, cpu)
    _meta(lm / "r0.05" / "exact" / "att_l2_test.json", 40.0, 2.0, cpu)
    (lm / "full" / "exact" / "notes.json").write_text("{}")
    total, seconds, cpus = cost.exact_work(tmp_path)
    assert total == 100 + 100 + 40 + 40 and seconds == 5 + 4 + 2 + 2 and cpus == {cpu}
    assert cost.exact_flops(tmp_path) == (total, cpus)


def test_other_kind_estimate_by_hand(tmp_path):
    stages = pd.DataFrame([{"stage": "exact search and real score", "wall (min)": 10.0},
                           {"stage": "parametric alternatives", "wall (min)": 2.0},
                           {"stage": "IVFPQ (stores, indexes, FAISS search)", "wall (min)": 5.0},
                           {"stage": "total", "wall (min)": 17.0}])
    # exact: 60 TFLOP that took 480 s of the stage's 600 s here, at 100 GFLOP/s there: 120 + 600 s; parametric: 60
    # TFLOP would take 300 s of its 120 s here (capped at the stage's time), so 0 + 600 s at 100; IVFPQ: the same
    work = {"exact search and real score": (60e12, 480.0, 100.0), "parametric alternatives": (60e12, 300.0, 100.0)}
    t = cost.other_kind_table(stages, work, "intel").set_index("stage")
    est = t["estimate on amd (min)"]
    assert est["exact search and real score"] == pytest.approx(12.0)
    assert est["parametric alternatives"] == pytest.approx(10.0)
    assert est["IVFPQ (stores, indexes, FAISS search)"] == pytest.approx(5.0)
    assert est["total"] == pytest.approx(27.0) and t.loc["total", "measured here (min)"] == pytest.approx(17.0)
    assert t.loc["exact search and real score", "GEMM share here"] == "80 %"
    with pytest.raises(ValueError, match="CPU kind"):
        cost.other_kind_table(stages, work, "arm")
    with pytest.raises(ValueError, match="rates must be > 0"):
        cost.other_kind_table(stages, {"parametric alternatives": (1.0, 1.0, 0.0)}, "intel")
    # stage_work: the exact searches' seconds with the other kind's exact rate, the parametric GEMM at the rate here
    _meta(tmp_path / "lms" / "base" / "stores" / "full" / "exact" / "att_l2_test.json", 6e12, 40.0,
          "Intel(R) Xeon(R) Processor")
    work, cpus = cost.stage_work(tmp_path, 200.0, "intel")
    assert work["exact search and real score"] == (6e12, 40.0, cost.EXACT_RATES["amd"])
    assert work["parametric alternatives"] == (0.0, 0.0, cost.REFERENCE_RATES["amd"]["gflops"])
    with pytest.raises(ValueError, match="rates must be > 0"):
        cost.stage_work(tmp_path, 0.0, "intel")


def test_run_parametric_flops_reads_the_run(tmp_path):
    lm = tmp_path / "lms" / "base"
    (lm / "datastore").mkdir(parents=True)
    (lm / "datastore" / "manifest.json").write_text(json.dumps({"split": "train", "D": 4, "N": 100,
                                                                "key_types": ["att"]}))
    (lm / "parametric" / "nv1_att").mkdir(parents=True)
    np.savez(lm / "parametric" / "word_stats.npz", freq=np.zeros(8), loss=np.zeros(8))
    for split, t in (("valid", 30), ("test", 20)):
        (lm / "queries" / split).mkdir(parents=True)
        (lm / "queries" / split / "manifest.json").write_text(json.dumps({"split": split, "T": t, "D": 4}))
    result = {"spec": {"kind": "nv", "n": 1}, "info": {"rows": 8}, "history": {"train_tokens": 1000, "evals": 3},
              "stages": {"trained": {}}, "valid_tokens": 10}
    (lm / "parametric" / "nv1_att" / "result.json").write_text(json.dumps(result))
    assert cost.run_parametric_flops(tmp_path) == cost.parametric_flops(result, 4, 8, 10, 50)
    del result["valid_tokens"]  # a result without its evaluation size: the given one, else all of valid
    (lm / "parametric" / "nv1_att" / "result.json").write_text(json.dumps(result))
    assert cost.run_parametric_flops(tmp_path, 7) == cost.parametric_flops(result, 4, 8, 7, 50)
    assert cost.run_parametric_flops(tmp_path) == cost.parametric_flops(result, 4, 8, 30, 50)


def test_gemm_rate_is_the_flops_of_the_product_over_its_best_time(monkeypatch):
    """2·m·d·n flops over the fastest of the timed products (a clock that advances 0.5 s, then 0.25 s, per product),
    and the product it times is the real one (its output equals numpy's)."""
    import itertools

    from knnlm.search import exact

    ticks = itertools.chain([0.0, 0.5, 0.5, 0.75, 0.75, 1.5], itertools.repeat(1.5))
    monkeypatch.setattr(cost.time, "perf_counter", lambda: next(ticks))
    seen = []
    real = exact.cpu_matmul
    monkeypatch.setattr(exact, "cpu_matmul", lambda a, b, out: (real(a, b, out), seen.append((a, b, out.copy()))))
    m, d, n = 8, 5, 16
    rate = cost.gemm_rate(threads=1, repeats=3, shape=(m, d, n))
    assert rate == pytest.approx(2.0 * m * d * n / 0.25 / 1e9)  # the best of 0.5, 0.25 and 0.75 s
    assert len(seen) == 4  # a warm-up and the 3 timed products
    a, b, out = seen[-1]
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
