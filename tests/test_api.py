"""The Python API (knnlm.api): scoring equals the pipeline's Table 1, p_kNN over the vocabulary, generation through
a Hugging Face LogitsProcessor, a datastore from other text, and the README's example as written."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import PROJECT_ROOT, TINY_HF


def overrides(tiny_run) -> dict:
    """The tiny run's config overlays (data, extra LMs) and results_dir, as from_run's `overrides`."""
    out = {"results_dir": str(tiny_run["results_dir"])}
    for f in tiny_run["configfiles"][1:]:
        out.update(yaml.safe_load(Path(f).read_text()))
    return out


@pytest.fixture(scope="module")
def knn_of(tiny_run):
    from knnlm.api import KNNLM

    made = {}

    def get(lm="base", key="att", metric="l2", **kw):
        name = (lm, key, metric, tuple(sorted(kw.items())))
        if name not in made:
            made[name] = KNNLM.from_run("configs/tiny.yaml", lm=lm, key=key, metric=metric,
                                        overrides=overrides(tiny_run), **kw)
        return made[name]

    return get


def test_readme_python_example_runs_as_written(tiny_run, tmp_path):
    """The README's 'Use it from Python' block, run verbatim in a folder where configs/ is the project's and
    results/ the tiny run's: Table 1's numbers, a bundle saved, loaded and verified, then tuned and compared as
    Table 1."""
    import pandas as pd

    readme = (PROJECT_ROOT / "README.md").read_text()
    sec = readme.split("## Use it from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", sec, re.S).group(1)
    (tmp_path / "configs").symlink_to(PROJECT_ROOT / "configs")
    (tmp_path / "results").symlink_to(tiny_run["results_dir"])
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = json.loads((tiny_run["root"] / "lms/base/stores/full/scores/att_l2.json").read_text())
    assert f"{ref['test']['interp']['ppl_word']:.2f}" in r.stdout
    assert "True ['att']" in r.stdout  # the bundle: the same settings, its keys this LM's att states
    cmp = pd.read_csv(tiny_run["root"] / "lms/base/tables/table1_comparisons.csv").set_index(["split", "comparison"])
    assert f"{ref['tuned']['temperature']} {{'comparison': 'kNN-LM att/L2 vs base', 'relative difference': " in r.stdout
    assert f"'verdict': '{cmp.loc[('test', 'att/L2 τ* vs base'), 'verdict']}'" in r.stdout  # tune + compare: Table 1's


@pytest.mark.parametrize("lm", ["base", TINY_HF])
@pytest.mark.parametrize("tuned", [False, True])
def test_score_equals_table1(knn_of, tiny_run, lm, tuned):
    """score() over the test split: the base LM's per-token log-probs of the dump, and Table 1's interpolated
    perplexity (config τ and its λ; or τ*, λ*), per word and per token. On the dumped queries the numbers are Table
    1's to rounding; score() recomputes the queries, whose last bits may differ from the dump's (another process's
    GEMM blocking), which may swap a near-tied neighbour of a few tokens: those tokens are counted, few, and each has
    a query that differs from its dumped one."""
    from knnlm.api import text_lines
    from knnlm.scoring.interpolation import interpolate

    knn = knn_of(lm, tuned=tuned)
    root = tiny_run["root"]
    out = knn.score((root / "data/test.tokens").read_text(encoding="utf-8"))
    dumped = np.load(root / f"lms/{lm}/queries/test/lm_logprobs.npy")
    np.testing.assert_array_equal(out.targets, np.load(root / f"lms/{lm}/queries/test/targets.npy"))
    np.testing.assert_allclose(out.lp_lm, dumped, atol=1e-4)
    ref = json.loads((root / f"lms/{lm}/stores/full/scores/att_l2.json").read_text())
    row = ref["tuned"] if tuned else ref
    assert out.settings["temperature"] == row["temperature"] and out.settings["lambda"] == row["lambda"]
    lam = row["lambda"]  # Eq. 5 by hand from the two components: the interpolation score() reports
    with np.errstate(divide="ignore"):
        lp = np.log((1 - lam) * np.exp(out.lp_lm) + lam * np.exp(out.lp_knn))
    assert out.ppl_word == pytest.approx(np.exp(-lp.sum() / out.words), rel=1e-9)
    assert out.ppl_token == pytest.approx(np.exp(-lp.mean()), rel=1e-9)
    # the dumped queries through the API's search and interpolation: Table 1's numbers
    q = np.load(root / f"lms/{lm}/queries/test/queries_att.npy").astype(np.float32)
    lp_knn = knn.knn_log_prob(q, out.targets)
    lp_dump = interpolate(dumped.astype(np.float64), lp_knn, lam)
    assert np.exp(-lp_dump.sum() / out.words) == pytest.approx(row["test"]["interp"]["ppl_word"], rel=1e-5)
    assert np.exp(-lp_dump.mean()) == pytest.approx(row["test"]["interp"]["ppl_token"], rel=1e-5)
    assert out.lm_ppl_word == pytest.approx(ref["test"]["lm"]["ppl_word"], rel=1e-5)
    # score()'s own queries: where its p_kNN differs from the dumped queries', the query differs too, for few tokens
    with np.errstate(invalid="ignore"):
        moved = ~np.isclose(out.lp_knn, lp_knn, rtol=0, atol=1e-5) & ~(np.isneginf(out.lp_knn) & np.isneginf(lp_knn))
    again = knn.lm_pass(knn.lm.encode(text_lines((root / "data/test.tokens").read_text(encoding="utf-8"))))["keys"]
    assert not (moved & (again == q).all(1)).any()
    assert moved.sum() <= max(3, 0.001 * len(q))


def test_exact_mask_is_the_exact_search(knn_of, tiny_run):
    """mask='exact' retrieves the pipeline's exact neighbours (Table 3's real mask, over the retrieval scope) of the
    dumped test queries."""
    knn = knn_of("base", "ffn", "ip", mask="exact")
    root = tiny_run["root"]
    scope = np.load(root / "lms/base/queries/test/scope.npy")[:300]
    q = np.load(root / "lms/base/queries/test/queries_ffn.npy")[scope]
    ids, dists = knn.neighbours(q)
    want = np.load(root / "lms/base/stores/full/exact/ffn_ip_test_ids.npy")[:300]
    want_d = np.load(root / "lms/base/stores/full/exact/ffn_ip_test_dists.npy")[:300, :10]
    # the same top 10; two neighbours whose scores are within fp32 rounding of each other (a product of another shape,
    # 300 queries here, may round otherwise) may come in either order
    np.testing.assert_allclose(dists[:, :10], want_d, rtol=1e-5)
    near = np.isclose(want_d[:, 1:], want_d[:, :-1], rtol=1e-6, atol=0)
    tied = np.zeros(want_d.shape, dtype=bool)
    tied[:, 1:] |= near
    tied[:, :-1] |= near
    np.testing.assert_array_equal(ids[:, :10][~tied], want[:, :10][~tied])
    brute = q @ np.asarray(knn.keys, dtype=np.float32).T
    np.testing.assert_allclose(dists[:, 0], brute.max(1), rtol=1e-4)


def test_knn_distribution_over_the_vocabulary(knn_of, tiny_run):
    """p_kNN scattered over the vocabulary sums to 1 and equals knn_log_prob at every target (Eq. 5's M)."""
    knn = knn_of("base")
    root = tiny_run["root"]
    q = np.load(root / "lms/base/queries/test/queries_att.npy")[:200]
    t = np.load(root / "lms/base/queries/test/targets.npy")[:200]
    full = knn.knn_distribution(q)
    assert full.shape == (200, knn.lm.vocab_size)
    np.testing.assert_allclose(full.sum(1), 1.0, rtol=1e-9)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(np.log(full[np.arange(200), t]), knn.knn_log_prob(q, t), rtol=1e-9)
    v = knn.lm.vocab_size
    mixed = knn.mix(np.log(np.full((1, v), 1.0 / v)), full[:1])
    ref = json.loads((root / "lms/base/stores/full/scores/att_l2.json").read_text())["lambda"]  # Table 1's λ
    assert 0 < knn.lam == ref < 1
    np.testing.assert_allclose(np.exp(mixed[0]), (1 - ref) / v + ref * full[0], rtol=1e-12)  # Eq. 5, by hand


def test_logits_processor_equals_scoring(knn_of):
    """The Hugging Face LogitsProcessor gives the scoring path's log-probability of every next token of a text, and
    model.generate with it (greedy) continues as KNNLM.generate does."""
    import torch
    from transformers import LogitsProcessorList

    knn = knn_of(TINY_HF)
    text = "The tower was built in 1890 and rebuilt after the war .\n"
    scored = knn.score(text)
    stream = np.concatenate([[knn.lm.start], scored.targets])
    proc = knn.logits_processor()
    try:
        model = knn.lm.model
        with torch.no_grad():
            for j in (0, 3, len(scored.targets) - 1):
                x = torch.as_tensor(stream[:j + 1])[None]
                logits = model(input_ids=x).logits[:, -1]
                lp = proc(x, logits)[0, scored.targets[j]].item()
                assert lp == pytest.approx(scored.lp[j], rel=1e-5, abs=1e-6)
        prompt = "The tower was"
        ids = torch.as_tensor(np.concatenate([[knn.lm.start], knn.lm.encode_prompt(prompt)]))[None]
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             logits_processor=LogitsProcessorList([proc]), pad_token_id=knn.lm.start)
    finally:
        proc.close()
    assert knn.lm.decode(gen[0, ids.shape[1]:]) == knn.generate(prompt, max_new_tokens=6)


