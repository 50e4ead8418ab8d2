"""Per-token and per-word analyses of the kNN-LM behind the paper's App. D (which words gain from approximate
neighbours) and App. E (the hypotheses it rejects): bigram entropies (Eq. 10-11), the positions of a token in its
context window and its document (E.3), the un-argmaxable rows of an output matrix (E.4, Demeter et al. 2020; Grivas et al. 2022) and sparsified LM distributions (E.2).
"""
from __future__ import annotations

import numpy as np

# --- bigram entropy (App. D, Eq. 10-11) ---------------------------------------------------------------------------


def bigram_counts(stream, vocab: int, chunk: int = 1 << 24) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts of the bigrams (stream[i], stream[i + 1]) of a token stream [N] (ints < vocab; a memmap is read
    `chunk` tokens at a time): (first [B] int64, second [B] int64, count [B] int64), one entry per distinct bigram.
    Raises ValueError for a token outside [0, vocab)."""
    n = len(stream)
    code = np.zeros(0, np.int64)
    cnt = np.zeros(0, np.int64)
    for a in range(0, max(n - 1, 0), chunk):  # merged after every chunk: memory ~ the distinct bigrams, not N
        s = np.asarray(stream[a:min(n, a + chunk + 1)], dtype=np.int64)
        if len(s) and (s.min() < 0 or s.max() >= vocab):
            raise ValueError(f"bigram_counts: token ids must lie in [0, {vocab}), found [{s.min()}, {s.max()}]")
        c, k = np.unique(s[:-1] * vocab + s[1:], return_counts=True)
        code, inv = np.unique(np.concatenate([code, c]), return_inverse=True)
        cnt = np.bincount(inv, weights=np.concatenate([cnt, k]), minlength=len(code)).astype(np.int64)
    return code // vocab, code % vocab, cnt


def token_counts(stream, vocab: int, chunk: int = 1 << 24) -> np.ndarray:
    """[vocab] int64 occurrences of each token id in `stream` [N] (a memmap is read `chunk` tokens at a time)."""
    out = np.zeros(vocab, dtype=np.int64)
    for a in range(0, len(stream), chunk):
        out += np.bincount(np.asarray(stream[a:a + chunk], dtype=np.int64), minlength=vocab)[:vocab]
    return out


def bigram_entropy(stream, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward and backward bigram entropy of every word type (Xu et al. 2023, App. D, Eq. 10-11), in nats:
    H_fwd(w) = −Σ p(a | w) log p(a | w) over the words a that follow w in `stream` [N], H_bwd(w) the same over the
    words b before w. Returns (H_fwd [vocab], H_bwd [vocab], count [vocab]) float64, float64, int64; nan for a type
    with no bigram in that direction."""
    first, second, cnt = bigram_counts(stream, vocab)
    c = cnt.astype(np.float64)
    clogc = c * np.log(np.maximum(c, 1))

    def entropy(of):
        n = np.bincount(of, weights=c, minlength=vocab)
        s = np.bincount(of, weights=clogc, minlength=vocab)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n > 0, np.log(np.maximum(n, 1)) - s / np.maximum(n, 1), np.nan)

    count = np.bincount(first, weights=c, minlength=vocab).astype(np.int64)
    return entropy(first), entropy(second), count


# --- slopes and correlations from per-document sums ---------------------------------------------------------------

# --- positions (E.3) ------------------------------------------------------------------------------------------------


def window_positions(n: int, tokens_per_sample: int, context_window: int) -> np.ndarray:
    """How many tokens of context each of n targets of a split had when it was scored (fairseq-eval-lm
    --context-window C semantics, knnlm.datastore.dump / knnlm.lm.windows.windows: blocks of L − C new tokens, each fed
    with up to C previous tokens): min(t, C + t mod (L − C)) for target t. [n] int64. Raises ValueError if C >= L."""
    if context_window >= tokens_per_sample:
        raise ValueError(f"context window {context_window} must be < tokens_per_sample {tokens_per_sample}")
    t = np.arange(n, dtype=np.int64)
    return np.minimum(t, context_window + t % (tokens_per_sample - context_window))


