"""GPU code paths, run where CUDA is present and skipped elsewhere: exact search and real score on CUDA equal the CPU
kernels, faiss-gpu IVFPQ training/search agree with the CPU index, and a Hugging Face dump on CUDA equals the CPU one."""
import numpy as np
import pytest
import torch

from knnlm.search.exact import exact_topk

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (GPU paths are tested on GPU machines)")


@cuda
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_exact_search_on_cuda_equals_cpu(metric):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(20000, 64)).astype(np.float16)
    queries = rng.normal(size=(300, 64)).astype(np.float32)
    ci, cd = exact_topk(keys, queries, 64, metric, key_chunk=4096, device="cpu", progress=False)
    gi, gd = exact_topk(keys, queries, 64, metric, key_chunk=4096, device="cuda", progress=False)
    np.testing.assert_allclose(gd, cd, rtol=1e-4, atol=1e-3)
    assert np.mean([len(set(gi[i]) & set(ci[i])) / 64 for i in range(len(queries))]) > 0.99


@cuda
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_sharded_exact_search_on_cuda_equals_one_cuda_scan(metric):
    """Shards of whole key chunks searched on CUDA (exact_topk's span) and merged (knnlm.search.exact.merge_topk) equal
    one CUDA scan: the same chunks give the same float32 sums on the GPU too; k = 2,500 is above faiss-GPU's limit."""
    from knnlm.search.exact import merge_topk
    from knnlm.datastore.stores import shard_spans

    rng = np.random.default_rng(1)
    keys = rng.normal(size=(30000, 64)).astype(np.float16)
    queries = rng.normal(size=(200, 64)).astype(np.float32)
    for k in (64, 2500):
        want_i, want_d = exact_topk(keys, queries, k, metric, key_chunk=4096, device="cuda", progress=False)
        parts = [exact_topk(keys, queries, min(k, b - a), metric, key_chunk=4096, device="cuda", span=(a, b),
                            progress=False) for a, b in shard_spans(len(keys), 3, 4096)]
        got_i, got_d = merge_topk(parts, k, metric, (np.empty((200, k), np.int64), np.empty((200, k), np.float32)),
                                  progress=False)
        np.testing.assert_array_equal(got_d, want_d)
        inside = want_d != want_d[:, -1:]
        np.testing.assert_array_equal(got_i[inside], want_i[inside])


@cuda
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_real_score_on_cuda_equals_cpu(tmp_path, metric):
    """recompute_distances ("real score") on CUDA (rows gathered to the GPU) equals the CPU's numba kernel on a memmap of
    fp16 keys, missing neighbours (id −1) included, and refuses an id beyond the datastore as the CPU does."""
    from knnlm.search.exact import recompute_distances

    rng = np.random.default_rng(2)
    np.save(tmp_path / "keys.npy", rng.normal(size=(5000, 64)).astype(np.float16))
    keys = np.load(tmp_path / "keys.npy", mmap_mode="r")
    queries = rng.normal(size=(700, 64)).astype(np.float32)
    ids = rng.integers(0, len(keys), size=(700, 32))
    ids[::7, -3:] = -1
    want = recompute_distances(keys, queries, ids, metric, device="cpu")
    got = recompute_distances(keys, queries, ids, metric, device="cuda")
    missing = ids < 0
    assert np.all(got[missing] == want[missing]) and np.isinf(got[missing]).all()
    np.testing.assert_allclose(got[~missing], want[~missing], rtol=1e-5, atol=1e-4)
    ids[3, 0] = len(keys)
    with pytest.raises(IndexError):
        recompute_distances(keys, queries, ids, metric, device="cuda")


@cuda
def test_faiss_gpu_ivfpq_agrees_with_cpu(tmp_path):
    faiss = pytest.importorskip("faiss", reason="faiss is not installed (scripts/setup.sh --gpu installs faiss-gpu)")

    from knnlm.search.index import build_ivfpq, gpu_resources, search

    if gpu_resources() is None:
        pytest.skip("faiss is a CPU build (scripts/setup.sh --gpu installs faiss-gpu)")
    rng = np.random.default_rng(1)
    keys = rng.normal(size=(50000, 64)).astype(np.float16)
    queries = rng.normal(size=(500, 64)).astype(np.float32)
    params = {"ncentroids": 64, "code_size": 16, "train_size": 20000, "nprobe": 8, "add_chunk": 10000, "seed": 1}
    meta = build_ivfpq(keys, "l2", params, tmp_path / "i.faiss")
    assert meta["trained_on"] == "gpu"
    stats = search(tmp_path / "i.faiss", queries, 32, 8, tmp_path / "g_ids.npy", tmp_path / "g_d.npy")
    assert stats["device"] == "gpu"
    cpu = faiss.read_index(str(tmp_path / "i.faiss"))
    cpu.nprobe = 8
    _, ref = cpu.search(queries, 32)
    got = np.load(tmp_path / "g_ids.npy")
    assert np.mean([len(set(got[i]) & set(ref[i])) / 32 for i in range(len(queries))]) > 0.95


@cuda
def test_hf_dump_on_cuda_equals_cpu(tmp_path, wikitext2_dir):

    from hf_tiny import make_tiny_hf
    from knnlm.lm import hf

    train = wikitext2_dir / "wiki.train.tokens"
    d = make_tiny_hf(tmp_path / "m", train, "gpt2")
    model, tok = hf.load_hf(str(d))  # on CUDA (load_hf moves it there when present)
    ids = hf.tokenize_split(tok, train)["ids"][:500]
    stream = np.concatenate([[hf.start_token(tok)], ids])
    got = torch.cat([b["ffn"] for b in hf.iter_states(model, stream, 64, 16, 4096, False)])
    model.cpu()
    want = torch.cat([b["ffn"] for b in hf.iter_states(model, stream, 64, 16, 4096, False)])
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