def test_generate_cli(tiny_run, knn_of, tmp_path):
    """python -m knnlm.generate continues a prompt from a run's kNN-LM (Table 1's τ and λ) and prints the prompt and
    the continuation KNNLM.generate gives, and the settings it used."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(overrides(tiny_run)))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "knnlm.generate", "--config", "configs/tiny.yaml", "--config",
                        str(overlay), "--prompt", "The tower was", "--max-new-tokens", "5"],
                       cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    knn = knn_of()
    s = knn.settings()
    assert r.stdout.rstrip("\n") == knn.lm.decode(list(knn.lm.encode_prompt("The tower was")) +
                                                  knn.generate_ids(knn.lm.encode_prompt("The tower was"), 5))
    assert f"kNN-LM base att/l2: k={s['k']} τ={s['temperature']:g} λ={s['lambda']:.2f} mask=faiss" in r.stderr
    # within the window the LM decodes incrementally: the same tokens as a greedy loop over whole-window passes
    prompt, ref = [int(i) for i in knn.lm.encode_prompt("The tower was")], []
    for _ in range(8):
        ref.append(int(np.argmax(knn.next_token_log_probs(prompt + ref))))
    assert knn.generate_ids(prompt, 8) == ref


def test_build_datastore_from_other_text(knn_of, tiny_run, tmp_path):
    """A datastore dumped from other text (here: the test split) has one key per token, the tokens as vals, the
    keys of the scoring pass, and an index whose nearest neighbour of each of those keys is the key itself."""
    knn = knn_of("base", "att", "l2")
    text = (tiny_run["root"] / "data/test.tokens").read_text(encoding="utf-8")
    own = knn.build_datastore(text, tmp_path / "ds", threads=1)
    man = json.loads((tmp_path / "ds/manifest.json").read_text())
    run = knn.lm_pass(knn.lm.encode(text.splitlines(keepends=True)))
    assert man["N"] == len(run["targets"]) and man["key_types"] == ["att", "ffn"]
    np.testing.assert_array_equal(own.vals, run["targets"])
    np.testing.assert_allclose(np.asarray(own.keys, dtype=np.float32), run["keys"], rtol=1e-2, atol=1e-2)
    exact = type(own)(own.lm, own.keys, own.vals, key="att", metric="l2", k=own.k, temperature=1.0, lam=0.5,
                      mask="exact", context_window=own.context_window)
    ids, dists = exact.neighbours(np.asarray(own.keys[:100], dtype=np.float32))
    assert (dists[:, 0] <= 1e-3).all()
    scored = own.score(text)  # the text's own tokens are in the datastore: p_kNN is far higher than from train
    assert scored.ppl_token < knn.score(text).ppl_token


def test_pyproject_declares_every_import():
    """`pip install .` brings what the package imports: every third-party module imported under src/knnlm is a
    declared dependency or extra (fairseq excepted: it is installed with --no-deps, as pyproject.toml says)."""
    import ast
    import tomllib

    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    declared = {re.split(r"[<>=!~ []", d)[0].lower() for d in deps}
    dist_of = {"yaml": "pyyaml", "sklearn": "scikit-learn", "faiss": "faiss-cpu", "huggingface_hub": "huggingface-hub",
               "snakemake_executor_plugin_slurm": "snakemake-executor-plugin-slurm", "hydra": "hydra-core",
               "lm_eval": "lm-eval"}
    imported = set()
    for f in (PROJECT_ROOT / "src/knnlm").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third = {m for m in imported if m not in sys.stdlib_module_names and m not in ("knnlm", "fairseq", "fairseq_cli", "__future__")}
    missing = sorted(m for m in third if dist_of.get(m, m).lower() not in declared)
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"


def test_the_api_installs_and_imports_without_the_pipeline():
    """`pip install knnlm` is the API: Snakemake, its SLURM plugin and MLflow are the 'pipeline' extra, and the API's
    modules import with them absent (imports of them blocked in a fresh interpreter)."""
    import tomllib

    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~ ]", d)[0].lower() for d in project["dependencies"]}
    pipeline = {re.split(r"[<>=!~ ]", d)[0].lower() for d in project["optional-dependencies"]["pipeline"]}
    assert pipeline == {"snakemake", "snakemake-executor-plugin-slurm", "mlflow"} and not core & pipeline
    code = ("import importlib.abc, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('snakemake', 'snakemake_executor_plugin_slurm', 'mlflow'):\n"
            "            raise ImportError(f'blocked: {name}')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import knnlm, knnlm.api, knnlm.bundle, knnlm.score, knnlm.generate\n"
            "from knnlm import KNNLM\n"
            "print('ok', KNNLM.__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")},
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok KNNLM", r.stderr[-2000:]


@pytest.fixture(scope="module")
def word_level_adaptive_lm(tmp_path_factory, wikitext2_dir):
    """A word-level fairseq LM with an adaptive softmax (the layout of urvashik/knnlm's WikiText-103 checkpoint: its
    own word dictionary, no BPE), 1 layer of 16 dims trained 3 updates on 300 WikiText-2 lines."""
    d = tmp_path_factory.mktemp("wordlm")
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        lines = (wikitext2_dir / f"wiki.{split}.tokens").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
        (d / f"{split}.txt").write_text("".join(lines), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--trainpref", str(d / "train.txt"),
                    "--validpref", str(d / "valid.txt"), "--testpref", str(d / "test.txt"), "--destdir",
                    str(d / "bin"), "--workers", "1"], check=True, capture_output=True, env=env)
    subprocess.run([sys.executable, "-m", "fairseq_cli.train", str(d / "bin"), "--task", "language_modeling",
                    "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
                    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--decoder-normalize-before",
                    "--decoder-input-dim", "16", "--decoder-output-dim", "16",
                    "--adaptive-softmax-cutoff", "200,800", "--criterion", "adaptive_loss", "--optimizer", "adam",
                    "--lr", "0.01", "--tokens-per-sample", "48", "--sample-break-mode", "none", "--max-tokens", "512",
                    "--max-update", "3", "--save-dir", str(d / "ckpt"), "--no-epoch-checkpoints", "--cpu",
                    "--num-workers", "0", "--seed", "1", "--ddp-backend", "legacy_ddp"], check=True, capture_output=True,
                   env=env)
    return d


def test_word_level_adaptive_softmax_lm(word_level_adaptive_lm, tmp_path):
    """A word-level fairseq LM with an adaptive softmax scores text as fairseq's own pass over its binarised split
    does, its next-token distribution sums to 1, and it gets a datastore and a kNN-LM."""
    from knnlm.lm.fairseq import FairseqLM
    from knnlm.api import KNNLM
    from knnlm.lm.fairseq import fairseq_pass

    d = word_level_adaptive_lm
    lm = FairseqLM(d / "ckpt/checkpoint_last.pt", d / "bin", None)
    assert lm.model.decoder.adaptive_softmax is not None
    ref = np.concatenate([b["lp"].numpy() for b in fairseq_pass(d / "ckpt/checkpoint_last.pt", d / "bin", 16,
                                                                 512).states("test", True)])
    text = (d / "test.txt").read_text(encoding="utf-8")
    knn = KNNLM.from_datastore(lm, _datastore_of(lm, d, tmp_path), k=8, lam=0.0, context_window=16, max_tokens=512)
    out = knn.score(text)
    np.testing.assert_allclose(out.lp_lm, ref, atol=1e-4)
    np.testing.assert_allclose(out.lp, out.lp_lm)  # λ = 0
    assert np.exp(knn.next_token_log_probs(lm.encode_prompt("The game"))).sum() == pytest.approx(1.0, rel=1e-5)
    assert lm.decode(lm.encode_prompt("The game began")) == "The game began"


def test_adaptive_softmax_declared_in_the_config(word_level_adaptive_lm):
    """A dump checks config 'lms.<lm>.adaptive_softmax' against the checkpoint: a mismatch names the key."""
    from knnlm.lm.fairseq import fairseq_pass
    from knnlm.io import ArtifactError

    d = word_level_adaptive_lm
    with pytest.raises(ArtifactError, match="lms.base.adaptive_softmax': .* has adaptive softmax, the config says False"):
        fairseq_pass(d / "ckpt/checkpoint_last.pt", d / "bin", 16, 512, key="lms.base", adaptive_softmax=False)
    assert fairseq_pass(d / "ckpt/checkpoint_last.pt", d / "bin", 16, 512, key="lms.base", adaptive_softmax=True).d == 16


def test_word_level_splits(tmp_path):
    """bpe.type 'none': each line's whitespace words, one output line per input line, tokens = words + lines."""
    from knnlm.data import encode_words

    (tmp_path / "a.txt").write_text(" = Title = \n\n the  cat sat \n")
    stats = encode_words(tmp_path / "a.txt", tmp_path / "a.bpe")
    assert (tmp_path / "a.bpe").read_text() == "= Title =\n\nthe cat sat\n"
    assert stats == {"lines": 3, "tokens": 6 + 3}


