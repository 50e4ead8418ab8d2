"""numba kernels of the exact search's running top-k on the CPU (knnlm.search.exact._RunningTopKCPU).

select_groups: for every row (in parallel), the groups of consecutive scores whose maximum (computed beforehand)
reaches the row's threshold are scanned; a score ≥ the threshold is appended to the row's candidate buffer; a full
buffer is merged with the row's top-k (merge_row), which raises the threshold to the new k-th best. merge_buffers:
the final merge of what is left in the buffers. Scores are float32, ids int64.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic


@njit(cache=True, inline='always')
def _order_key(bits):
    """The uint32 whose unsigned order is the float32 order of the float whose bits are `bits` (−inf lowest)."""
    u = np.uint32(bits)
    return ~u if u & np.uint32(0x80000000) else u | np.uint32(0x80000000)


@njit(cache=True)
def kth_largest(a, na, b, nb, k):
    """The k-th largest of the float32 values a[:na] ∪ b[:nb] (1 ≤ k ≤ na + nb; no NaN), by a radix select: four
    passes over the values, each a 256-bucket histogram of the next 8 bits of the order key among the values that
    share the bits fixed so far. Measured in merge_row (k = 1,024 kept ∪ 1,024 buffered, 1,024 rows): 0.009–0.011 s
    vs 0.022 s with numba's np.partition (quickselect), i.e. 2.0–2.4x."""
    a_bits, b_bits = a.view(np.uint32), b.view(np.uint32)
    hist = np.zeros(256, dtype=np.int64)
    prefix, mask = np.uint32(0), np.uint32(0)
    rank = k
    for p in range(4):
        shift = np.uint32(24 - 8 * p)
        hist[:] = 0
        for i in range(na):
            u = _order_key(a_bits[i])
            if (u & mask) == prefix:
                hist[(u >> shift) & np.uint32(255)] += 1
        for i in range(nb):
            u = _order_key(b_bits[i])
            if (u & mask) == prefix:
                hist[(u >> shift) & np.uint32(255)] += 1
        bucket = 255
        while hist[bucket] < rank:  # the bucket holding the rank-th largest, counted from the top
            rank -= hist[bucket]
            bucket -= 1
        prefix |= np.uint32(bucket) << shift
        mask |= np.uint32(255) << shift
    bits = prefix & np.uint32(0x7FFFFFFF) if prefix & np.uint32(0x80000000) else ~prefix
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@njit(parallel=True, cache=True)
def rows_kth_largest(x, k, out):
    """out[r] = the k-th largest value of row r of x [m, n] float32 (C-contiguous, 1 ≤ k ≤ n), rows in parallel."""
    for r in prange(x.shape[0]):
        out[r] = kth_largest(x[r], x.shape[1], x[r, :0], 0, k)


@njit(cache=True)
def merge_row(top_s, top_i, buf_s, buf_i, f):
    """Merge the first f buffered candidates of one row into its top-k (in place): the k-th best of both is found
    by kth_largest, then the entries above it and as many ties as fit are kept (the top-k's before the buffer's);
    returns the new k-th best score."""
    k = top_s.shape[0]
    kth = kth_largest(top_s, k, buf_s, f, k)
    s = np.empty(k, dtype=np.float32)
    ids = np.empty(k, dtype=np.int64)
    j = 0
    for a in range(k):  # strictly better than the k-th best: fewer than k of them
        if top_s[a] > kth:
            s[j] = top_s[a]
            ids[j] = top_i[a]
            j += 1
    for a in range(f):
        if buf_s[a] > kth:
            s[j] = buf_s[a]
            ids[j] = buf_i[a]
            j += 1
    for a in range(k):  # ties at the k-th best fill the rest, first come first kept
        if j == k:
            break
        if top_s[a] == kth:
            s[j] = kth
            ids[j] = top_i[a]
            j += 1
    for a in range(f):
        if j == k:
            break
        if buf_s[a] == kth:
            s[j] = kth
            ids[j] = buf_i[a]
            j += 1
    top_s[:] = s
    top_i[:] = ids
    return kth


