"""Exact retrieval ("real mask") and exact distances of given neighbours ("real score"), Xu et al. 2023 Sec. 5.

Both stream the fp16 key memmap in chunks and compute in fp32 with torch (CUDA when available), so
memory is bounded by the chunk sizes, never by the datastore. Distances follow faiss conventions:
squared L2 distance for 'l2' (smaller = closer), inner product for 'ip' (larger = closer).
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


@torch.no_grad()
def exact_topk(keys: np.ndarray, queries: np.ndarray, k: int, metric: str, key_chunk: int = 65536,
               query_chunk: int = 4096, device: str | None = None, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k neighbours of each query over all keys (the sharded exact search of the paper).

    keys: [N, D] float16/float32 (memmap ok), queries: [T, D] float32, k ≤ N, metric 'l2' | 'ip'.
    Returns (ids [T, k] int64 sorted closest first, dists [T, k] float32 in faiss convention).
    Peak memory ≈ query_chunk × key_chunk × 4 bytes + one key chunk. Raises ValueError on bad metric/k.
    Per key chunk, top-k candidates are merged with the running top-k; L2 ranks by 2 q·x − |x|² (the
    query norm is added back at the end), accumulated in fp32.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    n, t = keys.shape[0], queries.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, N={n}], found {k}")
    dev = _device(device)
    out_ids = np.empty((t, k), dtype=np.int64)
    out_d = np.empty((t, k), dtype=np.float32)
    n_chunks = -(-n // key_chunk)
    bar = tqdm(total=n_chunks * (-(-t // query_chunk)), desc=f"exact {metric}", unit=" block", disable=not progress,
               mininterval=10)
    for qs in range(0, t, query_chunk):
        q = torch.as_tensor(np.asarray(queries[qs:qs + query_chunk], dtype=np.float32), device=dev)
        best_s = torch.full((q.shape[0], k), -torch.inf, device=dev)
        best_i = torch.full((q.shape[0], k), -1, dtype=torch.int64, device=dev)
        for ks in range(0, n, key_chunk):
            x = torch.as_tensor(np.asarray(keys[ks:ks + key_chunk], dtype=np.float32), device=dev)
            if metric == "ip":
                s = q @ x.T
            else:
                s = torch.addmm((x * x).sum(1).neg_().unsqueeze(0), q, x.T, beta=1.0, alpha=2.0)
            top_s, top_i = s.topk(min(k, s.shape[1]), dim=1)
            cat_s = torch.cat([best_s, top_s], dim=1)
            cat_i = torch.cat([best_i, top_i + ks], dim=1)
            best_s, pos = cat_s.topk(k, dim=1)
            best_i = cat_i.gather(1, pos)
            bar.update(1)
        if metric == "l2":
            best_s = (q * q).sum(1, keepdim=True) - best_s
        out_ids[qs:qs + q.shape[0]] = best_i.cpu().numpy()
        out_d[qs:qs + q.shape[0]] = best_s.cpu().numpy()
    bar.close()
    return out_ids, out_d


@torch.no_grad()
def recompute_distances(keys: np.ndarray, queries: np.ndarray, ids: np.ndarray, metric: str, query_chunk: int = 256,
                        device: str | None = None) -> np.ndarray:
    """Exact fp32 distances between each query and its given neighbours ("real score").

    keys: [N, D] memmap, queries: [T, D] float32, ids: [T, k] int (−1 = missing → +inf for l2, −inf for ip).
    Returns [T, k] float32 in faiss convention. Reads only the neighbours' rows of the memmap.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    dev = _device(device)
    t, k = ids.shape
    out = np.empty((t, k), dtype=np.float32)
    for s in range(0, t, query_chunk):
        idx = np.asarray(ids[s:s + query_chunk])
        valid = idx >= 0
        flat = np.where(valid, idx, 0).ravel()
        order = np.argsort(flat, kind="stable")  # visit the memmap in ascending row order
        rows = np.empty((flat.size, keys.shape[1]), dtype=np.float32)
        rows[order] = keys[flat[order]]
        x = torch.as_tensor(rows, device=dev).view(idx.shape[0], k, -1)
        q = torch.as_tensor(np.asarray(queries[s:s + query_chunk], dtype=np.float32), device=dev).unsqueeze(1)
        d = ((x - q) ** 2).sum(-1) if metric == "l2" else (x * q).sum(-1)
        d = d.cpu().numpy()
        out[s:s + idx.shape[0]] = np.where(valid, d, np.inf if metric == "l2" else -np.inf)
    return out