def _datastore_of(lm, d, tmp_path):
    from knnlm.api import KNNLM

    first = KNNLM(lm, np.zeros((8, lm.dim), np.float16), np.zeros(8, np.int32), key="ffn", metric="l2", k=8,
                  temperature=1.0, lam=0.5, mask="exact", context_window=16, max_tokens=512)
    first.build_datastore((d / "train.txt").read_text(encoding="utf-8"), tmp_path / "ds", threads=1)
    return tmp_path / "ds"


@pytest.mark.parametrize("layout", ["knn-transformers", "urvashik"])
def test_import_memmap_datastore(tmp_path, layout):
    """Headerless memmaps of the knn-transformers and urvashik/knnlm layouts become this layout's keys, vals and
    manifest, row for row; a wrong size or an overflowed val is refused naming the file."""
    from knnlm.datastore.dump import open_datastore
    from knnlm.datastore.importer import import_memmap
    from knnlm.io import ArtifactError

    rng = np.random.default_rng(0)
    n, dim = 1000, 24
    keys = rng.standard_normal((n, dim)).astype(np.float16 if layout == "knn-transformers" else np.float32)
    vals = rng.integers(0, 30000, (n, 1)).astype(np.int32 if layout == "knn-transformers" else np.int16)
    stem = f"dstore_gpt2_{n}_{dim}" if layout == "knn-transformers" else "wt103"
    kf, vf = tmp_path / f"{stem}_keys.npy", tmp_path / f"{stem}_vals.npy"
    keys.tofile(kf)
    vals.tofile(vf)
    # the windows in each tool's names: knn-transformers' block and stride, fairseq-eval-lm's tokens and context
    opts = {"block_size": 1024, "stride": 512} if layout == "knn-transformers" else {
        "size": n, "dim": dim, "keys_dtype": "float32", "vals_dtype": "int16", "tokens_per_sample": 3072,
        "context_window": 2560}
    man = import_memmap(kf, vf, tmp_path / "out", chunk=300, **opts)
    assert (man["tokens_per_sample"], man["context_window"]) == ((1024, 512) if layout == "knn-transformers"
                                                                 else (3072, 2560))
    no_windows = {k: v for k, v in opts.items() if k not in ("block_size", "stride", "tokens_per_sample",
                                                               "context_window")}
    with pytest.raises(ValueError, match="windows the keys were dumped in .*--block-size and --stride"):
        import_memmap(kf, vf, tmp_path / "nowin", **no_windows)
    with pytest.raises(ValueError, match="expected 1 <= stride <= block size"):
        import_memmap(kf, vf, tmp_path / "nowin", block_size=512, stride=1024, **no_windows)
    assert "tokens_per_sample" not in import_memmap(kf, vf, tmp_path / "nowin", unknown_windows=True, **no_windows)
    # both tools' default key is last_ffn_input: this pipeline's att
    assert man["key_types"] == ["att"] and not (tmp_path / "out/keys_ffn.npy").exists()
    k2, v2, man2 = open_datastore(tmp_path / "out/manifest.json", tmp_path / "out/vals.npy",
                                  tmp_path / "out/keys_att.npy", "att")
    np.testing.assert_array_equal(np.asarray(k2), keys.astype(np.float16))
    np.testing.assert_array_equal(np.asarray(v2), vals[:, 0])
    assert man2 == man and man["imported_from"]["layout"] == ("knn-transformers" if layout == "knn-transformers"
                                                              else "urvashik/knnlm")
    with pytest.raises(ArtifactError, match=f"{stem}_keys.npy.*bytes"):
        import_memmap(kf, vf, tmp_path / "bad", size=n + 1, dim=dim, **{k: v for k, v in opts.items()
                                                                        if k not in ("size", "dim")})
    (vals - 31000).astype(vals.dtype).tofile(vf)  # ids past int16 wrap to negatives
    with pytest.raises(ArtifactError, match=f"{stem}_vals.npy: val -"):
        import_memmap(kf, vf, tmp_path / "bad2", **opts)
    # the failed import stopped at its first chunk past int16, after writing keys and vals of the chunks before it:
    # nothing of them is left, under its name or a temporary one
    assert not [p for p in (tmp_path / "bad2").rglob("*") if p.is_file()]


def test_bundle_saves_and_loads_the_same_knn_lm(knn_of, tmp_path):
    """save_pretrained → from_pretrained gives back the same kNN-LM: the same settings, and the same per-token
    log-probs of a text; the bundle's config names the LM (with the sha256 of the weights and tokenizer that made the
    keys), the hooked state, the windows, the datastore's corpus and where τ and λ were tuned (the run's Table 1)."""
    from knnlm.api import BUNDLE_CONFIG, KNNLM

    knn = knn_of(TINY_HF)
    out = knn.save_pretrained(tmp_path / "bundle")
    c = json.loads((out / BUNDLE_CONFIG).read_text())
    assert c["lm"]["source"] == "hf" and c["lm"]["checkpoint_sha256"] == knn.manifest["checkpoint_sha256"]
    assert len(c["lm"]["tokenizer_sha256"]) == 64 and c["hook"].startswith("last_ffn_input")
    assert (c["k"], c["temperature"], c["lambda"], c["nprobe"]) == (knn.k, knn.temperature, knn.lam, knn.nprobe)
    assert "Table 1" in c["tuned_on"] and c["datastore"]["data_sha256"] == knn.manifest["data_sha256"]
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(
        [BUNDLE_CONFIG, "keys_att.npy", "vals.npy", "manifest.json", "att_l2.faiss"])
    again = KNNLM.from_pretrained(out)
    assert again.settings() == knn.settings()
    again.save_pretrained(out)  # saved again over itself (its files hard links of the same ones): nothing left over
    assert not list(out.rglob("*.tmp-*")) and (out / "keys_att.npy").stat().st_size == knn.keys.nbytes + 128
    text = "The tower was built in 1890 and rebuilt after the war .\n"
    a, b = knn.score(text), again.score(text)
    np.testing.assert_array_equal(a.lp, b.lp)
    assert a.ppl_word == b.ppl_word


