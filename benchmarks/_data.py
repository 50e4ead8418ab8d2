"""Data shared by the benchmarks: random normal fp16 keys written as a .npy memmap (the datastore's layout)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def make_keys(path: Path, n: int, d: int, seed: int = 0) -> np.ndarray:
    """[n, d] float16 N(0, 1) keys written to `path` in 65,536-row blocks; returns them opened read-only (memmap)."""
    keys = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, d))
    rng = np.random.default_rng(seed)
    for s in range(0, n, 65536):
        keys[s:s + 65536] = rng.normal(size=(min(65536, n - s), d)).astype(np.float16)
    keys.flush()
    return np.load(path, mmap_mode="r")
