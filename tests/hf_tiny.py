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
