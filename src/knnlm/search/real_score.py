"""Exact distances of given neighbours ("real score", Xu et al. 2023 Sec. 5): the FAISS neighbours' distances
recomputed in fp32 from the datastore's keys. On the CPU a numba kernel reads each neighbour's key row from the memmap,
so a job of this kind never loads torch (about 2 s of a job's start); on a CUDA device the rows are gathered to it.
knnlm.search.exact (the exact top-k, "real mask") exports recompute_distances too."""
from __future__ import annotations

import os

import numpy as np

from ..io import release_rows

# Device files of a GPU driver (NVIDIA, ROCm, WSL): without any of them torch can see no CUDA device.
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where no GPU driver is present (no device file of one,
    or CUDA_VISIBLE_DEVICES empty or -1)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1") or not any(map(os.path.exists, _GPU_DEVICE_FILES)):
        return False
    import torch

    return torch.cuda.is_available()


def recompute_distances(keys: np.ndarray, queries: np.ndarray, ids: np.ndarray, metric: str, query_chunk: int = 256,
                        device: str | None = None) -> np.ndarray:
    """Exact fp32 distances between each query and its given neighbours ("real score").

    keys: [N, D] memmap, queries: [T, D] float32, ids: [T, k] int (−1 = missing → +inf for l2, −inf for ip).
    Returns [T, k] float32 in faiss convention. Reads only the neighbours' rows of the memmap: on the CPU a
    numba kernel computes each distance from the mapped row (~20x faster than gathering the rows first);
    query_chunk is the GPU path's gather size. Raises IndexError for an id ≥ N, ValueError for another metric.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    if (device is not None and str(device).partition(":")[0] == "cpu") or (device is None and not cuda_available()):
        return _recompute_cpu(keys, queries, ids, metric)
    import torch

    dev = torch.device(device or "cuda")
    t, k = ids.shape
    out = np.empty((t, k), dtype=np.float32)
    for s in range(0, t, query_chunk):  # the GPU path: gathered rows, ascending, to the device
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


def _recompute_cpu(keys: np.ndarray, queries: np.ndarray, ids: np.ndarray, metric: str) -> np.ndarray:
    """recompute_distances on the CPU: a numba kernel reads each neighbour's key row straight from the memmap
    (fp16 converted in registers), no gathered copy ([T, k] float32). A memmap's pages leave the process's RSS
    afterwards (knnlm.io.release_rows), so a caller in chunks holds at most the key file, not it and its outputs."""
    from ._select import neighbour_distances_f16, neighbour_distances_f32

    q = np.ascontiguousarray(queries, dtype=np.float32)
    idx = np.ascontiguousarray(ids)
    out = np.empty(idx.shape, dtype=np.float32)
    if idx.size and int(idx.max()) >= keys.shape[0]:
        raise IndexError(f"neighbour id {int(idx.max())} is out of range for a datastore of {keys.shape[0]} keys")
    k_arr = np.asarray(keys)  # a memmap's ndarray view: pages are read as the kernel touches them
    if k_arr.dtype == np.float16:
        neighbour_distances_f16(k_arr.view(np.uint16), q, idx, metric == "l2", out)
    else:
        neighbour_distances_f32(np.ascontiguousarray(k_arr, dtype=np.float32), q, idx, metric == "l2", out)
    release_rows(keys, 0, keys.shape[0])  # a memmap: the rows touched (most pages of the file) leave the RSS
    return out
