"""The kNN-LM as an lm-evaluation-harness model (knnlm.harness): at λ = 0 its log-likelihoods are the harness's own
Hugging Face model's, at λ > 0 its rolling log-likelihood is KNNLM.score's, and a small local task runs on it
through the harness, its accuracy recomputed from the model's log-likelihoods."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("lm_eval")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from lm_eval.api.instance import Instance  # noqa: E402

CONTEXTS = [("The tower was built in", " 1890 ."), ("It was rebuilt after the", " war ."),
            ("The game", " began in the north"), ("", "The first line of the text")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, wikitext2_dir):
    """A tiny random GPT-2 (tests/hf_tiny.py) with a datastore of its att keys over 300 WikiText-2 train lines (exact
    mask, k = 8), saved as a bundle (KNNLM.save_pretrained): (bundle dir, model dir)."""
    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM

    d = tmp_path_factory.mktemp("harness")
    model = make_tiny_hf(d / "model", wikitext2_dir / "wiki.train.tokens", "gpt2")
    lm = HuggingFaceLM(str(model))
    first = KNNLM(lm, np.zeros((8, lm.dim), np.float16), np.zeros(8, np.int32), key="att", metric="l2", k=8,
                  temperature=1.0, lam=0.3, mask="exact", context_window=16, max_tokens=512)
    lines = (wikitext2_dir / "wiki.train.tokens").read_text(encoding="utf-8").splitlines(keepends=True)[:300]
    first.build_datastore("".join(lines), d / "ds", threads=1)
    knn = KNNLM.from_datastore(lm, d / "ds", mask="exact", k=8, lam=0.3, temperature=1.0, context_window=16,
                               max_tokens=512)
    return knn.save_pretrained(d / "bundle"), model


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_at_lambda_0_the_harness_hf_model_gives_the_same_log_likelihoods(bundle):
    from lm_eval.models.huggingface import HFLM

    from knnlm.harness import HarnessKNNLM

    path, model = bundle
    ours = HarnessKNNLM(bundle=str(path), lam=0.0)
    hf = HFLM(pretrained=str(model), backend="causal", batch_size=1, device="cpu", max_length=ours.max_length)
    assert hf.prefix_token_id == ours.prefix_token_id
    got = ours.loglikelihood(_requests("loglikelihood", CONTEXTS))
    want = hf.loglikelihood(_requests("loglikelihood", CONTEXTS))
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=1e-5, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]
    text = ["The tower was built in 1890 . It was rebuilt after the war .\n"]
    np.testing.assert_allclose(ours.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in text])),
                               hf.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in text])),
                               rtol=1e-5, atol=1e-4)


def test_rolling_log_likelihood_is_the_knn_lm_score(bundle):
    """λ = 0.3: a text shorter than one window is one window from the start token, as KNNLM.score scores it, and the
    kNN component moves it (so the test checks the interpolation, not the LM alone)."""
    from knnlm.api import KNNLM
    from knnlm.harness import HarnessKNNLM

    path, _ = bundle
    ours = HarnessKNNLM(bundle=str(path))
    knn = KNNLM.from_pretrained(path)
    assert ours.knn.lam == knn.lam == 0.3
    text = "The tower was built in 1890 . It was rebuilt after the war .\n"
    scored = knn.score(text)
    assert list(scored.targets) == ours.tok_encode(text)
    got = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", [(text,)]))[0]
    assert got == pytest.approx(float(scored.lp.sum()), rel=1e-6)
    assert abs(got - float(scored.lp_lm.sum())) > 1e-3


def test_generate_until_is_greedy_and_stops(bundle):
    """Every generated token is the argmax of the interpolated distribution after the tokens before it (up to float
    noise between one forward per step and one over the whole sequence), and generation stops at 'until'."""
    from knnlm.harness import HarnessKNNLM

    path, _ = bundle
    ours = HarnessKNNLM(bundle=str(path))
    ctx = ours.tok_encode("The tower was built in")
    new, text = ours.greedy(ctx, 6, [])
    assert len(new) == 6 and text == ours.knn.lm.decode(new)
    lp = ours.log_probs(ctx + new[:-1], len(new))
    assert (lp[np.arange(len(new)), new] >= lp.max(1) - 1e-6).all()
    cut = ours.knn.lm.decode(new[:2])
    stop = text[len(cut):len(cut) + 1] or text[-1:]
    _, upto = ours.greedy(ctx, 6, [stop])
    assert stop not in upto and text.startswith(upto)
    req = _requests("generate_until", [("The tower was built in", {"until": [stop], "max_gen_toks": 6})])
    assert ours.generate_until(req) == [upto]
    with pytest.raises(ValueError, match="greedy"):
        ours.generate_until(_requests("generate_until", [("x", {"do_sample": True})]))
    with pytest.raises(ValueError, match="unknown"):
        HarnessKNNLM(bundle=str(path), lamda=0.1)


def _tiny_task(folder, docs):
    """A multiple-choice task 'knnlm_tiny_mc' of `docs` ({'question', 'choices', 'answer'}) in folder (its YAML and a
    JSON lines file), for the harness's include_path."""
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "tiny_mc.yaml").write_text(
        "task: knnlm_tiny_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")


