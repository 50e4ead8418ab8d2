"""Exact retrieval ("real mask") and exact distances of given neighbours ("real score"), Xu et al. 2023 Sec. 5.

Both stream the fp16 key memmap in chunks and compute in fp32 with torch (CUDA when available), so
memory is bounded by the chunk sizes, never by the datastore. Distances follow faiss conventions:
squared L2 distance for 'l2' (smaller = closer), inner product for 'ip' (larger = closer).

Exact top-k is a sharded scan: for a block of queries, every key chunk is read once (with pread, so
the file's pages are not mapped into the process), multiplied against the queries into a reused score
buffer, and only the scores that can still enter a query's top-k are kept. The filter is a threshold
per query (its current k-th best score) applied first to group maxima, then to the members of the
groups that pass, so the per-chunk cost beyond the matmul is one max-reduction over the scores.

On the CPU every key chunk after the first is cut into tiles of TILE_QUERIES queries × TILE_KEYS keys: one worker
thread per core owns a share of each query chunk's rows, computes each of its tiles with a one-thread GEMM and
filters it at once (knnlm.search._select.select_tile) while the tile is still in its core's L2 cache, instead of one
multithreaded GEMM writing a [query_chunk, key_chunk] block to memory and reading it back.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch
from tqdm import tqdm

from ..io import iter_chunks, release_rows
from .real_score import recompute_distances  # noqa: F401 - its home is torch-free; exported here as before

GROUP = 16  # scores per group in the max prefilter (the torch path, for GPUs)
MERGE_BYTES = 1 << 30  # merge_topk's working memory per block of queries (~48 bytes per candidate)
CPU_GROUP = 64  # consecutive scores per group maximum on the CPU (torch.amax over 64 runs at memory speed, 16 does not)
# The CPU's score tiles: TILE_QUERIES × TILE_KEYS fp32, the size of one core's L2 cache (cpu_l2_bytes) within 1,024 to
# 4,096 keys. Measured on an Intel Xeon with 2 MiB of L2 per core (2 cores, 1M real att keys, 4,096 queries, D = 128,
# k = 1,024; exact search / numpy's GEMM of the same product in 1,024 × 32,768 blocks, three runs each): 128 × 4,096
# 0.80-0.83, 128 × 2,048 0.82-0.86 at a lower rate, 128 × 1,024 0.73-0.83, 64 × 4,096 0.74-0.78; tiles of 256 rows fell
# to 122-145 GFLOP/s against 160-190. On CPUs with a smaller L2 (AMD Zen 3: 512 KiB) the tile follows it, unmeasured.
TILE_QUERIES = 128


def cpu_l2_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """One core's L2 cache in bytes, from Linux's cache directory `root` (its level-2 data or unified cache, size
    such as '2048K'); 1 MiB where it does not say."""
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            with open(os.path.join(path, "level")) as f, open(os.path.join(path, "type")) as g:
                if f.read().strip() != "2" or g.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "size")) as f:
                size = f.read().strip().upper()
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except (OSError, ValueError):
        pass
    return 1 << 20


TILE_KEYS_RANGE = (1024, 4096)  # the keys of a CPU score tile: a power of two within this range (docs/reference.md)


def tile_keys(l2_bytes: int) -> int:
    """The keys of a CPU score tile: the largest power of two whose TILE_QUERIES × keys fp32 tile fits `l2_bytes` (one
    core's L2 cache), within TILE_KEYS_RANGE."""
    lo, hi = TILE_KEYS_RANGE
    return min(hi, max(lo, 1 << (l2_bytes // (4 * TILE_QUERIES)).bit_length() - 1))


TILE_KEYS = tile_keys(cpu_l2_bytes())


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


class KeyReader:
    """Reads row blocks of an [N, D] key array into a reused buffer.

    keys: a C-contiguous np.memmap (read with os.pread: the file's pages never count in this process's
    RSS), or any array (sliced). rows: optional int64 datastore row ids (a datastore subset, or nested subsets
    in scan order; ascending runs read fastest); block i then covers rows[start:stop], read by fancy indexing and
    then released from the RSS (knnlm.io.release_rows over the block's row range). span: optional (start, stop)
    positions of the scan (of all keys, or of rows) to read, a shard of it: block positions are then relative to
    start, and ids() are datastore row ids. Raises ValueError if rows or span are out of range.
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray | None = None, span: tuple[int, int] | None = None):
        self.keys, self.rows = keys, None if rows is None else np.asarray(rows, dtype=np.int64)
        total = keys.shape[0] if rows is None else len(self.rows)
        a, b = span if span is not None else (0, total)
        if not 0 <= a <= b <= total:
            raise ValueError(f"span must satisfy 0 <= start <= stop <= {total}, found {span}")
        if self.rows is not None:
            self.rows = self.rows[a:b]
        self.base = a if self.rows is None else 0  # a shard of all keys: row ids start at its first row
        self.n = b - a
        self.d = keys.shape[1]
        if self.rows is not None and len(self.rows) and (self.rows.min() < 0 or self.rows.max() >= keys.shape[0]):
            raise ValueError(f"subset rows must lie in [0, {keys.shape[0]}), found [{self.rows.min()}, {self.rows.max()}]")
        self._fd = None
        if self.rows is None and isinstance(keys, np.memmap) and keys.flags.c_contiguous and keys.filename:
            self._fd = os.open(keys.filename, os.O_RDONLY)
            self._offset = keys.offset

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop of the (subset) key array as a [stop-start, D] array of the keys' dtype."""
        if self.rows is not None:
            r = self.rows[start:stop]
            out = np.asarray(self.keys[r])
            if len(r):  # a memmap's pages of these rows leave the RSS (a 5 % subset touches most pages of the file)
                release_rows(self.keys, int(r.min()), int(r.max()) + 1)
            return out
        start, stop = start + self.base, stop + self.base
        if self._fd is None:
            return np.asarray(self.keys[start:stop])
        out = np.empty((stop - start, self.d), dtype=self.keys.dtype)
        buf = memoryview(out).cast("B")
        pos, off = 0, self._offset + start * self.d * out.itemsize
        while pos < len(buf):
            got = os.preadv(self._fd, [buf[pos:]], off + pos)
            if got <= 0:
                raise OSError(f"{self.keys.filename}: short read at byte {off + pos}")
            pos += got
        return out

    def ids(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start + self.base, stop + self.base) if self.rows is None else self.rows[start:stop]

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _RunningTopK:
    """Unsorted running top-k of m rows with a candidate buffer, merged into the top-k only when full.

    Scores that enter are filtered by thr, each row's k-th best score at the last merge (a lower bound on
    its final k-th best), so between merges only a few candidates per row are appended.
    """

    def __init__(self, m: int, k: int, device, buffer: int = 1024):
        self.k, self.cap = k, buffer
        self.s = torch.full((m, k), -torch.inf, device=device)
        self.i = torch.full((m, k), -1, dtype=torch.int64, device=device)
        self.buf_s = torch.full((m, buffer), -torch.inf, device=device)
        self.buf_i = torch.full((m, buffer), -1, dtype=torch.int64, device=device)
        self.fill = torch.zeros(m, dtype=torch.int64, device=device)
        self.thr = torch.full((m,), torch.finfo(torch.float32).min, device=device)
        self.started = False

    def raise_threshold(self, gmax: torch.Tensor) -> None:
        """Lift thr to the k-th largest group maximum ([m, G] with G ≥ k), a lower bound on the k-th best score."""
        self.thr = torch.maximum(self.thr, gmax.topk(self.k, dim=1, sorted=False).values.amin(1))

    def _merge(self, extra_s=None, extra_i=None):
        cat_s, cat_i = [self.s, self.buf_s], [self.i, self.buf_i]
        if extra_s is not None:
            cat_s.append(extra_s)
            cat_i.append(extra_i)
        self.s, p = torch.cat(cat_s, 1).topk(self.k, dim=1, sorted=False)
        self.i = torch.cat(cat_i, 1).gather(1, p)
        # the k-th best so far; a row whose top-k is not full yet (−inf) keeps its seeded lower bound
        self.thr = torch.maximum(self.thr, self.s.amin(1))
        self.buf_s.fill_(-torch.inf)
        self.fill.zero_()

    def add_block(self, sc: torch.Tensor, col_ids: torch.Tensor) -> None:
        """Offer the scores of one [m, n] block (n a multiple of GROUP); col_ids: [n] int64 datastore ids."""
        m, n = sc.shape
        g_count = n // GROUP
        grouped = sc.view(m, GROUP, g_count)  # group j = columns j, j + g_count, j + 2 g_count, ...
        gmax = grouped.amax(1)
        if not self.started and g_count >= self.k:
            self.raise_threshold(gmax)
        self.started = True
        r, gj = (gmax >= self.thr.unsqueeze(1)).nonzero(as_tuple=True)
        if r.numel() == 0:
            return
        vals = grouped[r, :, gj]  # [P, GROUP]
        pi, t = (vals >= self.thr[r].unsqueeze(1)).nonzero(as_tuple=True)
        rows, v, cols = r[pi], vals[pi, t], col_ids[gj[pi] + t * g_count]
        cnt = torch.bincount(rows, minlength=m)
        start = torch.cumsum(cnt, 0) - cnt
        within = torch.arange(rows.numel(), device=sc.device) - start[rows]
        if int((self.fill + cnt).max()) <= self.cap:  # append to the buffer
            pos = self.fill[rows] + within
            self.buf_s[rows, pos] = v
            self.buf_i[rows, pos] = cols
            self.fill += cnt
            return
        width = int(cnt.max())  # many candidates (the first blocks): merge them with the buffer at once
        cand_s = torch.full((m, width), -torch.inf, device=sc.device)
        cand_i = torch.full((m, width), -1, dtype=torch.int64, device=sc.device)
        cand_s[rows, within] = v
        cand_i[rows, within] = cols
        self._merge(cand_s, cand_i)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores [m, k], ids [m, k]) sorted best first."""
        self._merge()
        s, order = self.s.sort(1, descending=True)
        return s, self.i.gather(1, order)


class _RunningTopKCPU:
    """The running top-k of m rows on the CPU: per block, group maxima of CPU_GROUP consecutive scores (torch.amax),
    then one numba pass (knnlm.search._select.select_groups) over the groups that reach the row's threshold, each of
    their scores compared with it (the row's k-th best at the last merge, or the seeded lower bound) and the
    few that pass appended to a per-row buffer, merged into the top-k when full. Same results as _RunningTopK
    (up to the order of ties); used for CPU tensors, where the torch version's extra passes over the scores cost
    as much as the matmul."""

    def __init__(self, m: int, k: int, buffer: int = 1024):
        self.k = k
        self.s = np.full((m, k), -np.inf, dtype=np.float32)
        self.i = np.full((m, k), -1, dtype=np.int64)
        self.buf_s = np.full((m, buffer), -np.inf, dtype=np.float32)
        self.buf_i = np.full((m, buffer), -1, dtype=np.int64)
        self.fill = np.zeros(m, dtype=np.int64)
        self.thr_np = np.full(m, np.finfo(np.float32).min, dtype=np.float32)
        self._gmax = None  # [m, n // CPU_GROUP] group maxima, reused

    @property
    def thr(self) -> torch.Tensor:
        return torch.from_numpy(self.thr_np)

    @thr.setter
    def thr(self, value: torch.Tensor) -> None:
        self.thr_np[:] = value.cpu().numpy()

    def add_block(self, sc: torch.Tensor, col_ids: torch.Tensor) -> None:
        """Offer the scores of one [m, n] block (n a multiple of CPU_GROUP); col_ids: [n] int64 datastore ids. The group
        maxima come from torch.amax (vectorised, multithreaded) and the kernel reads only the groups that reach a
        row's threshold."""
        from ._select import select_groups

        m, n = sc.shape
        if self._gmax is None or self._gmax.shape[1] < n // CPU_GROUP:
            self._gmax = torch.empty((self.s.shape[0], n // CPU_GROUP))
        gmax = self._gmax[:m, :n // CPU_GROUP]
        torch.amax(sc.view(m, n // CPU_GROUP, CPU_GROUP), 2, out=gmax)
        select_groups(sc.numpy(), gmax.numpy(), col_ids.numpy(), self.thr_np, self.buf_s, self.buf_i, self.fill,
                      self.s, self.i)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores [m, k], ids [m, k]) sorted best first."""
        from ._select import merge_buffers

        merge_buffers(self.buf_s, self.buf_i, self.fill, self.s, self.i)
        s, order = torch.sort(torch.from_numpy(self.s), dim=1, descending=True, stable=True)  # multithreaded
        return s, torch.from_numpy(self.i).gather(1, order)


def cpu_gemm() -> str:
    """The library of the exact search's GEMM on the CPU: 'torch' (torch.mm, MKL) on Intel CPUs, 'numpy' (numpy's
    OpenBLAS) on others, or environment variable KNNLM_CPU_GEMM ('numpy' | 'torch'). Measured at the search's shape
    (1,024 × 129 · 129 × 32,768, 2 threads): on an AMD EPYC OpenBLAS 172 GFLOP/s against MKL's 105; on an Intel
    Xeon (avx512) MKL 31.6 ms against OpenBLAS's 36.7 ms. One choice per machine, so a rerun there gives the same
    sums."""
    choice = os.environ.get("KNNLM_CPU_GEMM")
    if choice:
        if choice not in ("numpy", "torch"):
            raise ValueError(f"environment variable KNNLM_CPU_GEMM must be 'numpy' or 'torch', found {choice!r}")
        return choice
    try:
        with open("/proc/cpuinfo") as f:
            intel = any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        intel = False
    return "torch" if intel else "numpy"


_CPU_GEMM = cpu_gemm()


def cpu_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a [m, k] · b [k, n] in float32 on the CPU through the machine's faster BLAS (cpu_gemm: torch.mm, i.e. MKL, or
    numpy's OpenBLAS), into `out` [m, n] when given; returns the product. The exact search's GEMMs and those of a W_ds
    training step (knnlm.parametric; at its shapes on 2 Intel Xeon cores torch.mm took 27.3 ms against numpy's 36.3
    for the scores, 32.2 against 36.7 for W's gradient)."""
    if _CPU_GEMM == "numpy":
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32) if out is None else out
    torch.mm(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    return out


def _scores(q: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """out [m, n] = q [m, D+1] · x[n, D+1]ᵀ in fp32: on the CPU through the faster BLAS of the machine (cpu_matmul), the
    same sums to float32 rounding; torch.mm elsewhere."""
    if q.device.type == "cpu":
        cpu_matmul(q.numpy(), x.numpy().T, out.numpy())
    else:
        torch.mm(q, x.T, out=out)


def _tile_scores(q: torch.Tensor, xa: torch.Tensor, out: torch.Tensor, workers: int) -> None:
    """out [m, n] = q [m, D+1] · xa[:n]ᵀ on the CPU by the very GEMM calls _scan_tiles makes for these rows and keys:
    worker w's rows w·m/W..(w+1)·m/W in tiles of TILE_QUERIES, the keys in tiles of TILE_KEYS, one-thread GEMMs of the
    same operands. A score is then the same bits whichever path scored its key (a BLAS may round a product of another
    shape otherwise: OpenBLAS on an AMD EPYC does for a few rows), so a shard, whose first chunk is scored here, and
    one scan, which scores that chunk in _scan_tiles, give the same distances."""
    m, n = out.shape
    with _one_thread_gemm():
        for spans in _worker_rows(m, workers):
            for rs, re in spans:
                for ts in range(0, n, TILE_KEYS):
                    te = min(n, ts + TILE_KEYS)
                    if _CPU_GEMM == "numpy":
                        out[rs:re, ts:te] = torch.from_numpy(np.matmul(q[rs:re].numpy(), xa[ts:te].T.numpy()))
                    else:
                        out[rs:re, ts:te] = torch.mm(q[rs:re], xa[ts:te].T)


_BLAS = None  # threadpoolctl's controller of numpy's BLAS, made on first use


@contextmanager
def _one_thread_gemm():
    """Within the block, the CPU GEMM of _scores (cpu_gemm's library) runs on one thread per call, so that worker
    threads each run their own GEMM side by side; the thread counts are restored afterwards."""
    global _BLAS
    if _CPU_GEMM == "numpy":
        if _BLAS is None:
            from threadpoolctl import ThreadpoolController
            _BLAS = ThreadpoolController()
        with _BLAS.limit(limits=1, user_api="blas"):
            yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _worker_rows(m: int, workers: int) -> list[list[tuple[int, int]]]:
    """The row tiles of m query rows per worker: worker w's rows w·m/W..(w+1)·m/W in (start, stop) tiles of at most
    TILE_QUERIES (the partition _row_tiles and _tile_scores share)."""
    out = []
    for w in range(workers):
        r0, r1 = w * m // workers, (w + 1) * m // workers
        out.append([(rs, min(r1, rs + TILE_QUERIES)) for rs in range(r0, r1, TILE_QUERIES)])
    return out


def _row_tiles(tops: list, qa: torch.Tensor, query_chunk: int, workers: int) -> list[list[tuple]]:
    """Each worker's row tiles of a query block: for worker w, rows w·m/W..(w+1)·m/W of each query chunk's m rows
    in tiles of at most TILE_QUERIES, each as (queries [r, D+1] fp32, then the state views of those rows in the
    order of knnlm.search._select.select_tile's arguments). Views, made once per block: the scan's inner loop slices nothing."""
    out = [[] for _ in range(workers)]
    for top, qs in zip(tops, range(0, qa.shape[0], query_chunk)):
        for w, spans in enumerate(_worker_rows(top.s.shape[0], workers)):
            for rs, re in spans:
                out[w].append((qa[qs + rs:qs + re], top.thr_np[rs:re], top.buf_s[rs:re], top.buf_i[rs:re],
                               top.fill[rs:re], top.s[rs:re], top.i[rs:re]))
    return out


def _scan_tiles(rows: list[list[tuple]], xa: torch.Tensor, col_ids: np.ndarray, pool: ThreadPoolExecutor | None,
                tiles: list[torch.Tensor]) -> None:
    """Offer one key chunk (xa [n, D+1] fp32, col_ids [n] int64) to every query of the block on the CPU: worker w
    takes its row tiles rows[w] (_row_tiles) and, key tile by key tile (TILE_KEYS), computes the scores into its own
    buffer tiles[w] with a one-thread GEMM (cpu_gemm's library) and offers them at once to its rows
    (knnlm.search._select.select_tile). Rows are disjoint, so the workers share no state."""
    from ._select import select_tile

    n = xa.shape[0]
    keys = [(xa[ts:ts + TILE_KEYS].T, col_ids[ts:ts + TILE_KEYS]) for ts in range(0, n, TILE_KEYS)]
    if _CPU_GEMM == "numpy":
        keys = [(x.numpy(), c) for x, c in keys]

    # worker threads do not inherit the caller's torch.inference_mode; buffers made under it are inference tensors,
    # which may be written in place only inside it
    inference = torch.is_inference_mode_enabled()

    def work(w: int) -> None:
        with torch.inference_mode(inference):
            _work(w)

    def _work(w: int) -> None:
        flat, views = tiles[w], {}
        for q, *state in rows[w]:
            if _CPU_GEMM == "numpy":
                q = q.numpy()
            for xt, c in keys:
                shape = (q.shape[0], xt.shape[1])
                if shape not in views:  # C-contiguous, also for a short last tile
                    sc = flat[:shape[0] * shape[1]].view(shape)
                    views[shape] = (sc.numpy(), sc.numpy() if _CPU_GEMM == "numpy" else sc)
                sc_np, sc = views[shape]
                if _CPU_GEMM == "numpy":
                    np.matmul(q, xt, out=sc)
                else:
                    torch.mm(q, xt, out=sc)
                select_tile(sc_np, c, *state)

    with _one_thread_gemm():
        if pool is None:
            work(0)
        else:
            list(pool.map(work, range(len(tiles))))  # re-raises a worker's error


def _kth_best(sc: torch.Tensor, k: int) -> torch.Tensor:
    """[m] the k-th largest score of each row of sc [m, n] (n ≥ k), by a radix select per row
    (knnlm.search._select.rows_kth_largest)."""
    from ._select import rows_kth_largest

    out = np.empty(sc.shape[0], dtype=np.float32)
    rows_kth_largest(np.ascontiguousarray(sc.numpy()), k, out)
    return torch.from_numpy(out)


def _kth_bound(sc: torch.Tensor, k: int) -> torch.Tensor:
    """[m] a lower bound of the k-th largest score of each row of sc [m, n] (n ≥ k): the k-th largest of the group
    maxima, for the largest power of two g that leaves ≥ 4k groups of g scores (≥ k scores reach it: one per group).
    Group j holds the scores j, j + n/g, j + 2n/g, ...: its maximum is an elementwise max of g contiguous slabs
    (memory speed), and the k-th largest of the n/g maxima comes from a radix select. Measured at [1,024, 32,768],
    k = 1,024 (g = 8): 0.02 s, against 0.05 s for torch.amax over consecutive runs of 8 plus torch.topk and 0.85 s for
    the exact k-th best by np.partition; on normal scores 3.5 % of a row reaches it, against 3.1 % for the exact
    k-th best."""
    m, n = sc.shape
    g = 1
    while n // (2 * g) >= 4 * k and n % (2 * g) == 0:
        g *= 2
    if g == 1:
        return _kth_best(sc, k)
    return _kth_best(sc.view(m, g, n // g).amax(1), k)


def _load_keys(reader: KeyReader, start: int, stop: int, xbuf: torch.Tensor, metric: str) -> torch.Tensor:
    """Rows start..stop as fp32 [x, −|x|²/2] (L2) or [x, 0] (IP) in the reused buffer xbuf [≥ stop-start, D+1]."""
    d = reader.d
    xa = xbuf[:stop - start]
    xa[:, :d].copy_(torch.as_tensor(reader.read(start, stop)))
    if metric == "l2":
        torch.linalg.vector_norm(xa[:, :d], dim=1, out=xa[:, d]).square_().mul_(-0.5)
    return xa


def _seed_thresholds(tops: list, qa: torch.Tensor, reader: KeyReader, xbuf: torch.Tensor, sbuf: torch.Tensor,
                     metric: str, query_chunk: int, runs: int, n: int) -> None:
    """Start every query's threshold at a lower bound of its final k-th best score, from a key sample.

    The sample is `runs` evenly spaced runs of key_chunk // runs contiguous keys among the first n of the scan (the
    smallest of nested subsets, so the bound holds for each of them). The k-th best score in the
    sample is ≤ the final k-th best, so the bound is safe, and the scan's first chunks no longer pass most of
    their scores as candidates.
    """
    key_chunk = xbuf.shape[0]
    run = key_chunk // max(1, runs) // GROUP * GROUP
    k = tops[0].k
    if runs <= 0 or run == 0 or runs * run < k or n < runs * run * 4:
        return
    for j, start in enumerate(np.linspace(0, n - run, runs).astype(np.int64)):
        _load_keys(reader, int(start), int(start) + run, xbuf[j * run:(j + 1) * run], metric)  # fills xbuf in place
    xa = xbuf[:runs * run]
    for top, qs in zip(tops, range(0, qa.shape[0], query_chunk)):
        sc = sbuf[:top.s.shape[0], :xa.shape[0]]
        torch.mm(qa[qs:qs + top.s.shape[0]], xa.T, out=sc)
        top.thr = torch.maximum(top.thr, sc.topk(k, dim=1, sorted=False).values.amin(1))  # k-th best of the sample


@torch.no_grad()
def exact_topk(keys: np.ndarray, queries: np.ndarray, k: int, metric: str, key_chunk: int = 32768,
               query_chunk: int = 1024, query_block: int = 16384, rows: np.ndarray | None = None, sample_runs: int = 16,
               device: str | None = None, progress: bool = True, stops: list[int] | None = None,
               out: list[tuple[np.ndarray, np.ndarray]] | None = None, span: tuple[int, int] | None = None):
    """Exact top-k neighbours of each query over all keys (the sharded exact search of the paper, Sec. 5).

    keys: [N, D] float16/float32 (memmap ok), queries: [T, D] float32, k ≤ N (or ≤ len(rows)),
    metric 'l2' | 'ip'; rows: optional sorted int64 datastore row ids to search a subset of the keys.
    Returns (ids [T, k] int64 datastore row ids sorted closest first, ties by ascending id, dists [T, k] float32
    in faiss convention). L2 ranks by q·x − |x|²/2 (the query norm is added back at the end), accumulated in fp32.
    sample_runs: contiguous runs of keys (key_chunk keys in all) scored first to seed the thresholds (0 = off).
    Peak memory ≈ query_chunk × key_chunk × 4 bytes (score buffer) + query_block × k × 12 bytes (running
    top-k) + one key chunk, independent of N. Raises ValueError on a bad metric, k, rows or stops.
    On the CPU, torch.get_num_threads() worker threads share the scan (module doc); while they run, the process's
    GEMM library is held at one thread per call (torch.set_num_threads(1), or numpy's BLAS through threadpoolctl)
    and restored after each key chunk, so other torch work in the same process meanwhile also runs on one thread.
    stops: nested subsets in one scan (Sec. 5's datastore sizes): increasing positions in the scanned rows, the
    last = N (or len(rows)); the result at stop s is the exact top-k of rows[:s], taken when the scan passes s.
    Then returns [(ids, dists)], one pair per stop ([T, k] each), instead of one pair.
    out: one (ids [T, k] integer, dists [T, k] float32) pair per stop to fill instead of new arrays, e.g. writable
    memmaps of the outputs (then the results are never whole in RAM); returned as above.
    span: (start, stop) positions of the scan (of all keys, or of rows) to search, one shard of it
    (knnlm.datastore.stores.shard_spans, nested_shards): the top-k of those keys, ids still datastore row ids;
    k ≤ stop − start. With stops, they count from start. merge_topk combines the shards' results into the exact top-k of all of them.
    """
    from ._select import ties_by_id

    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    reader = KeyReader(keys, rows, span)
    n, t = reader.n, queries.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, N={n}], found {k}")
    cuts = [n] if stops is None else [int(x) for x in stops]
    if not cuts or cuts[-1] != n or cuts[0] < k or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"stops must increase from >= k={k} to N={n}, found {stops}")
    dev = _device(device)
    group = GROUP if dev.type != "cpu" else CPU_GROUP  # score blocks are padded to a multiple of it
    key_chunk = max(CPU_GROUP, key_chunk // CPU_GROUP * CPU_GROUP)
    outs = out or [(np.empty((t, k), dtype=np.int64), np.empty((t, k), dtype=np.float32)) for _ in cuts]
    if len(outs) != len(cuts) or any(a.shape != (t, k) or b.shape != (t, k) for a, b in outs):
        raise ValueError(f"out must hold {len(cuts)} (ids, dists) pairs of shape {(t, k)}, found "
                         f"{[(a.shape, b.shape) for a, b in outs]}")
    d = reader.d
    sbuf = torch.empty((min(query_chunk, t), key_chunk), device=dev)
    xbuf = torch.zeros((key_chunk, d + 1), device=dev)  # fp32 keys plus the L2 bias column (0 for IP)
    segments = list(zip([0] + cuts[:-1], cuts))
    workers = max(1, torch.get_num_threads()) if dev.type == "cpu" else 0
    pool = ThreadPoolExecutor(workers, thread_name_prefix="exact") if workers > 1 else None
    tiles = [torch.empty(TILE_QUERIES * TILE_KEYS) for _ in range(workers)]  # each worker's score tile
    n_chunks = sum(-(-(b - a) // key_chunk) for a, b in segments)
    bar = tqdm(total=n_chunks * (-(-t // query_block)), desc=f"exact {metric}", unit=" chunk", disable=not progress,
               mininterval=10)
    try:
        # memmaps of every token's queries and of the outputs: each block's pages leave the RSS after the block
        for bs, be in iter_chunks(t, query_block, queries, *(a for pair in outs for a in pair)):
            qb = torch.as_tensor(np.array(queries[bs:be], dtype=np.float32), device=dev)
            nb = qb.shape[0]
            qa = torch.cat([qb, torch.ones((nb, 1), device=dev)], 1)  # [q, 1] · [x, −|x|²/2] = q·x − |x|²/2
            tops = [_RunningTopK(min(query_chunk, nb - qs), k, dev) if dev.type != "cpu"
                    else _RunningTopKCPU(min(query_chunk, nb - qs), k) for qs in range(0, nb, query_chunk)]
            row_tiles = _row_tiles(tops, qa, query_chunk, workers) if workers else None
            if dev.type != "cpu":  # the CPU seeds its thresholds from the first key chunk's own scores (below)
                _seed_thresholds(tops, qa, reader, xbuf, sbuf, metric, query_chunk, sample_runs, cuts[0])
            for (seg_start, seg_stop), (out_ids, out_d) in zip(segments, outs):
                for ks in range(seg_start, seg_stop, key_chunk):
                    ke = min(seg_stop, ks + key_chunk)
                    xa = _load_keys(reader, ks, ke, xbuf, metric)
                    if dev.type == "cpu" and ks > 0:  # the first chunk (below) seeds the thresholds
                        _scan_tiles(row_tiles, xa[:ke - ks], reader.ids(ks, ke), pool, tiles)
                        bar.update(1)
                        continue
                    width = -(-(ke - ks) // group) * group
                    col_ids = torch.full((width,), -1, dtype=torch.int64, device=dev)
                    col_ids[:ke - ks] = torch.as_tensor(reader.ids(ks, ke), device=dev)
                    for top, qs in zip(tops, range(0, nb, query_chunk)):
                        qe = min(nb, qs + query_chunk)
                        sc = sbuf[:qe - qs, :width]
                        if dev.type == "cpu":  # the GEMMs of a later chunk's tiles: the same bits as in a shard's scan
                            _tile_scores(qa[qs:qe], xa[:ke - ks], sc[:, :ke - ks], workers)
                        else:
                            _scores(qa[qs:qe], xa, sc[:, :ke - ks])
                        if width > ke - ks:
                            sc[:, ke - ks:].fill_(-torch.inf)
                        if ks == 0 and dev.type == "cpu" and ke - ks >= 4 * k:
                            # a lower bound of the first chunk's k-th best is one of the final k-th best (and of
                            # every nested subset's): starting there, the chunk passes a few k candidates per row
                            # instead of all of them (measured: the first chunk cost 10x a later one)
                            top.thr = torch.maximum(top.thr, _kth_bound(sc[:, :ke - ks], k))
                        top.add_block(sc, col_ids)
                    bar.update(1)
                for top, qs in zip(tops, range(0, nb, query_chunk)):  # the top-k of rows[:seg_stop]; the scan goes on
                    best_s, best_i = top.result()
                    qe = qs + best_s.shape[0]
                    if metric == "l2":
                        best_s = (qb[qs:qe] * qb[qs:qe]).sum(1, keepdim=True) - 2.0 * best_s
                    # best first is distance order (|q|² − 2s is monotone in s, to fp32 rounding): only the ties of
                    # canonical_order are left to put by ascending id
                    best_i = np.ascontiguousarray(best_i.cpu().numpy())
                    best_s = np.ascontiguousarray(best_s.cpu().numpy())
                    ties_by_id(best_i, best_s)
                    out_ids[bs + qs:bs + qe], out_d[bs + qs:bs + qe] = best_i, best_s
    finally:
        reader.close()
        bar.close()
        if pool is not None:
            pool.shutdown()
    return outs[0] if stops is None else outs


def canonical_order(ids: np.ndarray, dists: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of neighbours ([m, k] ids, [m, k] float32 faiss-convention distances) sorted closest first, ties by
    ascending id (missing neighbours, id −1 at ±inf, last): the one order of a top-k, whichever search or merge
    found it."""
    order = np.lexsort((ids, dists if metric == "l2" else -dists), axis=-1)
    return np.take_along_axis(ids, order, 1), np.take_along_axis(dists, order, 1)


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], k: int, metric: str, out: tuple[np.ndarray, np.ndarray],
               block: int = 16384, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k of a datastore from the top-k of its shards (disjoint key ranges, exact_topk's `span`).

    parts: one (ids [T, k_s] integer, dists [T, k_s] float32) pair per shard (memmaps ok; k_s may differ; id −1 =
    no neighbour, at +inf for 'l2' and −inf for 'ip'); out: (ids [T, k], dists [T, k]) to fill, e.g. writable
    memmaps. Each row keeps its k closest candidates, ties at the k-th distance by ascending id, sorted as
    canonical_order: the same ids and distances as one search over every shard's keys (up to which of equally
    distant keys at the k-th place is kept), whatever k (the merge lifts k above one search's limit, such as
    faiss-GPU's 2,048). Memory: one block of queries' candidates, at most `block` queries and about MERGE_BYTES.
    Raises ValueError on a bad metric, shapes or k above the candidates.
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', found {metric!r}")
    t = out[0].shape[0]
    width = sum(p[0].shape[1] for p in parts)
    if any(a.shape[0] != t or a.shape != b.shape for a, b in parts) or out[0].shape != (t, k) or out[1].shape != (t, k):
        raise ValueError(f"parts must be (ids, dists) pairs of {t} rows and out ({t}, {k}) arrays, found "
                         f"{[(a.shape, b.shape) for a, b in parts]} and {(out[0].shape, out[1].shape)}")
    if not 1 <= k <= width:
        raise ValueError(f"k must be in [1, {width}] (the shards' candidates per query), found {k}")
    block = max(1, min(block, MERGE_BYTES // (width * 48)))  # ids, distances, keys, ranks and their copies per row
    parts = [p for p in parts if p[0].shape[1]]  # a shard with no keys gives no candidates
    bar = tqdm(total=-(-t // block), desc=f"merge {metric}", unit=" block", disable=not progress, mininterval=10)
    for s, e in iter_chunks(t, block, *(a for p in parts for a in p), *out):  # each block's pages leave the RSS after it
        bar.update(1)
        ids = np.concatenate([np.asarray(p[0][s:e], dtype=np.int64) for p in parts], 1)
        d = np.concatenate([np.asarray(p[1][s:e], dtype=np.float32) for p in parts], 1)
        key = d if metric == "l2" else -d
        kth = np.partition(key, k - 1, axis=1)[:, k - 1:k]  # each row's k-th smallest key
        # keys below it all enter; of those equal to it, the smallest ids fill the rest
        rank = np.where(key < kth, np.iinfo(np.int64).min, np.where(key == kth, ids, np.iinfo(np.int64).max))
        pick = np.argpartition(rank, k - 1, axis=1)[:, :k]
        out[0][s:e], out[1][s:e] = canonical_order(np.take_along_axis(ids, pick, 1), np.take_along_axis(d, pick, 1),
                                                   metric)
    bar.close()
    return out