def test_verify_refuses_another_lm_and_names_the_key_type(knn_of, tmp_path):
    """verify() recomputes a sample of keys: the run's own LMs reproduce them (fp16 rounding only); a second tiny LM
    of the same shape (same key dimension, another seed) is refused by from_pretrained with an error naming both
    LMs; keys of type att stored as ffn are refused with an error saying they are att."""
    import shutil

    import torch
    import transformers

    from knnlm.api import KNNLM, HuggingFaceLM, VERIFY_TOLERANCE
    from knnlm.io import ArtifactError

    for lm in ("base", TINY_HF):  # a fairseq LM and a Hugging Face one, each with its run's datastore
        v = knn_of(lm).verify()
        assert v["matches"] == ["att"] and v["att"] < 5e-3 < VERIFY_TOLERANCE < v["ffn"] and v["rows"] == 256, (lm, v)
    knn = knn_of(TINY_HF)
    out = knn.save_pretrained(tmp_path / "bundle")
    path = knn.lm.identity["model"]
    torch.manual_seed(7)
    other = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path))
    other.save_pretrained(tmp_path / "other")
    transformers.AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "other")
    with pytest.raises(ArtifactError, match=r"keys_att.npy: .*neither this LM's att nor its ffn states[\s\S]*"
                                            rf"Datastore's LM: .*{re.escape(path)}.*this LM: .*other"):
        KNNLM.from_pretrained(out, HuggingFaceLM(str(tmp_path / "other")))
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    shutil.copy(out / "keys_att.npy", wrong / "keys_ffn.npy")
    shutil.copy(out / "vals.npy", wrong / "vals.npy")
    (wrong / "manifest.json").write_text(json.dumps({**knn.manifest, "key_types": ["ffn"]}))
    with pytest.raises(ArtifactError, match=r"keys_ffn.npy: .*they are this LM's att states, not ffn: load the "
                                            r"store with key='att'"):
        KNNLM.from_datastore(knn.lm, wrong, mask="exact", k=8)
    # the same keys imported from knn-transformers' headerless memmaps, labelled ffn, with the windows they were
    # dumped in: refused the same way; without the windows the check can only be logged
    from knnlm.datastore.importer import import_memmap

    n, d = knn.keys.shape
    raw = [tmp_path / f"dstore_tiny_{n}_{d}_{part}.npy" for part in ("keys", "vals")]
    np.asarray(knn.keys).tofile(raw[0])
    np.asarray(knn.vals, dtype=np.int32).reshape(-1, 1).tofile(raw[1])
    windows = {k: knn.manifest[k] for k in ("tokens_per_sample", "context_window")}
    import_memmap(*raw, tmp_path / "imported", key_type="ffn", **windows)
    with pytest.raises(ArtifactError, match=r"they are this LM's att states, not ffn"):
        KNNLM.from_datastore(knn.lm, tmp_path / "imported", mask="exact", k=8)
    import_memmap(*raw, tmp_path / "imported_att", **windows)
    assert KNNLM.from_datastore(knn.lm, tmp_path / "imported_att", mask="exact", k=8).verify()["matches"][0] == "att"
    import_memmap(*raw, tmp_path / "no_windows", key_type="ffn", unknown_windows=True)
    assert not KNNLM.from_datastore(knn.lm, tmp_path / "no_windows", mask="exact", k=8).verify()["windows"]
    # from the shell, as a knn-transformers user has it: their --block_size and --stride, verified with the LM at
    # import; another LM's keys refused in one line (exit 2) and nothing left; --no-verify marks the store so
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    cli = [sys.executable, "-m", "knnlm.importer", "--keys", str(raw[0]), "--vals", str(raw[1]),
           "--tokens-per-sample", str(windows["tokens_per_sample"]), "--context-window", str(windows["context_window"])]
    r = subprocess.run(cli + ["--out", str(tmp_path / "cli"), "--lm", path], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    verified = json.loads((tmp_path / "cli" / "manifest.json").read_text())["verified"]
    assert verified["lm"] == path and verified["att"] < 5e-3 and verified["windows"]
    r = subprocess.run(cli + ["--out", str(tmp_path / "cli_other"), "--lm", str(tmp_path / "other")], env=env,
                       capture_output=True, text=True)
    last = r.stderr.strip().splitlines()[-1]  # (after the progress bars)
    assert r.returncode == 2 and last.startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "neither this LM's att nor its ffn states" in r.stderr and not (tmp_path / "cli_other").exists()
    r = subprocess.run(cli[:-4] + ["--out", str(tmp_path / "cli_nowin"), "--lm", path], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--block-size and --stride" in r.stderr, r.stderr[-3000:]
    r = subprocess.run(cli + ["--out", str(tmp_path / "cli_unverified"), "--no-verify"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and json.loads((tmp_path / "cli_unverified" / "manifest.json").read_text())["verified"] is False


def test_the_reference_python_example_runs_as_written(tmp_path, wikitext2_dir):
    """docs/reference.md's Python block, run verbatim in a fresh folder with a tiny Hugging Face model and WikiText-2
    slices: build with the peers' names, tune, score, a bundle saved and loaded, the wrapped model through the
    Trainer with its defaults (its eval_loss the kNN-LM's mean NLL, as score() gives it)."""
    from hf_tiny import make_tiny_hf

    ref = (PROJECT_ROOT / "docs" / "reference.md").read_text()
    sec = ref.split("## The Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", sec, re.S).group(1)
    make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    for split, n in (("train", 120), ("valid", 60)):
        lines = (wikitext2_dir / f"wiki.{split}.tokens").read_text(encoding="utf-8").splitlines(True)[:n]
        (tmp_path / f"{split}.txt").write_text("".join(lines), encoding="utf-8")
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    first, last = r.stdout.strip().splitlines()[0].split(), r.stdout.strip().splitlines()[-1].split()
    assert float(first[0]) > 0 and 0 <= float(first[1]) <= 1 and np.isfinite(float(first[2]))
    assert np.isfinite(float(last[0])) and last[1] == "True"
    assert (tmp_path / "bundle" / "knnlm_config.json").exists()


def test_a_store_written_as_knn_transformers_writes_it_imports_exactly(tmp_path, wikitext2_dir):
    """A store written by knn-transformers' algorithm (run_clm.py's strided windows, KNNSaver's rows; block 64,
    stride 32) imported with its --block-size and --stride: every checked row recomputes within fp16 rounding (the
    largest error, not a median, is judged), the rows checked are named; aligned as a fairseq-eval-lm store it is
    refused naming the worst row. --unknown-windows with --lm accepts it, loosely; the LM's identity is recorded at
    import, so another LM is refused on load even with verify=False."""
    import torch
    import transformers

    from hf_tiny import knn_transformers_dstore, make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM
    from knnlm.datastore.importer import import_memmap
    from knnlm.importer import main as importer_main
    from knnlm.io import ArtifactError

    model = make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    text = "".join((wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:40])
    kf, vf = knn_transformers_dstore(model, text, tmp_path / "peer", block_size=64, stride=32)
    lm = HuggingFaceLM(str(model))
    importer_main(["--keys", str(kf), "--vals", str(vf), "--out", str(tmp_path / "ds"), "--block-size", "64",
                   "--stride", "32", "--lm", str(model)])
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert man["stream_offset"] == 1 and man["checkpoint_sha256"] == lm.identity["checkpoint_sha256"]
    assert man["verified"]["att"] < 5e-3 and man["verified"]["rows"] == 256
    knn = KNNLM.from_datastore(lm, tmp_path / "ds", mask="exact", k=8)
    v = knn.verify(rows=10_000)
    assert v["att"] < 5e-3 and v["rows"] == len(v["checked_rows"]) == man["N"] - 63  # all but the first windows' rows
    # --link: the keys read in place (no second copy on disk), a bundle of them a real .npy, the same numbers
    importer_main(["--keys", str(kf), "--vals", str(vf), "--out", str(tmp_path / "linked"), "--block-size", "64",
                   "--stride", "32", "--lm", str(model), "--link"])
    assert not (tmp_path / "linked" / "keys_att.npy").exists()
    linked = KNNLM.from_datastore(lm, tmp_path / "linked", mask="exact", k=8)
    text1 = "The tower was built in 1890 .\n"
    np.testing.assert_array_equal(linked.score(text1).lp, knn.score(text1).lp)
    linked.save_pretrained(tmp_path / "linked_bundle")
    assert np.load(tmp_path / "linked_bundle" / "keys_att.npy").shape == (man["N"], knn.keys.shape[1])
    np.testing.assert_array_equal(KNNLM.from_pretrained(tmp_path / "linked_bundle", mask="exact").score(text1).lp,
                                  knn.score(text1).lp)
    kf.rename(kf.with_suffix(".moved"))
    with pytest.raises(ArtifactError, match=r"its att keys are linked to .*keys.npy, which is missing"):
        KNNLM.from_datastore(lm, tmp_path / "linked", mask="exact", k=8)
    kf.with_suffix(".moved").rename(kf)
    # the same rows aligned as a fairseq-eval-lm store: the windows' first rows are off by one, and refused
    import_memmap(kf, vf, tmp_path / "as_fairseq", tokens_per_sample=64, context_window=32)
    with pytest.raises(ArtifactError, match=r"largest relative error att .* at row \d+"):
        KNNLM.from_datastore(lm, tmp_path / "as_fairseq", mask="exact", k=8)
    importer_main(["--keys", str(kf), "--vals", str(vf), "--out", str(tmp_path / "loose"), "--unknown-windows",
                   "--lm", str(model)])
    assert json.loads((tmp_path / "loose" / "manifest.json").read_text())["verified"]["loose"] is True
    # the peer's prebuilt IVFPQ index (as its build_index makes it: L2, 8-bit PQ codes, nprobe set before it is
    # written) is imported without training, read for its parameters and checked against the keys
    import faiss

    keys = np.fromfile(kf, dtype=np.float16).reshape(man["N"], -1).astype(np.float32)

    def peer_index(x, path):
        ix = faiss.IndexIVFPQ(faiss.IndexFlatL2(x.shape[1]), x.shape[1], 16, 8, 8)
        ix.train(x)
        ix.add(x)
        ix.nprobe = 4
        faiss.write_index(ix, str(path))
        return path

    importer_main(["--keys", str(kf), "--vals", str(vf), "--out", str(tmp_path / "with_index"), "--block-size", "64",
                   "--stride", "32", "--lm", str(model), "--index", str(peer_index(keys, tmp_path / "peer.indexed"))])
    meta = json.loads((tmp_path / "with_index" / "index" / "att_l2.json").read_text())
    assert (meta["ncentroids"], meta["code_size"], meta["nprobe"], meta["metric"]) == (16, 8, 4, "l2")
    assert meta["fit"]["code_agreement"] == 1.0  # every sampled code byte is what its encoder gives the keys
    ours = KNNLM.from_datastore(lm, tmp_path / "with_index", k=8)
    assert ours.nprobe == 4 and ours._ivf.nlist == 16
    queries = keys[:5]
    ids, _ = ours.neighbours(queries)
    ref = faiss.read_index(str(tmp_path / "peer.indexed"))
    np.testing.assert_array_equal(ids, ref.search(queries, 8)[1])  # the peer's very index, searched as it would be
    rng = np.random.default_rng(0)
    with pytest.raises(ArtifactError, match=r"peer_other.indexed: the vectors it holds are not these att keys"):
        importer_main(["--keys", str(kf), "--vals", str(vf), "--out", str(tmp_path / "other_index"), "--block-size",
                       "64", "--stride", "32", "--no-verify", "--index",
                       str(peer_index(keys[rng.permutation(len(keys))], tmp_path / "peer_other.indexed"))])
    torch.manual_seed(3)
    other = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model))
    other.save_pretrained(tmp_path / "other")
    transformers.AutoTokenizer.from_pretrained(model).save_pretrained(tmp_path / "other")
    with pytest.raises(ArtifactError, match=r"neither this LM's att nor its ffn states"):
        KNNLM.from_datastore(HuggingFaceLM(str(tmp_path / "other")), tmp_path / "ds", mask="exact", k=8,
                             verify=False)


def test_bundle_cli_exports_a_run_store(tiny_run, tmp_path):
    """python -m knnlm.bundle saves a run's kNN-LM (Table 1's τ and λ) as a bundle that from_pretrained loads."""
    from knnlm.api import BUNDLE_CONFIG

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(overrides(tiny_run)))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "knnlm.bundle", "--config", "configs/tiny.yaml", "--config", str(overlay),
                        "--lm", TINY_HF, "--key", "att", "--metric", "l2", "--out", str(tmp_path / "b")],
                       cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = json.loads((tiny_run["root"] / f"lms/{TINY_HF}/stores/full/scores/att_l2.json").read_text())
    c = json.loads((tmp_path / "b" / BUNDLE_CONFIG).read_text())
    assert (c["temperature"], c["lambda"], c["key"], c["metric"]) == (ref["temperature"], ref["lambda"], "att", "l2")
    assert "verified on 256 rows" in r.stderr


