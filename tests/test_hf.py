"""Hugging Face base LMs (knnlm.lm.hf): keys equal the hooked modules of an ordinary forward, log-probs the
model's own token losses, words add up to the WikiText count, windows match fairseq-eval-lm's semantics."""
import numpy as np
import pytest
import torch

from hf_tiny import make_tiny_hf
from knnlm.lm import hf
from knnlm.lm.windows import windows
from knnlm.data import count_words

# the modules whose outputs are att (the last block's pre-MLP norm) and ffn (the final norm), named per class
NAMED = {"gpt2": ("transformer.h.1.ln_2", "transformer.ln_f"),
         "llama": ("model.layers.1.post_attention_layernorm", "model.norm"),
         "opt": ("model.decoder.layers.1.final_layer_norm", "model.decoder.final_layer_norm")}


@pytest.fixture(scope="module", params=sorted(NAMED))
def tiny_hf(request, tmp_path_factory, wikitext2_dir):
    d = make_tiny_hf(tmp_path_factory.mktemp(request.param), wikitext2_dir / "wiki.train.tokens", request.param)
    model, tok = hf.load_hf(str(d))
    return request.param, model, tok


@pytest.fixture
def train_lines(wikitext2_dir):
    """A function writing `n_lines` lines of the shipped WikiText-2 train split, after its first `skip`, to a file."""
    def write(tmp_path, n_lines=40, skip=100):
        return _lines(wikitext2_dir / "wiki.train.tokens", tmp_path, n_lines, skip)
    return write


def _lines(train, tmp_path, n_lines, skip):
    with open(train, encoding="utf-8") as f:
        lines = [line for i, line in zip(range(skip + n_lines), f) if i >= skip]
    p = tmp_path / "split.tokens"
    p.write_text("".join(lines), encoding="utf-8")
    return p


def test_tokenize_split_words_add_up(tiny_hf, tmp_path, train_lines):
    _, _, tok = tiny_hf
    p = train_lines(tmp_path)
    for chunk in (7, 1000):  # chunking between lines changes nothing about the words
        t = hf.tokenize_split(tok, p, chunk_lines=chunk)
        assert int(t["words"].sum()) == count_words(p)["words"]
        assert len(t["ids"]) == len(t["words"]) == len(t["line"]) and np.all(np.diff(t["line"]) >= 0)
        assert t["line"].max() == count_words(p)["lines"] - 1
    no_newline = tmp_path / "last.tokens"
    no_newline.write_text(" a b\n c", encoding="utf-8")
    assert int(hf.tokenize_split(tok, no_newline)["words"].sum()) == count_words(no_newline)["words"] == 5


@pytest.mark.parametrize("n,L,C", [(10, 4, 2), (100, 64, 32), (5, 64, 32), (65, 64, 0)])
def test_windows_cover_each_target_once_with_context(n, L, C):
    seen = []
    for a, s, e in windows(n, L, C):
        assert e - a <= L and a == max(0, s - C) and e - s <= L - C
        seen += range(s, e)
    assert seen == list(range(n))
    with pytest.raises(ValueError, match="context window"):
        windows(n, 4, 4)


def test_keys_and_log_probs_equal_an_ordinary_forward(tiny_hf, tmp_path, train_lines):
    arch, model, tok = tiny_hf
    ids = hf.tokenize_split(tok, train_lines(tmp_path, n_lines=3))["ids"][:50]
    stream = np.concatenate([[hf.start_token(tok)], ids])
    got = list(hf.iter_states(model, stream, tokens_per_sample=64, context=8, max_tokens=4096, with_log_probs=True))
    assert len(got) == 1  # one window holds it all: the dump is one ordinary forward
    cap, mods = {}, dict(model.named_modules())
    hooks = [mods[n].register_forward_hook(lambda m, i, o, k=k: cap.__setitem__(k, o)) for k, n in zip(("att", "ffn"), NAMED[arch])]
    dev = model.device  # the ordinary forward on the model's device (load_hf puts it on CUDA when there is one)
    x = torch.as_tensor(stream[None, :-1], device=dev)
    with torch.no_grad():
        whole = torch.as_tensor(stream[None], device=dev)
        loss = model(input_ids=whole, labels=whole).loss
        model(input_ids=x)
    for h in hooks:
        h.remove()
    for k in ("att", "ffn"):
        np.testing.assert_allclose(got[0][k].numpy(), cap[k].reshape(len(ids), -1).cpu().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0]["target"].numpy(), ids)
    assert -got[0]["lp"].mean().item() == pytest.approx(loss.item(), rel=1e-5)


def test_sliding_windows_score_with_their_context(tiny_hf, tmp_path, train_lines):
    """Every target of a sliding-window pass gets the log-prob of a forward over its own window."""
    _, model, tok = tiny_hf
    ids = hf.tokenize_split(tok, train_lines(tmp_path, n_lines=5))["ids"][:90]
    stream = np.concatenate([[hf.start_token(tok)], ids])
    L, C = 32, 12
    got = torch.cat([b["lp"] for b in hf.iter_states(model, stream, L, C, max_tokens=64, with_log_probs=True)]).numpy()
    want = []
    for a, s, e in windows(len(ids), L, C):
        with torch.no_grad():
            lp = model(input_ids=torch.as_tensor(stream[None, a:e], device=model.device)).logits[0].log_softmax(-1)
        want += [lp[t - a, stream[t + 1]].item() for t in range(s, e)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_unknown_structure_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50))
    for blk in m.transformer.h:
        blk.feed = blk.mlp
        del blk.mlp
    with pytest.raises(ValueError, match="GPT2LMHeadModel: cannot find the MLP"):
        hf.find_key_modules(m)
