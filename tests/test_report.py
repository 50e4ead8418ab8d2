"""knnlm.report.times's budgets: which jobs count against the main tables' run-time target."""
import pandas as pd
import pytest

from knnlm.report.times import EXTRA_BUDGETS, MAIN_BUDGET, budget_shares, stage_shares


def test_budget_shares_split_the_main_tables_from_the_extras():
    jobs = {  # benchmark file stems as the rules write them (knnlm.paths: <rule>_<wildcards>), wall seconds
        "bpe": 60, "train_lm_base": 600, "train_lm_small": 300, "dump_datastore_small": 30, "write_table4": 6,
        "build_index_base_full_att_l2": 120, "search_base_r0.05-alltokens_att_l2_test": 60,
        "exact_search_nested_base_att_l2_valid": 240, "train_parametric_base_nv1_att": 900, "write_findings_base": 3,
        "build_index_base_pca64_att_l2": 90, "exact_search_base_pca128_ffn_l2_test": 45,
        "build_index_base_full-ivf2_att_l2": 80, "settings_base_r0.05-draw3_att_l2": 20,
        "write_store_table_base_variance": 4, "write_store_table_base_pca": 5, "write_table3_small_base": 2,
    }
    df = pd.DataFrame({"job": list(jobs), "wall_s": [float(s) for s in jobs.values()], "peak_rss_mb": 100.0})
    b = budget_shares(df).set_index("budget")
    assert b.loc[MAIN_BUDGET, "wall (min)"] * 60 == pytest.approx(60 + 600 + 120 + 60 + 240 + 900 + 3 + 2)
    assert b.loc[EXTRA_BUDGETS["lm"], "jobs"] == 3 and b.loc[EXTRA_BUDGETS["pca"], "jobs"] == 3
    assert b.loc[EXTRA_BUDGETS["variance"], "wall (min)"] * 60 == pytest.approx(80 + 20 + 4)
    assert b.loc["total", "wall (min)"] == pytest.approx(stage_shares(df)["wall (min)"].iloc[-1])
    assert b["wall (min)"].iloc[:-1].sum() == pytest.approx(b.loc["total", "wall (min)"])


def _fairseq_lines(records):
    """fairseq --log-format json lines: one record per (num_updates, wall), with fairseq's prefix."""
    import json

    return ["2020-01-01 | INFO | train_inner | " + json.dumps({"epoch": 1, "num_updates": str(u), "wall": str(w)}) + "\n"
            for u, w in records] + ["2020-01-01 | INFO | not a record {oops\n"]


def test_fairseq_log_seconds_counts_each_update_once_across_resumes():
    from knnlm.lm.training import fairseq_log_seconds

    one = [(25, 100), (50, 200), (75, 300)]
    assert fairseq_log_seconds(_fairseq_lines(one)) == (300.0, 300.0, 1)
    # killed at 75 before any checkpoint (restarts at 25), then killed at 125 and resumed from the checkpoint at 100
    runs = one + [(25, 90), (50, 190), (75, 290), (100, 390), (125, 490)] + [(125, 50), (150, 150)]
    once, every, segments = fairseq_log_seconds(_fairseq_lines(runs))
    assert segments == 3 and every == 300 + 490 + 150
    assert once == 300 + (390 - 290) + (490 - 390) + (150 - 50)  # updates 25-75 once, 100-125 once, then 150
    assert fairseq_log_seconds(["no json here\n"]) == (0.0, 0.0, 0)


def test_stage_table_times_resumed_training_from_its_logs(tmp_path):
    """A resumed job's benchmark file times only its last segment; the report takes the training logs' total."""
    import json

    from knnlm.report.times import stage_table

    root = tmp_path / "run"
    (root / "benchmarks").mkdir(parents=True)
    (root / "logs").mkdir()
    header = "s\th:m:s\tmax_rss\n"
    for job, s in [("train_lm_base", 120.0), ("train_parametric_base_nv1_att", 50.0), ("bpe", 7.0)]:
        (root / "benchmarks" / f"{job}.tsv").write_text(header + f"{s}\t0:00:{s:.0f}\t100\n")
    resumed = [(25, 100), (50, 200), (50, 30), (75, 130)]  # resumed at update 50: 200 s, then 100 s more
    (root / "logs" / "train_lm_base.fairseq.log").write_text("".join(_fairseq_lines(resumed)))
    par = root / "lms" / "base" / "parametric" / "nv1_att"
    par.mkdir(parents=True)
    (par / "result.json").write_text(json.dumps({"history": {"seconds": 80.0}}))
    t = stage_table(root).set_index("job")
    assert t.loc["train_lm_base", "wall_s"] == 300.0 and t.loc["train_lm_base", "from_log"]
    assert t.loc["train_parametric_base_nv1_att", "wall_s"] == 80.0 and t.loc["bpe", "wall_s"] == 7.0
    assert not t.loc["bpe", "from_log"]