@njit(parallel=True, cache=True)
def select_groups(sc, gmax, col_ids, thr, buf_s, buf_i, fill, top_s, top_i):
    """Offer a [m, n] block of scores (col_ids [n] int64) to the running top-k of its m rows (see the module doc).

    gmax [m, n // G]: the maximum of each run of G = n // gmax.shape[1] consecutive scores (n a multiple of G),
    computed beforehand by a vectorised, multithreaded reduction (torch.amax: ~0.07 ns per score on 2 cores, where
    numba's own max loop was not vectorised and cost ~0.3). thr [m] float32, buf_s/buf_i [m, cap], fill [m] int64,
    top_s/top_i [m, k]: the running state, updated in place."""
    m, n = sc.shape
    ng = gmax.shape[1]
    g_size = n // ng
    cap = buf_s.shape[1]
    for r in prange(m):
        t = thr[r]
        f = fill[r]
        row = sc[r]
        gm = gmax[r]
        pos = np.empty(g_size, dtype=np.int64)
        for g in range(ng):
            if gm[g] < t:
                continue
            base = g * g_size
            c = 0
            for j in range(g_size):  # branch-free compaction of the passing positions (a group has few: 2x faster
                pos[c] = j           # than branching on every score, whose outcome the CPU cannot predict)
                c += row[base + j] >= t
            for a in range(c):
                j = base + pos[a]
                v = row[j]
                if v < t:  # the threshold rose at a merge within this group
                    continue
                if f == cap:
                    kth = merge_row(top_s[r], top_i[r], buf_s[r], buf_i[r], f)
                    f = 0
                    if kth > t:
                        t = kth
                    if v < t:
                        continue
                buf_s[r, f] = v
                buf_i[r, f] = col_ids[j]
                f += 1
        fill[r] = f
        thr[r] = t


@njit(parallel=True, cache=True)
def merge_buffers(buf_s, buf_i, fill, top_s, top_i):
    """Merge every row's remaining candidates into its top-k."""
    for r in prange(top_s.shape[0]):
        if fill[r] > 0:
            merge_row(top_s[r], top_i[r], buf_s[r], buf_i[r], fill[r])
            fill[r] = 0



@njit(parallel=True, cache=True)
def neighbour_hits_kernel(ids, vals, targets, hit, valid):
    """hit[t, j] = ids[t, j] ≥ 0 and vals[ids[t, j]] == targets[t]; valid[t, j] = ids[t, j] ≥ 0 (in place, one pass;
    knnlm.scoring.interpolation.neighbour_hits)."""
    for t in prange(ids.shape[0]):
        y = targets[t]
        for j in range(ids.shape[1]):
            i = ids[t, j]
            ok = i >= 0
            valid[t, j] = ok
            hit[t, j] = ok and vals[i] == y


