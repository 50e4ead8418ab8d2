"""Tiny random Hugging Face causal LMs for the tests (no download): a byte-level BPE tokenizer trained on a text
file, and a 2-layer GPT-2, Llama or OPT with random weights, saved with save_pretrained."""
from __future__ import annotations

from pathlib import Path


def make_tiny_hf(out_dir: str | Path, train_text: str | Path, arch: str = "gpt2", vocab_size: int = 300,
                 max_lines: int = 400, seed: int = 0) -> Path:
    """Write a tiny random `arch` ('gpt2' | 'llama' | 'opt') model and its tokenizer to out_dir; returns out_dir."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM,
                              PreTrainedTokenizerFast)

    with open(train_text, encoding="utf-8") as f:
        lines = [line for _, line in zip(range(max_lines), f)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    v = len(fast)
    common = dict(vocab_size=v, bos_token_id=0, eos_token_id=0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=256, **common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                             num_attention_heads=2, num_key_value_heads=2,
                                             max_position_embeddings=256, **common))
    elif arch == "opt":
        model = OPTForCausalLM(OPTConfig(num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=2,
                                         max_position_embeddings=256, word_embed_proj_dim=32, pad_token_id=1,
                                         **common))
    else:
        raise ValueError(f"unknown arch {arch!r}")
    torch.manual_seed(seed)
    model.init_weights()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    fast.save_pretrained(out_dir)
    return out_dir


def knn_transformers_dstore(model_dir: str | Path, text: str, out_dir: str | Path, block_size: int,
                            stride: int) -> tuple[Path, Path]:
    """A datastore as neulab/knn-transformers writes it (run_clm.py --save_knnlm_dstore with --block_size and
    --stride, its KNNSaver, key type last_ffn_input), re-implemented from their algorithm for one `datasets.map`
    batch: the text's tokens concatenated (no BOS) and cut to a multiple of block_size; windows begin every `stride`
    tokens, each the block_size tokens up to its end, with the labels of all but its last `stride` tokens (the first
    window: all) set to -100 and pad after the text's end; each window's MLP input of the last block at every position
    but the last, with labels[:, 1:] as vals, kept where the label is not -100. Returns the (keys, vals) files
    dstore_<model_type>_<N>_<D>_{keys,vals}.npy: headerless [N, D] float16 and [N, 1] int32."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    total = len(ids) // block_size * block_size if len(ids) >= block_size else len(ids)
    captured = {}
    mlp = model.transformer.h[-1].mlp
    hook = mlp.register_forward_pre_hook(lambda m, a: captured.__setitem__("h", a[0]))
    keys, vals = [], []
    with torch.no_grad():
        for i in range(0, total, stride):
            begin, end = max(i + stride - block_size, 0), min(i + stride, total)
            window = list(ids[begin:end])
            labels = [-100] * (len(window) - (end - i)) + window[len(window) - (end - i):]
            pad = block_size - len(window)
            window, labels = window + [0] * pad, labels + [-100] * pad
            model(input_ids=torch.tensor([window]))
            h, lab = captured["h"][0, :-1], torch.tensor(labels[1:])
            keep = lab != -100
            keys.append(h[keep].numpy().astype(np.float16))
            vals.append(lab[keep].numpy().astype(np.int32))
    hook.remove()
    k, v = np.concatenate(keys), np.concatenate(vals).reshape(-1, 1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"dstore_{model.config.model_type}_{len(k)}_{k.shape[1]}"
    kf, vf = Path(f"{stem}_keys.npy"), Path(f"{stem}_vals.npy")
    k.tofile(kf)
    v.tofile(vf)
    return kf, vf
