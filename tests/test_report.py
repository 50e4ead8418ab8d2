"""knnlm.report's budgets (issue 10 §4): which jobs count against the main tables' run-time target."""
import pandas as pd
import pytest

from knnlm.report import EXTRA_BUDGETS, MAIN_BUDGET, budget_shares, stage_shares


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