@njit(parallel=True, cache=True)
def overlap_counts_kernel(approx, exact, out, blocks):
    """out[t] = how many of approx[t]'s ids ≥ 0 occur among exact[t]'s ids ≥ 0 ([T, k] int arrays; out [T] int64;
    knnlm.experiments.retrieval.recall_at_k). Rows in `blocks` parallel blocks (≥ 1), each with its own marker array
    over the ids: a row's exact ids are marked, its approximate ids looked up, the marks cleared (O(k) per row, no
    sort; 10x the per-row sort and binary search it replaces at 16,384 rows x k = 1,024)."""
    t_all = approx.shape[0]
    n = 1
    for t in range(t_all):
        for j in range(exact.shape[1]):
            n = max(n, exact[t, j] + 1)
    blocks = max(1, min(t_all, blocks))
    for blk in prange(blocks):
        mark = np.zeros(n, dtype=np.bool_)
        for t in range(blk * t_all // blocks, (blk + 1) * t_all // blocks):
            for j in range(exact.shape[1]):
                if exact[t, j] >= 0:
                    mark[exact[t, j]] = True
            c = 0
            for j in range(approx.shape[1]):
                a = approx[t, j]
                if 0 <= a < n and mark[a]:
                    c += 1
            out[t] = c
            for j in range(exact.shape[1]):
                if exact[t, j] >= 0:
                    mark[exact[t, j]] = False


@njit(cache=True, fastmath=True, inline='always')
def _distance(x, scale, q, l2):
    """‖q − scale·x‖² (l2) or q · (scale·x) of two float32 [D] rows, summed in float32."""
    acc = np.float32(0.0)
    if l2:
        for c in range(q.shape[0]):
            v = x[c] * scale - q[c]
            acc += v * v
    else:
        for c in range(q.shape[0]):
            acc += x[c] * scale * q[c]
    return acc


PREFETCH_AHEAD = 8  # neighbour_distances_* prefetch the key row this many neighbours ahead (random rows: DRAM latency)
CACHE_LINE = 64  # bytes


@intrinsic
def prefetch(typingctx, arr, row, col):
    """prefetch(arr, row, col): ask the CPU to bring the cache line holding arr[row, col] (a C-contiguous 2-D array)
    into every cache level, without waiting for it (LLVM's llvm.prefetch: read, high locality). A load that only
    touches the line (as `x ^= arr[row, col]`) holds up the retirement of every later instruction until the line
    arrives, so a random row's DRAM latency is paid one row at a time; prefetches let several rows be in flight."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(row, types.Integer)
            and isinstance(col, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        aryty, rowty, colty = sig.args
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], (rowty, colty))]
        ptr = builder.bitcast(cgutils.get_item_pointer(context, builder, aryty, ary, idx), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, locality 3 (keep in all levels), data cache
        return context.get_dummy_value()

    return types.void(arr, row, col), codegen


@njit(cache=True, inline='always')
def _prefetch_row(keys, i):
    """Prefetch every cache line of row i of keys [N, D] (see prefetch)."""
    step = max(1, CACHE_LINE // keys.itemsize)
    for c in range(0, keys.shape[1], step):
        prefetch(keys, i, c)


@njit(cache=True, inline='always')
def _prefetch_neighbour(keys, ids_row, j):
    """Prefetch the key row of neighbour j of a row of ids (nothing for j past the row's end or a missing id < 0)."""
    if j < ids_row.shape[0] and ids_row[j] >= 0:
        _prefetch_row(keys, ids_row[j])


@njit(parallel=True, cache=True, fastmath=True)
def neighbour_distances_f16(keys_bits, queries, ids, l2, out):
    """out[t, j] = ‖q_t − k_{ids[t,j]}‖² (l2) or q_t · k_{ids[t,j]} (ip) in fp32, from fp16 keys given as their
    uint16 bits ([N, D]); ids < 0 give +inf (l2) / −inf (ip). queries [T, D] float32, out [T, k] float32.

    The key row of the neighbour PREFETCH_AHEAD places on is prefetched while this one is computed: the rows are
    random, so the kernel is bound by DRAM latency (2.64M fp16 keys of D = 128, 40,000 queries x 1,024 neighbours,
    2 AMD EPYC Zen 3 cores: 7.1 s touching rows ahead by loads, 2.3-3.0 s prefetching them, the same distances).
    Each key row is converted to fp32 in a reused buffer, branch-free (vectorised): sign, exponent and mantissa
    shifted into an fp32's place, then the distance loop's multiply by 2^112 rebiases the exponent and turns fp16
    subnormals into the right fp32 normals. fp16 inf/NaN would come out finite: the dump refuses non-finite keys."""
    T, k = ids.shape
    D = queries.shape[1]
    two112 = np.float32(5.192296858534828e33)
    for t in prange(T):
        bits = np.empty(D, dtype=np.uint32)
        x = bits.view(np.float32)
        q = queries[t]
        for j in range(PREFETCH_AHEAD):
            _prefetch_neighbour(keys_bits, ids[t], j)
        for j in range(k):
            _prefetch_neighbour(keys_bits, ids[t], j + PREFETCH_AHEAD)
            i = ids[t, j]
            if i < 0:
                out[t, j] = np.inf if l2 else -np.inf
                continue
            row = keys_bits[i]
            for c in range(D):
                h = np.uint32(row[c])
                bits[c] = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
            out[t, j] = _distance(x, two112, q, l2)


@njit(parallel=True, cache=True, fastmath=True)
def neighbour_distances_f32(keys, queries, ids, l2, out):
    """neighbour_distances_f16 for fp32 keys [N, D]."""
    for t in prange(ids.shape[0]):
        q = queries[t]
        for j in range(PREFETCH_AHEAD):
            _prefetch_neighbour(keys, ids[t], j)
        for j in range(ids.shape[1]):
            _prefetch_neighbour(keys, ids[t], j + PREFETCH_AHEAD)
            i = ids[t, j]
            out[t, j] = (np.inf if l2 else -np.inf) if i < 0 else _distance(keys[i], np.float32(1.0), q, l2)


TILE_GROUP = 16  # scores per group in select_tile (a passing group costs TILE_GROUP strided reads)


@njit(nogil=True, cache=True, fastmath={'nnan', 'nsz'})
def select_tile(sc, col_ids, thr, buf_s, buf_i, fill, top_s, top_i):
    """Offer a [m, n] tile of scores (col_ids [n] int64) to the running top-k of its m rows, in the calling thread.

    The single-threaded twin of select_groups for a tile that the same thread has just computed (still in its L2
    cache): group g of a row holds the scores g, g + n/G, g + 2n/G, ... (G = TILE_GROUP), so the group maxima are
    an elementwise max of G contiguous slabs (vectorised; unsigned indices keep numba's negative-index wrap out of
    the loop: 9 G scores/s per core against 2.5 with signed ones); the groups whose maximum reaches the row's
    threshold are read score by score, and the n mod G trailing scores one by one. thr [m] float32, buf_s/buf_i
    [m, cap], fill [m] int64, top_s/top_i [m, k]: the running state of these rows, updated in place. nogil: the
    exact search's worker threads run it side by side on disjoint rows."""
    m, n = sc.shape
    ng = np.uint64(n // TILE_GROUP)
    cap = buf_s.shape[1]
    mx = np.empty(max(n // TILE_GROUP, 1), dtype=np.float32)
    for r in range(m):
        t = thr[r]
        f = fill[r]
        row = sc[r]
        for g in range(ng):
            mx[g] = row[g]
        for s in range(np.uint64(1), np.uint64(TILE_GROUP)):
            o = s * ng
            for g in range(ng):
                mx[g] = max(mx[g], row[o + g])
        for g in range(ng + np.uint64(n) - ng * np.uint64(TILE_GROUP)):
            if g < ng:
                if mx[g] < t:
                    continue
                j0, step, cnt = g, ng, np.uint64(TILE_GROUP)
            else:  # a trailing score
                j0, step, cnt = ng * np.uint64(TILE_GROUP) + (g - ng), np.uint64(1), np.uint64(1)
            for a in range(cnt):
                j = j0 + a * step
                v = row[j]
                if v < t:
                    continue
                # written out as in select_groups: an inline helper returning (t, f) measured ~4 % slower here
                if f == cap:
                    kth = merge_row(top_s[r], top_i[r], buf_s[r], buf_i[r], f)
                    f = 0
                    if kth > t:
                        t = kth
                    if v < t:
                        continue
                buf_s[r, f] = v
                buf_i[r, f] = col_ids[j]
                f += 1
        fill[r] = f
        thr[r] = t


@njit(parallel=True, cache=True)
def ties_by_id(ids, dists):
    """Within each row of (ids [m, k] int64, dists [m, k] float32) already in distance order, reorder every run of
    equal distances by ascending id, in place (insertion sort: runs are short). Together with the distance order this
    is knnlm.search.exact.canonical_order, in O(k) per row instead of a lexsort."""
    for r in prange(ids.shape[0]):
        d, i = dists[r], ids[r]
        k = d.shape[0]
        a = 0
        while a < k:
            b = a + 1
            while b < k and d[b] == d[a]:
                b += 1
            for x in range(a + 1, b):  # ids of the run [a, b)
                v = i[x]
                y = x - 1
                while y >= a and i[y] > v:
                    i[y + 1] = i[y]
                    y -= 1
                i[y + 1] = v
            a = b