def test_busy_seconds_is_the_union_of_the_jobs_intervals(tmp_path):
    """busy_seconds: jobs ending at 100 (10 s), 105 (20 s: overlaps the first), 200 (5 s) and 198 (2 s: inside the
    third) are busy over [85, 105] and [195, 200]: 25 s, where their wall times sum to 37 s."""
    import os

    from knnlm.report.times import busy_seconds

    (tmp_path / "benchmarks").mkdir()
    assert busy_seconds(tmp_path) == 0.0
    for name, s, end in [("a", 10.0, 100), ("b", 20.0, 105), ("c", 5.0, 200), ("d", 2.0, 198)]:
        p = tmp_path / "benchmarks" / f"{name}.tsv"
        p.write_text(f"s\th:m:s\tmax_rss\n{s}\t0:00:00\t1\n")
        os.utime(p, (end, end))
    assert busy_seconds(tmp_path) == pytest.approx(25.0)


def test_base_lm_convergence_from_its_valid_curve():
    """knnlm.lm.training.convergence: an LM whose last valid evaluation is its best and gained >= 1 % perplexity is
    under-trained; one whose curve flattened (or rose) converged; a resumed log's repeated evaluations count once;
    the caption sentence says which."""
    from knnlm.lm.training import convergence, convergence_label

    falling = {"valid_loss": [(500, 7.0), (1000, 6.5), (1500, 6.3), (1500, 6.3), (2000, 6.2)],
               "train_loss": [(2000, 6.0), (2010, 5.9)]}
    t = convergence(falling, 2010)
    assert t["still_falling"] and t["converged"] == "no (valid loss still falling)" and t["evaluations"] == 4
    assert t["best_update"] == 2000 and t["updates"] == 2010 and t["last_gain"] == pytest.approx(2 ** -0.1 - 1)
    assert "under-trained" in convergence_label(t) and "2,010 of 2,010 updates" in convergence_label(t)
    flat = convergence({"valid_loss": [(500, 7.0), (1000, 6.5), (1500, 6.499)]}, 1500)
    assert not flat["still_falling"] and flat["converged"] == "yes" and "converged" in convergence_label(flat)
    rising = convergence({"valid_loss": [(500, 7.0), (1000, 6.5), (1500, 6.6)]}, 1500)
    assert rising["converged"] == "yes" and rising["best_update"] == 1000
    assert convergence({"valid_loss": [(500, 7.0)]}, 500)["converged"] == "unknown (one evaluation)"
    # fairseq's extra validation at max_update, 50 updates after the last epoch's: the gain is measured over the
    # evaluation before (a still falling curve is not called converged by two nearly equal points)
    end = convergence({"valid_loss": [(645, 7.0), (1290, 6.5), (1935, 6.3), (2580, 6.2), (2630, 6.2)]}, 2630)
    assert end["last_gain"] == pytest.approx(2 ** (6.2 - 6.3) - 1) and end["converged"] == "no (valid loss still falling)"
    with pytest.raises(ValueError, match="no valid evaluation"):
        convergence({"train_loss": [(1, 9.0)]}, 1)
    assert "not trained by this run" in convergence_label(None)
    assert convergence_label(t, who="LM overfit").startswith("LM overfit: 2,010 of 2,010 updates")


def test_fairseq_log_epoch_average_is_the_last_training_loss():
    """A run shorter than one log interval logs its training loss only in the epoch's average ('train_loss' with
    'train_num_updates' at the epoch's end): the curve keeps it apart from the interval records and
    convergence's 'train_loss_last' and 'updates' read it."""
    from knnlm.lm.training import convergence, parse_fairseq_json_log

    lines = ['2026-01-01 00:00:00 | INFO | train_inner | {"epoch": 1, "loss": "8.729", "num_updates": "25", "wps": "9"}',
             '2026-01-01 00:00:01 | INFO | valid | {"epoch": 1, "valid_loss": "7.785", "valid_num_updates": "40"}',
             '2026-01-01 00:00:01 | INFO | train | {"epoch": 1, "train_loss": "8.416", "train_num_updates": "40"}']
    curves = parse_fairseq_json_log(lines)
    assert curves["train_loss"] == [(25, 8.729)] and curves["train_loss_epoch"] == [(40, 8.416)]
    t = convergence(curves, 40)
    assert t["train_loss_last"] == 8.416 and t["updates"] == 40
    only_epoch = convergence(parse_fairseq_json_log(lines[1:]), 40)
    assert only_epoch["train_loss_last"] == 8.416