def document_positions(doc: np.ndarray) -> np.ndarray:
    """The index of each token within its document (0 for a document's first token), for doc [T] ids of tokens in
    split order (a document's tokens are contiguous). [T] int64."""
    doc = np.asarray(doc)
    t = np.arange(len(doc), dtype=np.int64)
    start = np.r_[True, doc[1:] != doc[:-1]] if len(doc) else np.zeros(0, bool)
    return t - np.maximum.accumulate(np.where(start, t, 0))


def position_fraction(pos: np.ndarray, doc: np.ndarray | None = None, lo: float | None = None,
                      hi: float | None = None) -> np.ndarray:
    """Where each token lies in its range of positions, in [0, 1): pos / its document's length when doc [T] is given
    (document_positions), else (pos − lo) / (hi − lo + 1), lo and hi by default the least and greatest position over
    all tokens (window_positions). A position outside [lo, hi] gets nan, so it falls in no quarter (quarter_sums):
    with lo = C, hi = L − 1 the window's quarters are those of the tokens scored with a full context window (the
    split's first block, scored with fewer than C tokens of context, is left out). [T] float64."""
    pos = np.asarray(pos, dtype=np.float64)
    if doc is not None:
        doc = np.asarray(doc)
        return pos / np.bincount(doc)[doc]
    lo = (pos.min() if len(pos) else 0.0) if lo is None else float(lo)
    hi = (pos.max() if len(pos) else 0.0) if hi is None else float(hi)
    frac = (pos - lo) / (hi - lo + 1)
    return np.where((pos >= lo) & (pos <= hi), frac, np.nan)