def test_tune_and_compare_reproduce_table1(tiny_run, tmp_path):
    """KNNLM.tune on the run's valid text gives Table 1's λ (config τ), τ* and λ*; KNNLM.compare on its test text gives
    Table 1's comparison rows (kNN-LM vs base at τ and at τ*, att vs ffn keys) with the same interval, documents and
    verdict; python -m knnlm.score prints the same row from the shell."""
    import pandas as pd

    from knnlm.api import KNNLM

    root = tiny_run["root"]
    valid, test = ((root / f"data/{s}.tokens").read_text(encoding="utf-8") for s in ("valid", "test"))
    s = json.loads((root / "lms/base/stores/full/scores/att_l2.json").read_text())
    knn = KNNLM.from_run("configs/tiny.yaml", lm="base", key="att", metric="l2", overrides=overrides(tiny_run))
    t = knn.tune(valid, tuned=False)
    assert (t["lambda"], t["tuned_temperature"], t["tuned_lambda"]) == (s["lambda"], s["tuned"]["temperature"],
                                                                       s["tuned"]["lambda"])
    assert knn.lam == s["lambda"] and "KNNLM.tune" in knn.tuned_on
    df = pd.read_csv(root / "lms/base/tables/table1_comparisons.csv")
    rows = df[df["split"] == "test"].set_index("comparison")

    def same(c, row):
        r = rows.loc[row]
        assert c["relative difference"] == pytest.approx(r["relative difference"], abs=1e-4), row
        assert (c["CI low"], c["CI high"]) == pytest.approx((r["CI low"], r["CI high"]), abs=1e-4), row
        assert c["verdict"] == r["verdict"] and c["documents"] == r["documents"], row

    same(knn.compare(test), "att/L2 vs base")
    ffn = KNNLM.from_run("configs/tiny.yaml", lm="base", key="ffn", metric="l2", overrides=overrides(tiny_run))
    same(knn.compare(test, against=ffn), "att/L2 vs ffn/L2")
    knn.temperature, knn.lam = t["tuned_temperature"], t["tuned_lambda"]
    same(knn.compare(test), "att/L2 τ* vs base")
    for split in ("valid", "test"):
        (tmp_path / f"{split}.txt").write_text(valid if split == "valid" else test, encoding="utf-8")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(overrides(tiny_run)))
    r = subprocess.run([sys.executable, "-m", "knnlm.score", "--config", "configs/tiny.yaml", "--config", str(overlay),
                        "--tune", str(tmp_path / "valid.txt"), "--text", str(tmp_path / "test.txt")], cwd=PROJECT_ROOT,
                       env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if "kNN-LM att/L2 vs base" in ln)
    assert f"{rows.loc['att/L2 τ* vs base', 'relative difference']:.4g}"[:6] in line and rows.loc[
        "att/L2 τ* vs base", "verdict"] in line


def test_conveniences_loaded_model_peer_names_and_batches(knn_of, tmp_path):
    """HuggingFaceLM takes an already loaded model and tokenizer (the same keys and scores as from its path); its
    default window is the model's maximum length capped at DEFAULT_MAX_WINDOW; the peers' names lmbda, knn_temp and
    knn_keytype=last_ffn_input set λ, τ and att; score_texts scores several texts in one call, each as score does."""
    import transformers

    from knnlm.api import KNNLM, HuggingFaceLM, peer_settings
    from knnlm.lm.hf import DEFAULT_MAX_WINDOW

    knn = knn_of(TINY_HF)
    out = knn.save_pretrained(tmp_path / "bundle")
    path = knn.lm.identity["model"]
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    lm = HuggingFaceLM(model, tokenizer=transformers.AutoTokenizer.from_pretrained(path),
                       tokens_per_sample=knn.lm.tokens_per_sample)
    assert lm.identity["model"] == path and lm.identity["dtype"] == "float32"
    peer = KNNLM.from_datastore(lm, out, lmbda=0.3, knn_temp=2.0, knn_keytype="last_ffn_input", k=knn.k,
                                context_window=knn.context_window, nprobe=knn.nprobe)
    assert (peer.key, peer.lam, peer.temperature) == ("att", 0.3, 2.0)
    texts = ["The tower was built in 1890 .\n", "It was rebuilt after the war .\n"]
    own = KNNLM.from_datastore(knn.lm, out, lam=0.3, temperature=2.0, k=knn.k, context_window=knn.context_window,
                               nprobe=knn.nprobe)
    for a, b in zip(peer.score_texts(texts), [own.score(t) for t in texts]):
        np.testing.assert_allclose(a.lp, b.lp, rtol=1e-6)
    assert HuggingFaceLM(path).tokens_per_sample == min(model.config.max_position_embeddings, DEFAULT_MAX_WINDOW)
    with pytest.raises(TypeError, match="unknown setting 'lambda_'"):
        peer_settings({"lambda_": 0.1})
    with pytest.raises(ValueError, match="needs its tokenizer"):
        HuggingFaceLM(model)