def test_a_local_task_runs_through_the_harness(bundle, tmp_path):
    """A 4-question multiple-choice task from a local JSON file, run by lm_eval.simple_evaluate on the registered
    'knnlm' model: its accuracy is the share of questions whose answer has the highest log-likelihood by the
    model's own loglikelihood."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from knnlm.harness import HarnessKNNLM

    path, _ = bundle
    docs = [{"question": "The tower was built in", "choices": [" 1890 .", " the war .", " the north ."], "answer": 0},
            {"question": "It was rebuilt after the", "choices": [" war .", " tower .", " 1890 ."], "answer": 0},
            {"question": "The game began in the", "choices": [" north .", " war .", " tower ."], "answer": 0},
            {"question": "The first line of the", "choices": [" text .", " game .", " war ."], "answer": 0}]
    _tiny_task(tmp_path, docs)
    model = HarnessKNNLM(bundle=str(path))
    res = lm_eval.simple_evaluate(model=model, tasks=["knnlm_tiny_mc"],
                                  task_manager=TaskManager(include_path=str(tmp_path)), num_fewshot=0)
    acc = res["results"]["knnlm_tiny_mc"]["acc,none"]
    by_hand = np.mean([np.argmax([ll for ll, _ in model.loglikelihood(
        _requests("loglikelihood", [(d["question"], c) for c in d["choices"]]))]) == d["answer"] for d in docs])
    assert acc == pytest.approx(by_hand)


def test_the_harness_command_line_runs_the_model_by_its_entry_point(bundle, tmp_path):
    """`knnlm-lm-eval` (the package's console script: lm-eval's command line with the 'knnlm' model registered) runs
    a local task on a bundle by name; lm-eval's own `lm_eval` does not know the name (lm-eval 0.4.13 reads no model
    plugins), which is why the script exists."""
    import subprocess
    import sys
    from pathlib import Path

    path, _ = bundle
    _tiny_task(tmp_path, [{"question": "The tower was built in", "choices": [" 1890 .", " the war ."], "answer": 0},
                          {"question": "It was rebuilt after the", "choices": [" war .", " tower ."], "answer": 0}])
    bin_dir = Path(sys.executable).parent
    args = ["--model", "knnlm", "--model_args", f"bundle={path}", "--tasks", "knnlm_tiny_mc", "--include_path",
            str(tmp_path)]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([str(bin_dir / "knnlm-lm-eval"), *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "knnlm_tiny_mc" in r.stdout and "acc" in r.stdout, r.stdout[-2000:]
    r = subprocess.run([str(bin_dir / "lm_eval"), *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode != 0 and "knnlm" in (r.stdout + r.stderr)