def quarter_sums(frac: np.ndarray, y: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document sums for the difference of mean y between the last and the first quarter of positions (App. E.3
    as an effect in y's unit, e.g. nats of per-token NLL): [n_docs, 4] float64 = (Σ y, count) over tokens with
    frac < 0.25, then over tokens with frac ≥ 0.75 (frac: position_fraction). Statistic: quarter_difference."""
    frac, y = np.asarray(frac, dtype=np.float64), np.asarray(y, dtype=np.float64)
    first, last = frac < 0.25, frac >= 0.75
    cols = [y * first, first.astype(np.float64), y * last, last.astype(np.float64)]
    return np.stack([np.bincount(doc, weights=c, minlength=n_docs) for c in cols], axis=1)


def quarter_difference(sums: np.ndarray) -> np.ndarray:
    """Mean y over the last quarter of positions minus mean y over the first, from totals [..., 4] of quarter_sums:
    [..., 1]. nan where a quarter holds no token."""
    s = np.asarray(sums, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (s[..., 2] / s[..., 3] - s[..., 0] / s[..., 1])[..., None]


# --- stolen probabilities (E.4) ------------------------------------------------------------------------------------


def argmax_candidates(w: np.ndarray, iters: int = 50, chunk: int = 512) -> np.ndarray:
    """Rows of w [V, D] proven argmaxable by a witness: h with w_i·h > w_j·h for every j ≠ i, tried first at
    h = w_i − mean(w), then refined by perceptron steps h += w_i − w_j* (j* the current best other row). [V] bool;
    False means "not proven" (knnlm.scoring.analysis.argmaxable decides those by linear programming). Memory: one
    [chunk, V] float64 score block."""
    w = np.asarray(w, dtype=np.float64)
    v = len(w)
    ok = np.zeros(v, dtype=bool)
    for a in range(0, v, chunk):
        rows = np.arange(a, min(v, a + chunk))
        h = w[rows] - w.mean(0)
        for _ in range(iters + 1):
            s = h @ w.T  # [c, V]
            own = s[np.arange(len(rows)), rows].copy()
            s[np.arange(len(rows)), rows] = -np.inf
            j = s.argmax(1)
            won = own > s[np.arange(len(rows)), j]
            ok[rows[won]] = True
            if won.all():
                break
            rows, h, j = rows[~won], h[~won], j[~won]
            h = h + (w[rows] - w[j]) / np.maximum(np.linalg.norm(w[rows] - w[j], axis=1, keepdims=True), 1e-12)
    return ok


def lp_argmaxable(w: np.ndarray, i: int) -> tuple[bool, float]:
    """Whether row i of w [V, D] can be the strict argmax of w·h for some h (Demeter et al. 2020): the largest
    margin t of w_i·h − w_j·h ≥ t (j ≠ i) over h in [−1, 1]^D, by linear programming (scipy.optimize.linprog,
    HiGHS). Returns (t > 1e-9, t). A row inside the convex hull of the others (or equal to another) has t ≤ 0."""
    from scipy.optimize import linprog

    w = np.asarray(w, dtype=np.float64)
    d = w.shape[1]
    others = np.delete(w, i, axis=0) - w[i]  # (w_j − w_i)·h + t ≤ 0
    a_ub = np.hstack([others, np.ones((len(others), 1))])
    res = linprog(np.r_[np.zeros(d), -1.0], A_ub=a_ub, b_ub=np.zeros(len(others)),
                  bounds=[(-1, 1)] * d + [(None, 1)], method="highs")
    if res.status != 0:
        raise RuntimeError(f"linprog failed for row {i}: {res.message}")
    t = -float(res.fun)
    return t > 1e-9, t


def argmaxable(w: np.ndarray, max_lp: int | None = None) -> dict:
    """Which rows of an output matrix w [V, D] can be the argmax (Xu et al. 2023, App. E.4; the check of Grivas et
    al. 2022: a fast witness search, then an exact LP for the rest). max_lp: at most this many LPs (the rest are
    'unresolved'). Returns {'rows': V, 'witness': proven by a witness, 'lp_checked', 'unargmaxable': [row ids],
    'unresolved': [row ids]}."""
    ok = argmax_candidates(w)
    todo = np.flatnonzero(~ok)
    checked = todo if max_lp is None else todo[:max_lp]
    bad = [int(i) for i in checked if not lp_argmaxable(w, int(i))[0]]
    return {"rows": int(len(w)), "witness": int(ok.sum()), "lp_checked": int(len(checked)), "unargmaxable": bad,
            "unresolved": [int(i) for i in todo[len(checked):]]}


# --- sparsified distributions (E.2) --------------------------------------------------------------------------------


def topk_log_prob(logits: np.ndarray, targets: np.ndarray, k: int, temperature: float) -> np.ndarray:
    """log p(target) under the LM's distribution kept to its k most probable tokens and renormalised at
    `temperature`: softmax(logits[top-k] / T); −inf for a target outside the top k (Xu et al. 2023, App. E.2).
    logits [t, V] float, targets [t] int; returns [t] float64."""
    logits = np.asarray(logits, dtype=np.float64)
    part = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(logits, part, 1) / temperature
    m = top.max(1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(top - m).sum(1))
    tl = logits[np.arange(len(targets)), targets] / temperature
    inside = (part == targets[:, None]).any(1)
    return np.where(inside, tl - lse, -np.inf)


def topk_log_prob_grid(logits: np.ndarray, targets: np.ndarray, ks: list[int], temperatures: list[float]) -> np.ndarray:
    """topk_log_prob for every (k, temperature) at once: [len(ks), len(temperatures), t] float64, from one selection
    of the top max(ks) logits per row (np.partition of the values, then a sort of those; the log-sum-exp of each
    top-k prefix from a cumulative sum in float64). logits [t, V] float32 or float64 (float32 logits are selected in
    float32: the same values and ranks), targets [t] int; every k ≤ V."""
    lg = np.asarray(logits)
    if lg.dtype not in (np.float32, np.float64):
        lg = lg.astype(np.float64)
    t, kmax = len(lg), max(ks)
    v = lg.shape[1]
    top = np.sort(np.partition(lg, v - kmax, axis=1)[:, v - kmax:], axis=1)[:, ::-1].astype(np.float64)  # descending
    tl = lg[np.arange(t), targets]
    rank = (lg > tl[:, None]).sum(1)  # the target's rank (0 = the best); ties share the best rank
    tl = tl.astype(np.float64)
    shifted = top - top[:, :1]  # ≤ 0
    out = np.empty((len(ks), len(temperatures), t))
    for j, temp in enumerate(temperatures):
        lse = np.log(np.cumsum(np.exp(shifted / temp), 1)) + top[:, :1] / temp
        for i, k in enumerate(ks):
            out[i, j] = np.where(rank < k, tl / temp - lse[:, k - 1], -np.inf)
    return out


GEMM_ROWS = 64  # rows per GEMM of fixed_shape_matmul


def fixed_shape_matmul(x: np.ndarray, wt: np.ndarray, rows: int = GEMM_ROWS) -> np.ndarray:
    """x [n, D] · wt [D, V] → [n, V] float32, in GEMMs of `rows` rows of x (the last block padded with zeros), so every
    call has one shape: a row's result is the same bits whether it is computed with few or many others (a BLAS may
    take another kernel, with other roundings, for a matrix of few rows: OpenBLAS on an AMD EPYC does for 7 rows
    against 300). Callers that split a stream into pieces start each piece at a multiple of `rows`."""
    x = np.asarray(x, dtype=np.float32)
    wt = np.asarray(wt, dtype=np.float32)
    out = np.empty((x.shape[0], wt.shape[1]), dtype=np.float32)
    block = np.zeros((rows, x.shape[1]), dtype=np.float32)
    scores = np.empty((rows, wt.shape[1]), dtype=np.float32)
    for r in range(0, x.shape[0], rows):
        e = min(x.shape[0], r + rows)
        block[:e - r] = x[r:e]
        block[e - r:] = 0.0
        np.matmul(block, wt, out=scores)
        out[r:e] = scores[:e - r]
    return out


def output_embedding_scores(queries: np.ndarray, w_sm: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """−‖W_sm[v_i] − h‖² for the retrieved tokens v_i [t, k] of each query h [t, D] (Xu et al. 2023, App. E.1: the
    kNN scores replaced by the distance to the LM's output embedding of each neighbour's token), as
    2 h·w − ‖w‖² − ‖h‖² from one [t, V] product (fixed_shape_matmul). [t, k] float64; −inf where token_ids is −1
    (no neighbour)."""
    q = np.asarray(queries, dtype=np.float32)
    w = np.asarray(w_sm, dtype=np.float32)
    valid = token_ids >= 0
    ids = np.where(valid, token_ids, 0)
    # the [t, k] gathered, not the [t, V] product, in fp64; the product the same bits for a query in any chunking
    qw = np.take_along_axis(fixed_shape_matmul(q, w.T), ids, 1).astype(np.float64)
    w_sq = (w.astype(np.float64) ** 2).sum(1)
    s = 2 * qw - w_sq[ids] - (q.astype(np.float64) ** 2).sum(1)[:, None]
    return np.where(valid, s, -np.inf)


def unique_tokens(token_ids: np.ndarray) -> np.ndarray:
    """token_ids [t, k] with every repeat of a token in a row replaced by −1 (each token kept once; −1 = none)."""
    srt = np.sort(np.asarray(token_ids), axis=1)
    first = np.ones(srt.shape, dtype=bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    return np.where(first & (srt >= 0), srt, -1)


def subset_log_prob(logits: np.ndarray, targets: np.ndarray, token_ids: np.ndarray, temperature: float,
                    dedup: bool) -> np.ndarray:
    """log p(target) under the LM's distribution restricted to the tokens retrieved by the kNN search (Xu et al.
    2023, App. E.2: the kNN's choice of tokens, not its distances): p(v) ∝ c_v · exp(logit_v / T) with c_v the
    number of neighbours whose value is v (dedup=False) or 1[v retrieved] (dedup=True); −inf for a target not
    retrieved. logits [t, V], targets [t], token_ids [t, k] the retrieved neighbours' values (−1 = no neighbour).
    The float64 reference of subset_log_prob_grid (a sum of exponentials per row, nothing shared between
    temperatures); [t] float64."""
    logits = np.asarray(logits, dtype=np.float64)
    tokens = unique_tokens(token_ids) if dedup else np.asarray(token_ids)
    t = len(tokens)
    valid = tokens >= 0
    ids = np.where(valid, tokens, 0)
    s0 = np.where(valid, np.take_along_axis(logits, ids, 1) / temperature, -np.inf)
    m0 = s0.max(1, keepdims=True)
    m0 = np.where(np.isfinite(m0), m0, 0.0)
    hit = ((ids == targets[:, None]) & valid).sum(1)
    tl = logits[np.arange(t), targets] / temperature
    with np.errstate(divide="ignore"):
        lse = m0[:, 0] + np.log(np.exp(s0 - m0).sum(1))
        return np.where(hit > 0, np.log(np.maximum(hit, 1)) + tl - lse, -np.inf)


def subset_log_prob_grid(logits: np.ndarray, targets: np.ndarray, token_ids: np.ndarray,
                         temperatures: list[float]) -> np.ndarray:
    """subset_log_prob (dedup=False) at every temperature of `temperatures`: [len(temperatures), t] float64. The
    restricted distribution is a softmax over the retrieved entries whose mass on the target is that of the entries
    holding it, i.e. p_kNN with the gathered logits as scores: one gather, then the τ sweep's kernel
    (knnlm.scoring.interpolation.sweep_temperature: every temperature per row while it is in cache, float32
    denominators, ~1e-6 relative to subset_log_prob). Callers pass unique_tokens(token_ids) for the deduplicated
    variant. Temperatures > 0."""
    from .interpolation import sweep_temperature

    lg = np.asarray(logits)
    tokens = np.asarray(token_ids)
    valid = tokens >= 0
    ids = np.where(valid, tokens, 0)
    scores = np.take_along_axis(lg, ids, 1)
    hit = (ids == np.asarray(targets)[:, None]) & valid
    if any(not float(x) > 0 for x in temperatures):
        raise ValueError(f"temperatures must be > 0, found {list(temperatures)}")
    return sweep_temperature(np.where(valid, scores, 0), hit, valid, temperatures)


# --- ensembles (E.5) -----------------------------------------------------------------------------------------------


def mixture_weights(log_probs, iters: int = 1000, tol: float = 1e-10) -> np.ndarray:
    """Weights w [M] (w ≥ 0, Σ w = 1) of the mixture Σ_m w_m p_m(target) that maximise the likelihood of M models'
    log p(target) [M][T] (Xu et al. 2023, App. E.5: ensembles with weights tuned on valid), by EM for mixture
    weights of fixed components (each step raises the likelihood). Stops when no weight moves by more than tol.
    A token where every component has p = 0 is left out. The probabilities are scaled per token by the best
    component's once (p_m / max_m p_m, in (0, 1], no overflow; a scale common to a token's components cancels in its
    posterior), so an EM step is products and sums, no exp or log."""
    lp = np.asarray(np.stack([np.asarray(x, dtype=np.float64) for x in log_probs]))
    lp = lp[:, np.isfinite(lp).any(0)]
    m = len(lp)
    p = np.exp(lp - lp.max(0))  # [M, T], the best component of each token at 1
    w = np.full(m, 1.0 / m)
    for _ in range(iters):
        mix = w @ p  # [T] Σ_m w_m p_m (scaled), ≥ min(w) > 0
        new = w * (p @ (1.0 / mix)) / p.shape[1]  # the mean posterior of each component
        if np.abs(new - w).max() < tol:
            return new
        w = new
    return w


def mixture_log_prob(log_probs, weights: np.ndarray) -> np.ndarray:
    """log Σ_m w_m p_m(target) [T] float64 of M models' log p(target) [M][T] and weights [M]."""
    lp = np.stack([np.asarray(x, dtype=np.float64) for x in log_probs])
    with np.errstate(divide="ignore"):
        return np.logaddexp.reduce(np.log(np.asarray(weights, dtype=np.float64))[:, None] + lp, axis=0)