def _knn_of_arrays(n=16, vocab=50, **kw):
    """A kNN-LM over n random keys of a stand-in LM (only what construction reads: its vocabulary size)."""
    from types import SimpleNamespace

    from knnlm.api import KNNLM

    rng = np.random.default_rng(0)
    lm = SimpleNamespace(vocab_size=vocab, dim=8)
    opts = {"key": "att", "metric": "l2", "k": 4, "temperature": 1.0, "lam": 0.25, "mask": "exact", **kw}
    vals = kw.pop("vals", None)
    opts.pop("vals", None)
    return KNNLM(lm, rng.standard_normal((n, 8)).astype(np.float16),
                 rng.integers(0, vocab, n).astype(np.int32) if vals is None else vals, **opts)


def test_every_setting_is_checked_at_construction_and_on_assignment():
    """k, τ and λ are properties: a string, a bool, NaN or a value out of range is refused with the setting's name, at
    construction and on assignment (knn.lam = 1.7 used to make generate return garbage); k may not exceed the
    datastore; vals outside the LM's vocabulary are refused before any score (a silently wrong perplexity)."""
    knn = _knn_of_arrays()
    for name, bad, err, msg in (("lam", 1.7, ValueError, r"lam must be >= 0 and <= 1, found 1.7"),
                                ("lam", float("nan"), ValueError, "lam must be finite"),
                                ("temperature", 0, ValueError, r"temperature must be > 0, found 0"),
                                ("temperature", "1.0", TypeError, "temperature must be a number, found str '1.0'"),
                                ("k", "64", TypeError, "k must be an integer, found str '64'"),
                                ("k", True, TypeError, "k must be an integer, found bool"),
                                ("k", 17, ValueError, r"k must be >= 1 and <= 16, found 17")):
        with pytest.raises(err, match=msg):
            setattr(knn, name, bad)
        with pytest.raises(err, match=msg):
            _knn_of_arrays(**{name: bad})
    knn.lam, knn.temperature, knn.k = np.float64(0.5), 2, np.int64(16)
    assert (knn.lam, knn.temperature, knn.k) == (0.5, 2.0, 16) and type(knn.k) is int
    with pytest.raises(ValueError, match=r"vals: token ids 0 … 50, outside the LM's vocabulary of 50"):
        _knn_of_arrays(vals=np.append(np.zeros(15, np.int32), 50))


def test_tune_refuses_grids_the_config_schema_refuses():
    from knnlm.config import ConfigError

    knn = _knn_of_arrays()
    for grids, msg in (({"temperature": {"step": -0.1}}, r"'temperature\.step'.*found -0\.1"),
                       ({"knn": {"lambda_steps": 1}}, r"'knn\.lambda_steps'.*found 1"),
                       ({"temprature": {}}, r"grids has sections \['temprature'\]")):
        with pytest.raises((ConfigError, ValueError), match=msg):
            knn.tune("a b c\n", grids=grids)


def test_a_bundle_config_is_checked_naming_the_file_and_the_key(tmp_path):
    from knnlm.api import BUNDLE_CONFIG, BUNDLE_FORMAT, read_bundle_config
    from knnlm.io import ArtifactError

    good = {"format": BUNDLE_FORMAT, "lm": {"source": "hf", "model": str(tmp_path / "gone")}, "key": "att",
            "metric": "l2", "k": 8, "temperature": 1.0, "lambda": 0.25, "nprobe": 4, "mask": "faiss",
            "score": "faiss", "index": None, "context_window": 16, "max_tokens": 512}
    path = tmp_path / BUNDLE_CONFIG
    valid = f"{BUNDLE_CONFIG}: not a valid kNN-LM bundle config .*: "
    for change, msg in (({"k": "64"}, r"key 'k': expected integer, minimum 1 \(neighbours per query\), found '64'"),
                        ({"k": 0}, r"key 'k': expected integer, minimum 1 \(neighbours per query\), found 0"),
                        ({"lambda": 1.5}, r"key 'lambda': expected number, minimum 0, maximum 1 .*found 1.5"),
                        ({"metric": "cos"}, r"key 'metric': expected enum \['l2', 'ip'\] .*found 'cos'"),
                        ({"k": None}, r"key 'k': expected integer.*found None"),
                        ({"format": 2}, r"key 'format': expected const 1 \(the bundle format this version reads")):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(ArtifactError, match=valid + msg + ".*save the kNN-LM again with KNNLM.save_pretrained"):
            read_bundle_config(tmp_path)
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "k"}))
    with pytest.raises(ArtifactError, match=valid + r"key '<top level>': 'k' is a required property"):
        read_bundle_config(tmp_path)
    import knnlm

    spec = yaml.safe_load((Path(knnlm.__file__).parent / "schemas" / "bundle_config.schema.yaml").read_text())
    assert spec["properties"]["format"]["const"] == BUNDLE_FORMAT  # the schema reads this version's format
    path.write_text('{"format": 1, "k": ')
    with pytest.raises(ArtifactError, match=f"{BUNDLE_CONFIG}: not valid JSON"):
        read_bundle_config(tmp_path)
    path.write_text(json.dumps(good))
    assert read_bundle_config(tmp_path) == good
    from knnlm.api import KNNLM

    with pytest.raises(ArtifactError, match=r"knnlm_config.json: the bundle's LM is not found \(looked for .*gone\)"
                                            r": pass the same weights as lm="):
        KNNLM.from_pretrained(tmp_path)


def test_a_bundle_is_portable_and_checks_what_it_loads(tmp_path, wikitext2_dir, monkeypatch):
    """A bundle built from a relative model path loads from another working folder and after the bundle and its model
    move together (the path relative to the bundle); a model that is gone is an error naming the bundle and where it
    looked, never a Hub look-up; another tokenizer's hash is refused on load; a missing index is an error unless
    rebuild_index=True."""
    import shutil

    from hf_tiny import make_tiny_hf
    from knnlm.api import BUNDLE_CONFIG, KNNLM, HuggingFaceLM
    from knnlm.io import ArtifactError

    work = tmp_path / "work"
    make_tiny_hf(work / "model", wikitext2_dir / "wiki.train.tokens")
    lines = (wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:60]
    monkeypatch.chdir(work)
    knn = KNNLM.build(HuggingFaceLM("model"), "".join(lines), "ds", k=16, context_window=16, max_tokens=512,
                      threads=1)
    knn.save_pretrained("bundle")
    text = "The tower was built in 1890 .\n"
    want = knn.score(text).lp
    cfg = json.loads((work / "bundle" / BUNDLE_CONFIG).read_text())
    assert cfg["lm"]["hub"] is False and cfg["lm"]["model_relative"] == "../model"
    monkeypatch.chdir(tmp_path)  # another working folder
    np.testing.assert_array_equal(KNNLM.from_pretrained(work / "bundle").score(text).lp, want)
    assert KNNLM.from_pretrained(work / "bundle", probe=3, lmbda=0.5).settings()["nprobe"] == 3  # the peers' names
    with pytest.raises(TypeError, match=r"a bundle's metric is the one it was saved with \('l2'\)"):
        KNNLM.from_pretrained(work / "bundle", knn_sim_func="dot")
    moved = tmp_path / "moved"
    shutil.move(str(work), str(moved))  # the bundle and its model moved together: the saved absolute path is gone
    np.testing.assert_array_equal(KNNLM.from_pretrained(moved / "bundle").score(text).lp, want)
    (moved / "model").rename(moved / "away")
    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: calls.append(a) or 1 / 0)
    with pytest.raises(ArtifactError, match=rf"{BUNDLE_CONFIG}: the bundle's LM is not found \(looked for .*model and "):
        KNNLM.from_pretrained(moved / "bundle")
    assert calls == []
    (moved / "away").rename(moved / "model")
    man_path = moved / "bundle" / "manifest.json"
    man = json.loads(man_path.read_text())
    assert man["vocab_sha256"] == knn.lm.identity["vocab_sha256"]
    man_path.write_text(json.dumps({**man, "tokenizer_sha256": "0" * 64, "vocab_sha256": "1" * 64}))
    with pytest.raises(ArtifactError, match="made with a tokenizer of sha256 0000.*vocabulary sha256 1111.*this LM's"):
        KNNLM.from_pretrained(moved / "bundle")
    man_path.write_text(json.dumps({**man, "tokenizer_sha256": "0" * 64}))  # other files, the same vocabulary
    assert KNNLM.from_pretrained(moved / "bundle").settings() == knn.settings()
    man_path.write_text(json.dumps(man))
    index = next((moved / "bundle").rglob("*.faiss"))
    index.unlink()
    with pytest.raises(ArtifactError, match=r"index is missing; pass rebuild_index=True"):
        KNNLM.from_pretrained(moved / "bundle")
    assert not index.exists()
    assert np.isfinite(KNNLM.from_pretrained(moved / "bundle", rebuild_index=True).score(text).ppl_word)
    assert index.exists()