def test_target_of_splits_all_from_the_extras_and_the_followups():
    """Each job counts against the target that needs it: the follow-ups' jobs against 'followups', our seeds, draws
    and probe counts against 'extras', everything else (Table 4's LMs and the PCA store included) against 'all'."""
    from knnlm.report.budget import target_of
    from knnlm.report.times import rule_of

    want = {"bpe": "all", "train_lm_small": "all", "write_table4": "all", "build_index_base_pca64_att_l2": "all",
            "exact_search_base_full-alltokens_att_l2_test": "all", "write_findings_base": "all",
            "build_index_base_full-ivf2_att_l2": "extras", "settings_base_r0.05-draw2_att_l2": "extras",
            "search_base_full-np256_att_l2_test": "extras", "write_store_table_base_variance": "extras",
            "write_probe_sweep_base": "extras", "write_retomaton_base": "followups",
            "datastore_neighbours_base_full_att_l2": "followups", "write_pruning_base": "followups",
            "write_generation_base": "followups", "write_regime_base": "regime"}
    assert {j: target_of(j, rule_of(j)) for j in want} == want
    # a job that an invocation of 'regime' alone ran is the map's cost beyond 'all', whatever its name says
    assert target_of("search_base_full-np1024_att_l2_test", "search", regime_only=True) == "regime"
    assert target_of("search_big_full_att_l2_test", "search", regime_only=True) == "regime"


def test_regime_only_jobs_are_those_an_invocation_of_regime_alone_ran(tmp_path):
    """A job counts against 'regime' when its benchmark file was written inside the span of an invocation whose
    targets are only 'regime'; one of 'all regime' together leaves its jobs to 'all'; the lines count them apart."""
    import json
    import os

    from knnlm.report.budget import regime_only_jobs, target_lines
    from knnlm.report.times import rule_of

    root = tmp_path / "run"
    (root / "invocations").mkdir(parents=True)
    (root / "benchmarks").mkdir()
    for name, targets, a, b in (("x", ["all"], 1000.0, 2000.0), ("y", ["regime"], 3000.0, 4000.0),
                                ("z", ["all", "regime"], 5000.0, 6000.0)):
        (root / "invocations" / f"{name}.invocation.json").write_text(json.dumps(
            {"targets": targets, "local": True, "start": {"time": a}, "end": {"time": b}}))
    walls = {"bpe": 60, "search_big_full_att_l2_test": 120, "write_regime_base": 30, "search_mid_full_att_l2_test": 90}
    for job, end in zip(walls, (1500.0, 3500.0, 3600.0, 5500.0)):
        (root / "benchmarks" / f"{job}.tsv").write_text("s\n1\n")
        os.utime(root / "benchmarks" / f"{job}.tsv", (end, end))
    jobs = _budget_jobs(walls)
    assert regime_only_jobs(root, jobs) == {"search_big_full_att_l2_test", "write_regime_base"}
    budgets = {"all": {"intel": 100, "amd": 150}, "regime": {"intel": None, "amd": 60}}
    t = target_lines(jobs, {}, lambda j: "other", rule_of, "amd", budgets, False,
                     regime_jobs=regime_only_jobs(root, jobs)).set_index("target")
    assert t.loc["regime", "jobs"] == 2 and t.loc["regime", "measured on amd (min)"] == pytest.approx(2.5)
    assert t.loc["all", "jobs"] == 2 and t.loc["regime", "outcome"] == "pass"
    assert regime_only_jobs(tmp_path / "none", jobs) == set()


def _budget_jobs(walls):
    return pd.DataFrame({"job": list(walls), "wall_s": [float(s) for s in walls.values()], "peak_rss_mb": 1.0,
                         "from_log": False})


