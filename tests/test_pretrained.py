"""The LMs shipped under pretrained/ (knnlm.lm.shipped): each loads, matches its sha256 and reproduces the valid
perplexity its model card records on a slice; a corrupt checkpoint, a file that is not a fairseq LM and an LM trained
with another dictionary fail before any work with an error naming the config key and the file; config 'pretrained'
replaces the training of the LMs it holds, and --config pretrained=null trains them again."""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import SNAKEMAKE
from knnlm.config import PROJECT_ROOT
from knnlm.io import ArtifactError, sha256_file
from knnlm.paths import PretrainedLayout

SHIPPED = sorted(PretrainedLayout(p.parent).path("model_card", lm=p.name)
                 for p in (PROJECT_ROOT / "pretrained").glob("*/*/") if p.name != "bpe")


@pytest.mark.parametrize("card_path", SHIPPED, ids=[f"{p.parent.parent.name}/{p.parent.name}" for p in SHIPPED])
def test_shipped_lm_loads_matches_its_card_and_reproduces_its_perplexity(card_path):
    from knnlm.lm.fairseq import check_checkpoint
    from knnlm.lm.shipped import slice_perplexity

    card = json.loads(card_path.read_text())
    shipped = PretrainedLayout(card_path.parent.parent)
    ckpt = shipped.path("checkpoint", lm=card_path.parent.name)
    assert check_checkpoint(ckpt, "test") == card and sha256_file(ckpt) == card["sha256"]
    assert sha256_file(shipped.path("dictionary")) == card["dict_sha256"]
    assert sha256_file(shipped.path("bpe_model")) == card["bpe_sha256"]
    state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    assert state["last_optimizer_state"] is None and state["optimizer_history"][-1]["num_updates"] == card["checkpoint_update"]
    # weights of this LM only: a soft-label LM's teacher (saved in its criterion's state) ships as its own LM
    assert not any(k.startswith("teacher.") for k in (state.get("criterion") or {}))
    assert card["checkpoint_update"] <= card["updates"]
    got = slice_perplexity(ckpt, shipped.root, PROJECT_ROOT / card["config"], card["valid_slice"]["lines"])
    assert got["tokens"] == card["valid_slice"]["tokens"]
    assert got["ppl_token"] == pytest.approx(card["valid_slice"]["ppl_token"], rel=1e-4)
    if card["train"].get("checkpoint") == "last":  # trained further by a set number of updates (App. E.6.1)
        assert card["checkpoint_update"] == card["updates"] and card["converged"] in ("yes", "no (valid loss still falling)")
    else:
        assert card["converged"] == "yes", f"{card_path}: shipped LMs are trained to a plateau"


def test_all_shipped_lms_are_small():
    total = sum(p.stat().st_size for p in (PROJECT_ROOT / "pretrained").rglob("*") if p.is_file())
    assert total < 80e6, f"pretrained/ holds {total / 1e6:.1f} MB; the repository ships at most 80 MB of LMs"


def test_bad_checkpoints_fail_naming_the_key_and_the_file(tmp_path):
    from knnlm.lm.fairseq import check_checkpoint, check_dictionary, load_fairseq_lm

    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.zeros(3)}}, good)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(ArtifactError, match=r"config key 'lms.base.path': .*corrupt.pt.* not a torch checkpoint"):
        check_checkpoint(corrupt, "lms.base.path")
    with pytest.raises(ArtifactError, match=r"config key 'lms.base.path': .*missing.pt does not exist"):
        check_checkpoint(tmp_path / "missing.pt", "lms.base.path")
    # a torch file that is not a fairseq LM: a clear error, never a raw unpickling traceback
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.txt").write_text("a 1\n")
    with pytest.raises(ArtifactError, match=r"config key 'lms.base.path': .*good.pt is not a fairseq LM"):
        load_fairseq_lm(good, tmp_path / "bin", "lms.base.path")
    # a card whose sha256 or dictionary differ
    card = {"sha256": "0" * 64, "dict_sha256": "1" * 64}
    (tmp_path / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ArtifactError, match=r"does not match the sha256 of its model card"):
        check_checkpoint(good, "pretrained")
    with pytest.raises(ArtifactError, match=r"config key 'pretrained': .*good.pt was trained with another dictionary"):
        check_dictionary(good, tmp_path / "bin" / "dict.txt", "pretrained")


def test_pretrained_job_refuses_an_lm_trained_with_another_config(tmp_path):
    from knnlm.job import Job
    from knnlm.experiments.spine import pretrained_lm

    ckpt = tmp_path / "lm" / "checkpoint.pt"
    ckpt.parent.mkdir()
    torch.save({"model": {}}, ckpt)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.txt").write_text("a 1\n")
    card = {"sha256": sha256_file(ckpt), "dict_sha256": sha256_file(tmp_path / "bin" / "dict.txt"),
            "lm": {"decoder_layers": 4, "lr": 0.002}, "train": {}, "updates": 10, "valid": {"ppl_token": 9.0},
            "test": {"ppl_token": 9.0}}
    (ckpt.parent / "model_card.json").write_text(json.dumps(card))
    (ckpt.parent / "training.json").write_text(json.dumps({"converged": "yes"}))
    job = Job(cfg={"lm": {"decoder_layers": 4, "lr": 0.001}}, wildcards={"lm": "base"}, rule="pretrained_lm",
              input={"checkpoint": str(ckpt), "card": str(ckpt.parent / "model_card.json"),
                     "training": str(ckpt.parent / "training.json"), "data_bin": str(tmp_path / "bin")},
              output={"checkpoint": str(tmp_path / "out" / "checkpoint.pt"),
                      "training": str(tmp_path / "out" / "training.json")})
    with pytest.raises(ArtifactError, match=r"trained with another config .*\['lr'\].*pretrained=null"):
        pretrained_lm(job)
    assert not (tmp_path / "out" / "checkpoint.pt").exists()
    job.cfg["lm"]["lr"] = 0.002
    out = pretrained_lm(job)
    assert sha256_file(tmp_path / "out" / "checkpoint.pt") == card["sha256"] and out["params"]["converged"] == "yes"


@pytest.mark.dag  # runs Snakemake (a dry run of the DAG)
def test_config_pretrained_replaces_training_and_null_retrains(tmp_path):
    """configs/wikitext2.yaml takes every LM shipped under its 'pretrained' folder instead of training it (rule
    pretrained_lm) and the BPE model with them; --config pretrained=null trains every LM again."""
    def jobs(*extra):
        r = subprocess.run(SNAKEMAKE + ["all", "-n", "--forceall", "-s", "workflow/Snakefile", "--configfile",
                                        "configs/wikitext2.yaml", "--config", f"results_dir={tmp_path}", *extra],
                           cwd=PROJECT_ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout

    shipped = sorted(p.parent.name for p in (PROJECT_ROOT / "pretrained" / "wikitext2").glob("*/checkpoint.pt"))
    out = jobs()
    for lm in shipped:
        assert f"lms/{lm}/checkpoint.pt" in out
    assert out.count("rule pretrained_lm:") == len(shipped)
    retrain = jobs("pretrained=null")
    assert "rule pretrained_lm:" not in retrain and retrain.count("rule train_lm:") >= max(1, len(shipped))