def test_build_a_knn_lm_from_any_model_and_text(tmp_path, wikitext2_dir):
    """KNNLM.build from a Hugging Face LM and a text file, without a pipeline run: the datastore holds a row per
    token of the text (vals = the text's tokens), its manifest the LM's identity, the windows and the text's sha256;
    the kNN-LM it returns scores a text, and its keys verify against the LM; a text shorter than k is refused."""
    import hashlib

    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM
    from knnlm.io import ArtifactError

    model = make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join((wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:60]),
                      encoding="utf-8")
    lm = HuggingFaceLM(str(model))
    knn = KNNLM.build(lm, corpus, tmp_path / "ds", k=16, context_window=16, max_tokens=512, threads=1)
    ids = lm.encode(corpus.read_text(encoding="utf-8").splitlines(True))
    np.testing.assert_array_equal(np.asarray(knn.vals), ids)
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert man["N"] == len(ids) and man["context_window"] == 16 and man["tokens_per_sample"] == lm.tokens_per_sample
    assert man["data_sha256"] == hashlib.sha256(corpus.read_text(encoding="utf-8").encode()).hexdigest()
    assert (knn.k, knn.temperature, knn.lam, knn.key, knn.metric) == (16, 1.0, 0.25, "att", "l2")
    assert knn.verify()["matches"][0] == "att"
    out = knn.score("The tower was built in 1890 .\n")
    assert np.isfinite(out.ppl_word) and len(out.lp) == len(out.lp_lm)
    with pytest.raises(ValueError, match=r"fewer than k = 100000"):
        KNNLM.build(lm, "a b c\n", tmp_path / "small", k=100000)
    with pytest.raises(ArtifactError, match="missing text file"):
        KNNLM.build(lm, tmp_path / "absent.txt", tmp_path / "none")


def test_build_checks_every_setting_before_any_work_and_takes_the_peers_names(tmp_path, wikitext2_dir, monkeypatch):
    """KNNLM.build refuses a bad λ, τ, key, metric, k or window before it dumps anything (no folder is left); its
    windows overlap by half the LM's window by default (knn-transformers' stride); the peers' option names set this
    API's settings, and an unknown name is refused with the closest of ours."""
    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM, peer_settings
    from knnlm.datastore import dump
    from knnlm.io import ArtifactError

    lm = HuggingFaceLM(str(make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")))
    text = "".join((wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:30])
    dumped = []
    monkeypatch.setattr(dump, "dump_datastore", lambda *a, **k: dumped.append(a) or 1 / 0)
    for kw, err, msg in (({"lam": 2.0}, ValueError, r"lam must be >= 0 and <= 1, found 2.0"),
                         ({"temperature": 0}, ValueError, r"temperature must be > 0, found 0"),
                         ({"metric": "cos"}, ValueError, r"metric must be one of \['l2', 'ip'\], found 'cos'"),
                         ({"key": "mlp"}, ValueError, r"key must be one of \['att', 'ffn'\]"),
                         ({"k": 0}, ValueError, r"k must be >= 1, found 0"),
                         ({"context_window": lm.tokens_per_sample}, ValueError,
                          rf"context_window must be >= 0 and <= {lm.tokens_per_sample - 1}"),
                         ({"knn_sim_func": "cosine"}, ValueError, r"knn_sim_func must be one of \['l2', 'dot'\]"),
                         ({"lambda_": 0.3}, TypeError, r"unknown setting 'lambda_' .*did you mean 'lam'")):
        with pytest.raises(err, match=msg):
            KNNLM.build(lm, text, tmp_path / "ds", **kw)
        assert not (tmp_path / "ds").exists() and not dumped
    assert peer_settings({"lmbda": 0.3, "knn_temp": 2.0, "probe": 8, "knn_sim_func": "dot", "recompute_dists": True,
                          "knn_keytype": "last_ffn_output"}) == {"lam": 0.3, "temperature": 2.0, "nprobe": 8,
                                                                 "metric": "ip", "score": "real", "key": "ffn"}
    monkeypatch.undo()
    knn = KNNLM.build(lm, text, tmp_path / "ds", k=8, knn_sim_func="dot", lmbda=0.3, probe=2, threads=1)
    assert (knn.metric, knn.lam, knn.nprobe, knn.context_window) == ("ip", 0.3, 2, lm.tokens_per_sample // 2)
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["context_window"] == lm.tokens_per_sample // 2
    with pytest.raises(ArtifactError, match=r"dstore_size=5 given, the datastore has"):
        KNNLM.from_datastore(lm, tmp_path / "ds", metric="ip", k=8, dstore_size=5)


def test_a_wrapped_hugging_face_model_is_the_knn_lm(tmp_path, wikitext2_dir):
    """knn.wrap(): the model's own forward gives Eq. 5's log-probabilities as logits and their NLL as its loss, equal
    to score()'s on the same tokens; model.generate (greedy) equals knn.generate_ids; unwrap() gives the LM back."""
    import torch

    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM

    model_dir = make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join((wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:60]),
                      encoding="utf-8")
    lm = HuggingFaceLM(str(model_dir))
    knn = KNNLM.build(lm, corpus, tmp_path / "ds", k=16, lam=0.4, context_window=16, max_tokens=512, threads=1)
    text = "The tower was built in 1890 and rebuilt after the war .\n"
    scored = knn.score(text)
    ids = lm.encode([text])
    x = torch.tensor([[lm.start, *ids.tolist()]])
    with torch.no_grad():
        plain = lm.model(input_ids=x).logits
        model = knn.wrap()
        out = model(input_ids=x, labels=x)
    assert out.loss.item() == pytest.approx(float(-scored.lp.mean()), rel=1e-4)
    assert torch.exp(out.logits[0, 3]).sum().item() == pytest.approx(1.0, rel=1e-4)
    with torch.no_grad():
        gen = model.generate(input_ids=x[:, :5], max_new_tokens=6, do_sample=False, pad_token_id=lm.start)
    assert gen[0, 5:].tolist() == knn.generate_ids(ids[:4], 6)
    # the API on a wrapped model: the LM's own forward, never the kNN-LM twice
    again = knn.score(text)
    np.testing.assert_array_equal(again.lp_lm, scored.lp_lm)
    np.testing.assert_array_equal(again.lp, scored.lp)
    valid = corpus.read_text(encoding="utf-8").splitlines(True)[:30]
    wrapped = knn.tune(valid, tuned=False), knn.compare(valid, stats={"documents": "blank_lines"})
    knn.unwrap()
    assert (knn.tune(valid, tuned=False), knn.compare(valid, stats={"documents": "blank_lines"})) == wrapped
    assert wrapped[1]["relative difference"] != 0  # the kNN-LM against its base LM, not against itself
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=x).logits, plain)