def test_target_lines_check_each_budget_here_and_there():
    """The measured minutes per target against the budget of this CPU kind, the estimate (each stage scaled by its
    factor) against the other kind's; a contended run passes nothing; a target without jobs is 'not run'."""
    from knnlm.report.budget import target_lines
    from knnlm.report.times import rule_of

    jobs = _budget_jobs({"exact_search_base_full_att_l2_test": 60 * 60, "bpe": 30 * 60 - 1, "write_findings_base": 1,
                         "write_retomaton_base": 10 * 60, "build_index_base_full-ivf2_att_l2": 5 * 60})
    stage = {"exact_search_base_full_att_l2_test": "exact"}.get
    budgets = {"all": {"intel": 100, "amd": 150}, "extras": {"intel": None, "amd": 45},
               "followups": {"intel": None, "amd": 45}}
    t = target_lines(jobs, {"exact": 2.0}, lambda j: stage(j, "other"), rule_of, "intel", budgets, False).set_index("target")
    assert t.loc["all", "measured on intel (min)"] == pytest.approx(90)
    assert t.loc["all", "estimate on amd (min)"] == pytest.approx(150)  # 60 · 2 + 30
    assert t.loc["all", "outcome"] == "pass" and t.loc["all", "jobs"] == 3
    assert t.loc["extras", "measured on intel (min)"] == pytest.approx(15) and t.loc["extras", "jobs"] == 2
    assert t.loc["followups", "measured on intel (min)"] == pytest.approx(10)
    budgets["all"]["amd"] = 149
    t = target_lines(jobs, {"exact": 2.0}, lambda j: stage(j, "other"), rule_of, "intel", budgets, False).set_index("target")
    assert t.loc["all", "outcome"] == "FAIL" and t.loc["extras", "outcome"] == "pass"
    t = target_lines(jobs.iloc[:2], {}, lambda j: "other", rule_of, "amd", budgets, True).set_index("target")
    assert t.loc["all", "outcome"] == "contended (no verdict)" and t.loc["extras", "outcome"] == "not run"
    t = target_lines(jobs, {}, lambda j: "other", rule_of, "amd", budgets, False, measured=False).set_index("target")
    assert t.loc["all", "outcome"] == "unmeasured (no verdict)"
    unfinished = jobs[jobs["job"] != "write_findings_base"]
    t = target_lines(unfinished, {}, lambda j: "other", rule_of, "amd", budgets, False).set_index("target")
    assert t.loc["all", "outcome"] == "incomplete (no verdict)"  # no findings job: 'all' did not finish


def test_contention_compares_the_run_with_the_machine(tmp_path):
    """other_share = 1 − the run's CPU time / the machine's busy CPU time over the finished local invocations;
    above 10 % the run is contended; killed (no end reading) and cluster invocations are counted apart."""
    import json

    from knnlm.report.budget import contention, machine_cpu_seconds, own_cpu_seconds

    assert machine_cpu_seconds() > 0 and own_cpu_seconds() > 0
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 20 900 40 1 2 3 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n")
    import os
    assert machine_cpu_seconds(str(stat)) == pytest.approx((100 + 5 + 20 + 1 + 2 + 3) / os.sysconf("SC_CLK_TCK"))
    root = tmp_path / "run"
    (root / "invocations").mkdir(parents=True)

    def rec(name, machine, own, end=True, local=True):
        r = {"local": local, "start": {"machine_cpu_s": 1000.0, "own_cpu_s": 5.0, "time": 1000.0},
             "end": {"machine_cpu_s": 1000.0 + machine, "own_cpu_s": 5.0 + own, "time": 2000.0} if end else None}
        (root / "invocations" / f"{name}.invocation.json").write_text(json.dumps(r))

    rec("a", 100.0, 95.0)
    rec("b", 100.0, 93.0)
    c = contention(root)
    assert c["invocations"] == 2 and c["other_share"] == pytest.approx(0.06) and not c["contended"]
    rec("c", 100.0, 70.0)
    rec("d", 500.0, 0.0, end=False)
    rec("e", 500.0, 0.0, local=False)
    c = contention(root)
    assert c["other_share"] == pytest.approx(42 / 300) and c["contended"] and c["unmeasured"] == 2
    assert contention(tmp_path / "none")["other_share"] is None
    # the jobs whose benchmark file was written inside a measured invocation's span count as covered
    (root / "benchmarks").mkdir()
    for job, end in (("bpe", 1500.0), ("dump_datastore_base", 1e9)):
        (root / "benchmarks" / f"{job}.tsv").write_text("s\n1\n")
        os.utime(root / "benchmarks" / f"{job}.tsv", (end, end))
    c = contention(root, _budget_jobs({"bpe": 30, "dump_datastore_base": 90}))
    assert c["covered"] == pytest.approx(0.25)


def test_an_invocation_record_reads_the_machine_at_start_and_end(tmp_path):
    """invocation_start writes the targets, budgets and first reading; invocation_end the second and the outcome;
    budgets_of reads the latest record's budgets over the schema's defaults."""
    from knnlm.io import read_json
    from knnlm.report.budget import budgets_of, invocation_end, invocation_start

    root = tmp_path / "run"
    assert budgets_of(root)["all"] == {"intel": 120, "amd": 150}
    p = invocation_start(root, ["all"], {"all": {"intel": 90}})
    assert p.parent == root / "invocations" and read_json(p)["end"] is None
    sum(i * i for i in range(200000))  # some CPU time of this process
    invocation_end(p, ok=True)
    r = read_json(p)
    assert r["ok"] and r["targets"] == ["all"] and r["end"]["own_cpu_s"] > r["start"]["own_cpu_s"]
    assert r["end"]["machine_cpu_s"] >= r["start"]["machine_cpu_s"]
    assert budgets_of(root)["all"] == {"intel": 90, "amd": 150}
