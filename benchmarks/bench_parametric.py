"""Benchmark: one learned-W_ds epoch on the dumped keys vs one epoch through the frozen fairseq LM. Prints the ratio.

  python benchmarks/bench_parametric.py --results results --name wikitext2 [--lm base] [--key att] [--tokens 300000]
  python benchmarks/bench_parametric.py --paper-shape [--tokens 2048]

--paper-shape: the paper's LM shape (Xu et al. 2023, Sec. 3: 16 layers, 1024 dims, FFN 4096, 16 heads, V = 33k; a
randomly initialised fairseq transformer_lm, pre-norm) on random tokens in blocks of 512, against W_ds steps on the
same number of random fp16 keys read from a memmap -- a few thousand tokens time it.

Both paths train the same W_ds (V x D, fp32 or --bf16 autocast matmuls, Adam) on the same number of training tokens
with batches of ~4096 tokens. The LM path gets its features the way a trainer without a datastore must:
fairseq's train-split batches (tokens_per_sample blocks, no context-window overlap, the cheapest choice) through
the frozen LM in eval mode (no dropout, also the cheapest choice), with the att/ffn features taken from the
same hooks as the dump. Goal: keys path >= 3x faster.
"""
from __future__ import annotations

import os

# faiss and torch each keep an OpenMP pool; with the default (active) wait policy one library's idle threads spin
# while the other computes, which slowed the second stage ~3-10x when both ran in one process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from knnlm.lm.fairseq import checkpoint_output_matrix  # noqa: E402
from knnlm.paths import Layout  # noqa: E402
from knnlm.lm.fairseq import forward_states, iter_split, load_lm
from knnlm.datastore.dump import open_datastore  # noqa: E402
from knnlm.parametric import Aggregation, AggregatedSoftmax, KeyBatches  # noqa: E402


BF16 = False


def step(model, opt, h, y):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
        loss = -model.log_prob(h, y).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def paper_shape(tokens: int, batch: int, block: int = 512, vocab: int = 33_000, dim: int = 1024) -> None:
    """Keys path vs frozen-LM path at the paper's shape, random weights and data (timing only)."""
    import tempfile

    from fairseq.data import Dictionary
    from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    from knnlm.lm.fairseq import forward_states

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    cfg = TransformerLanguageModelConfig(decoder_layers=16, decoder_embed_dim=dim, decoder_ffn_embed_dim=4 * dim,
                                         decoder_attention_heads=16, decoder_normalize_before=True,
                                         tokens_per_sample=block, max_target_positions=block)
    lm = TransformerLanguageModel.build_model(cfg, LanguageModelingTask(LanguageModelingConfig(), d, d)).eval()
    rng = np.random.default_rng(0)

    def fresh():
        m = AggregatedSoftmax(Aggregation.from_counts(np.ones(len(d), dtype=int)), dim, seed=1)
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)

    with tempfile.TemporaryDirectory() as tmp:
        keys = np.lib.format.open_memmap(f"{tmp}/keys.npy", mode="w+", dtype=np.float16, shape=(tokens, dim))
        keys[:] = rng.normal(size=(tokens, dim)).astype(np.float16)
        keys.flush()
        keys = np.load(f"{tmp}/keys.npy", mmap_mode="r")
        vals = rng.integers(4, len(d), tokens).astype(np.int32)
        model, opt = fresh()
        step(model, opt, torch.zeros(8, dim), torch.zeros(8, dtype=torch.long))  # warm-up
        t0 = time.perf_counter()
        for h, y in KeyBatches(keys, vals, None, batch, seed=1).epoch(0):
            step(model, opt, h, y)
        t_keys = time.perf_counter() - t0
    model, opt = fresh()
    per = max(1, batch // block)
    t0 = time.perf_counter()
    n = 0
    while n < tokens:
        src = torch.from_numpy(rng.integers(4, len(d), (per, block)))
        st = forward_states(lm, src, False)
        step(model, opt, st["att"].reshape(-1, dim).float(), src.reshape(-1))
        n += per * block
    t_lm = time.perf_counter() - t0
    r_keys, r_lm = tokens / t_keys, n / t_lm
    print(f"paper shape (16 x {dim}, V = {len(d)}): W_ds on dumped keys {r_keys:,.0f} tokens/s; through the frozen LM "
          f"{r_lm:,.0f} tokens/s ({n} tokens); ratio {r_keys / r_lm:.2f} (goal >= 3)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="results", help="results_dir of the finished run")
    ap.add_argument("--name", default="wikitext2", help="config name of the finished run")
    ap.add_argument("--lm", default="base")
    ap.add_argument("--key", default="att", choices=["att", "ffn"])
    ap.add_argument("--tokens", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--paper-shape", action="store_true")
    a = ap.parse_args()
    global BF16
    BF16 = a.bf16
    torch.set_num_threads(a.threads)
    if a.paper_shape:
        return paper_shape(a.tokens, a.batch)
    L = Layout(a.results, a.name)
    ckpt, data_bin = L.path("checkpoint", lm=a.lm), L.path("data_bin")
    keys, vals, _ = open_datastore(L.path("datastore_manifest", lm=a.lm), L.path("vals", lm=a.lm),
                                   L.path("keys", lm=a.lm, key=a.key), a.key)
    v, d = checkpoint_output_matrix(ckpt).shape

    def fresh():
        m = AggregatedSoftmax(Aggregation.from_counts(np.ones(v, dtype=int)), d, seed=1)
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)

    model, opt = fresh()
    t0 = time.perf_counter()
    n_keys = 0
    for h, y in KeyBatches(keys, vals, np.arange(a.tokens), a.batch, seed=1).epoch(0):
        step(model, opt, h, y)
        n_keys += len(y)
    t_keys = time.perf_counter() - t0

    lm, cfg = load_lm(ckpt, data_bin)
    itr, _, pad = iter_split(lm, cfg, data_bin, "train", 0, a.batch)
    model, opt = fresh()
    t0 = time.perf_counter()
    n_lm = 0
    for sample in itr:
        if "net_input" not in sample:
            continue
        tgt = sample["target"]
        st = forward_states(lm, sample["net_input"]["src_tokens"], False)
        keep = tgt != pad
        step(model, opt, st[a.key][keep].float(), tgt[keep])
        n_lm += int(keep.sum())
        if n_lm >= a.tokens:
            break
    t_lm = time.perf_counter() - t0
    r_keys, r_lm = n_keys / t_keys, n_lm / t_lm
    print(f"W_ds epoch on dumped keys: {r_keys:,.0f} tokens/s ({n_keys} tokens, {t_keys:.1f} s); through the frozen "
          f"fairseq LM: {r_lm:,.0f} tokens/s ({n_lm} tokens, {t_lm:.1f} s); ratio {r_keys / r_lm:.2f} (goal >= 3)")


if __name__ == "__main__":
    main()