def test_the_trainer_evaluates_and_predicts_a_wrapped_model_with_defaults(tmp_path, wikitext2_dir):
    """Trainer.evaluate() and Trainer.predict() on a wrapped model with the Trainer's default arguments (its
    remove_unused_columns reads the forward's signature): eval_loss is the kNN-LM's NLL of the labels, as score()
    gives it; model.generate runs with its defaults."""
    import inspect

    import torch
    from transformers import Trainer, TrainingArguments

    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM

    model_dir = make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    lines = (wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)
    lm = HuggingFaceLM(str(model_dir))
    knn = KNNLM.build(lm, "".join(lines[:60]), tmp_path / "ds", k=16, lam=0.4, context_window=16, max_tokens=512,
                      threads=1)
    texts = ["The tower was built in 1890 .\n", "It was rebuilt after the war and opened again .\n"]
    rows = []
    for t in texts:
        ids = [lm.start, *lm.encode([t]).tolist()]
        rows.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)})
    want = [float(-knn.score(t).lp.mean()) for t in texts]
    model = knn.wrap()
    assert "input_ids" in inspect.signature(model.forward).parameters
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "trainer"), report_to=[],
                                                          per_device_eval_batch_size=1, use_cpu=True))
    metrics = trainer.evaluate(eval_dataset=rows)
    assert metrics["eval_loss"] == pytest.approx(np.mean(want), rel=1e-4)
    pred = trainer.predict(rows[:1])
    lp = torch.as_tensor(pred.predictions).reshape(1, -1, lm.vocab_size)[0, :-1]
    nll = -lp.gather(1, rows[0]["labels"][1:, None]).mean().item()
    assert nll == pytest.approx(want[0], rel=1e-4)
    out = model.generate(input_ids=rows[0]["input_ids"][None, :4])
    assert out.shape[0] == 1 and out.shape[1] > 4
    knn.unwrap()


def test_a_bundle_is_scored_and_compared_from_the_shell(tmp_path, wikitext2_dir):
    """python -m knnlm.score / generate with --bundle: no pipeline run; its errors are one line naming the file, exit
    status 2, no traceback."""
    from hf_tiny import make_tiny_hf
    from knnlm.api import KNNLM, HuggingFaceLM

    model_dir = make_tiny_hf(tmp_path / "model", wikitext2_dir / "wiki.train.tokens")
    lines = (wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)
    (tmp_path / "corpus.txt").write_text("".join(lines[:60]), encoding="utf-8")
    test_lines = (wikitext2_dir / "wiki.test.tokens").read_text(encoding="utf-8").splitlines(True)[:300]
    (tmp_path / "test.txt").write_text("".join(test_lines), encoding="utf-8")
    knn = KNNLM.build(HuggingFaceLM(str(model_dir)), tmp_path / "corpus.txt", tmp_path / "ds", k=16,
                      context_window=16, max_tokens=512, threads=1)
    knn.save_pretrained(tmp_path / "bundle")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    run = lambda *args: subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    r = run("knnlm.score", "--bundle", "bundle", "--text", "test.txt")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kNN-LM att/L2 vs base" in r.stdout and "verdict" in r.stdout
    r = run("knnlm.generate", "--bundle", "bundle", "--prompt", "The tower", "--max-new-tokens", "4")
    assert r.returncode == 0 and r.stdout.startswith("The tower"), r.stderr[-3000:]
    for args, msg in ((("knnlm.score", "--bundle", "absent", "--text", "test.txt"), "absent/knnlm_config.json: no bundle config"),
                      (("knnlm.score", "--bundle", "bundle", "--text", "missing.txt"), "missing.txt")):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and msg in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1 or r.stderr.strip().splitlines()[-1].startswith("error: ")
    # the settings as flags, knn-transformers' names too
    r = run("knnlm.score", "--bundle", "bundle", "--text", "test.txt", "--k", "8", "--lmbda", "0.5", "--knn-temp", "2",
            "--mask", "exact")
    assert r.returncode == 0, r.stderr[-3000:]
    row = [x for x in r.stdout.splitlines() if "kNN-LM att/L2 vs base" in x][0].split("|")
    assert [float(row[2]), float(row[3])] == [2.0, 0.5]


def test_the_score_cli_checks_its_inputs_before_the_model_loads(tmp_path, monkeypatch):
    """python -m knnlm.score: a missing, empty or non-UTF-8 text file and a bad setting are refused naming the file or
    the setting before any model is loaded; a text the tokenizer makes no tokens of is named by its file."""
    from knnlm import generate, score
    from knnlm.io import ArtifactError

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(score, "run_knnlm", no_model)
    (tmp_path / "empty.txt").write_text(" \n\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "ok.txt").write_text("The tower .\n", encoding="utf-8")
    for args, err, msg in (
            (["--text", str(tmp_path / "absent.txt")], ArtifactError, r"absent.txt: text file not found"),
            (["--text", str(tmp_path / "empty.txt")], ArtifactError, r"empty.txt: text file has no words"),
            (["--text", str(tmp_path / "latin1.txt")], ArtifactError, r"latin1.txt: text file is not UTF-8"),
            (["--text", str(tmp_path / "ok.txt"), "--tune", str(tmp_path / "absent.txt")], ArtifactError,
             r"absent.txt: --tune text file not found"),
            (["--text", str(tmp_path / "ok.txt"), "--lmbda", "1.5"], ValueError, r"lam must be >= 0 and <= 1, found 1.5"),
            (["--text", str(tmp_path / "ok.txt"), "--k", "0"], ValueError, r"k must be >= 1, found 0")):
        with pytest.raises(err, match=msg):
            score.main(["--bundle", str(tmp_path), *args])
    with pytest.raises(ArtifactError, match=r"^ok.txt: the tokenizer produced no tokens"):
        with generate.naming("ok.txt"):
            raise ArtifactError("<text>: the tokenizer produced no tokens")


def test_one_lm_identity_recorded_by_build_and_compared_on_load(tmp_path, wikitext2_dir):
    """The LM's identity is the sha256 of its weights and of its tokenizer (knnlm.lm.hf.files_identity, the pipeline's
    model card's too): KNNLM.build records it in the manifest and the bundle; another LM of the same shape is refused
    on load with both hashes named; the same weights in another folder load with a warning."""
    import shutil

    import torch
    import transformers

    from hf_tiny import make_tiny_hf
    from knnlm.api import BUNDLE_CONFIG, KNNLM, HuggingFaceLM
    from knnlm.io import ArtifactError
    from knnlm.lm.hf import files_identity, model_card

    a = make_tiny_hf(tmp_path / "a", wikitext2_dir / "wiki.train.tokens")
    lines = (wikitext2_dir / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(True)[:60]
    lm = HuggingFaceLM(str(a))
    ident = files_identity(a)
    assert lm.identity["checkpoint_sha256"] == ident["checkpoint_sha256"] == model_card(str(a))["checkpoint_sha256"]
    knn = KNNLM.build(lm, "".join(lines), tmp_path / "ds", k=16, context_window=16, max_tokens=512, threads=1)
    knn.save_pretrained(tmp_path / "bundle")
    saved = json.loads((tmp_path / "bundle" / BUNDLE_CONFIG).read_text())["lm"]
    assert saved["checkpoint_sha256"] == ident["checkpoint_sha256"] and saved["tokenizer_sha256"] == ident["tokenizer_sha256"]
    torch.manual_seed(7)
    other = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(a))
    other.save_pretrained(tmp_path / "b")
    transformers.AutoTokenizer.from_pretrained(a).save_pretrained(tmp_path / "b")
    b_sha = files_identity(tmp_path / "b")["checkpoint_sha256"]
    with pytest.raises(ArtifactError, match=rf"(?s){ident['checkpoint_sha256']}.*{b_sha}"):
        KNNLM.from_pretrained(tmp_path / "bundle", lm=HuggingFaceLM(str(tmp_path / "b")), verify=False)
    shutil.copytree(a, tmp_path / "a-copy")
    (tmp_path / "a-copy" / "config.json").write_text((a / "config.json").read_text() + "\n")  # another file, same weights
    again = KNNLM.from_pretrained(tmp_path / "bundle", lm=HuggingFaceLM(str(tmp_path / "a-copy")), verify=False)
    assert again.settings() == knn.settings()
