"""Parametric alternatives to the datastore (Xu et al. 2023, Sec. 4 and Appendix C), trained on dumped keys.

The LM is frozen, so its features h_ds (att or ffn) for every training token are exactly the datastore
keys, and the next tokens are its vals: every model here is trained on (keys, vals) and evaluated on the
dumped valid/test queries, without re-running the transformer. Unlike the paper's runs (dropout active in
the frozen body during training), the features are clean (eval-mode) ones.

Models (all give log p(target | h) for a batch of features h [B, D] and targets [B]):
  AggregatedSoftmax -- softmax over R rows (W [R, D]), probabilities summed per word through a sparse
                       aggregation matrix M (Eq. 5's M): learned W_ds (R = V, Table 2), n embeddings per
                       word (R = nV, Table 5), adaptive counts (Table 6), clustered keys with M from the
                       clusters' word frequencies (App. C.3; L2 scores to the centroids).
  MixtureOfSoftmaxes -- R mixtures over W_sm with per-mixture projections of h and a prior softmax(w_π h)
                       (Table 7; W_sm frozen = "MoS only", trainable = "MoS + embed").
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from .config import VARIANT_RE
from .io import ArtifactError, atomic_path, load_checkpoint
from .search.exact import cpu_matmul

log = logging.getLogger(__name__)


class Aggregation:
    """The aggregation matrix M as CSR over words: word w owns rows indices[indptr[w]:indptr[w+1]] with log-weights.

    indptr: [V+1] int64, indices: [E] int64 row ids in [0, R), log_weight: [E] float32 (0 = weight 1).
    p(w) = Σ_{e of w} exp(log_weight[e]) · softmax(logits)[indices[e]].
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, log_weight: np.ndarray | None = None):
        self.indptr = torch.as_tensor(np.asarray(indptr, dtype=np.int64))
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        self.log_weight = (torch.zeros(len(self.indices)) if log_weight is None
                           else torch.as_tensor(np.asarray(log_weight, dtype=np.float32)))
        if self.indptr[-1] != len(self.indices) or len(self.log_weight) != len(self.indices):
            raise ValueError("aggregation CSR arrays disagree in length")

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> "Aggregation":
        """Word w owns counts[w] ≥ 1 consecutive rows (n embeddings per word, adaptive counts)."""
        counts = np.asarray(counts, dtype=np.int64)
        if (counts < 1).any():
            raise ValueError("every word needs at least one row")
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return cls(indptr, np.arange(indptr[-1]))

    def row_word(self) -> np.ndarray:
        """[E] owner word of every CSR entry."""
        return np.repeat(np.arange(self.vocab_size), np.diff(self.indptr.numpy()))

    def target_entries(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(batch position [E_b], row id [E_b], log-weight [E_b]) of the entries owned by each target."""
        start, stop = self.indptr[targets], self.indptr[targets + 1]
        lens = stop - start
        b = torch.repeat_interleave(torch.arange(len(targets)), lens)
        offs = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        e = torch.repeat_interleave(start, lens) + offs
        return b, self.indices[e], self.log_weight[e]


def _segment_logsumexp(values: torch.Tensor, seg: torch.Tensor, n: int) -> torch.Tensor:
    """logsumexp of values [E] grouped by seg [E] (ids in [0, n)); −inf for empty groups. Differentiable."""
    m = torch.full((n,), -torch.inf).scatter_reduce(0, seg, values.detach(), "amax")
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros(n).index_add(0, seg, torch.exp(values - m_safe[seg]))
    return torch.log(s) + m_safe


class _TargetLogProb(torch.autograd.Function):
    """log p(target_b) = logsumexp_{e of b}(logits[b, rows_e] + lw_e) − logsumexp_r logits[b, r], with a fused backward.

    Autograd through torch.logsumexp and the gather spent ~45 % of a W_ds training step on passes over the
    [B, R] logits (sub, exp, mul, a zero-filled gather gradient and its sum, each a fresh allocation). Here the
    forward keeps log_softmax(logits) (one fused kernel) and the backward turns it into the gradient in place:
    ∂/∂logits[b, r] = g_b (w_{b,r} − softmax(logits)[b, r]), with w the target entries' share of p(target_b)
    (a sparse index_put). Single backward only (the saved log-softmax is overwritten). The log-softmax is computed
    in place over `logits`, which every caller passes as its own temporary (no autograd node saves it): a W_ds step
    then allocates one [B, R] array instead of two. Each such array (131 MB at B = 4,096, R = 8,000) is a fresh mmap
    whose pages the kernel zeroes on first touch; measured on 2 cores, a W_ds training process spent 30-45 % of
    its CPU time in the kernel.
    """

    @staticmethod
    def forward(ctx, logits, b, rows, lw, n):
        logsm = torch.log_softmax(logits, 1, out=logits)
        vals = logsm[b, rows] + lw
        out = _segment_logsumexp(vals, b, n)
        w = torch.exp(vals - out[b])
        ctx.logsm, ctx.b, ctx.rows = logsm, b, rows
        ctx.w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
        return out

    @staticmethod
    def backward(ctx, g):
        grad = ctx.logsm.exp_().mul_(-g[:, None])
        grad.index_put_((ctx.b, ctx.rows), g[ctx.b] * ctx.w, accumulate=True)
        ctx.logsm = None
        return grad, None, None, None, None


class ScoresBuffer:
    """A [B, R] float32 array that the scores of one W_ds step are written into, step after step, instead of a fresh
    array each time (a fresh 130 MB array is a fresh mmap whose pages the kernel zeroes on first touch: the scores'
    GEMM took 61 ms into a fresh array and 34 ms into a reused one, B = 4,096, R = 7,792, 2 Intel Xeon cores). take()
    lends it when it is free and of the shape asked for (else None: the caller allocates); release() returns it."""

    def __init__(self):
        self.array, self.busy = None, False

    def take(self, shape: tuple[int, int]) -> np.ndarray | None:
        if self.busy:
            return None
        if self.array is None or self.array.shape != shape:
            self.array = np.empty(shape, dtype=np.float32)
        self.busy = True
        return self.array

    def release(self) -> None:
        self.busy = False


class _RowScores(torch.autograd.Function):
    """h [B, D] · W [R, D]ᵀ → [B, R] float32 through the CPU's faster BLAS (knnlm.search.exact.cpu_matmul; forward and
    both gradients): the GEMMs of a W_ds training step, at the BLAS rate instead of autograd's torch.matmul path
    (benchmarks/bench_wds.py prints both).
    With a ScoresBuffer the scores are written into its array, lent until the backward pass has read the gradient
    (which the caller, _TargetLogProb, computes in place over the scores), or, when nothing needs a gradient, until
    the caller has consumed them (the caller's own call, before the next one)."""

    @staticmethod
    def forward(ctx, h, w, buffer=None):
        ctx.save_for_backward(h, w)
        hn, wn = h.detach().numpy(), w.detach().numpy()
        out = buffer.take((hn.shape[0], wn.shape[0])) if buffer is not None else None
        ctx.buffer = buffer if out is not None and any(ctx.needs_input_grad[:2]) else None
        if out is not None and ctx.buffer is None:
            buffer.release()  # no backward pass will read it: free once the caller is done with this call's scores
        return torch.from_numpy(cpu_matmul(hn, wn.T, out))

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors
        g = g.contiguous().numpy()
        gh = torch.from_numpy(cpu_matmul(g, w.detach().numpy())) if ctx.needs_input_grad[0] else None
        gw = torch.from_numpy(cpu_matmul(g.T, h.detach().numpy())) if ctx.needs_input_grad[1] else None
        if ctx.buffer is not None:
            ctx.buffer.release()
            ctx.buffer = None
        return gh, gw, None


def row_scores(h: torch.Tensor, w: torch.Tensor, buffer: ScoresBuffer | None = None) -> torch.Tensor:
    """[B, R] h · wᵀ (h [B, D], w [R, D]); on the CPU in fp32 outside autocast through numpy's BLAS (_RowScores,
    differentiable in both; into `buffer`'s array when it is free), else torch's matmul in h's dtype. With a buffer,
    the scores are valid until the next call with the same buffer: callers consume them at once."""
    fp32_cpu = (h.device.type == "cpu" and h.dtype == w.dtype == torch.float32
                and not torch.is_autocast_enabled("cpu"))
    if fp32_cpu and h.is_contiguous() and w.is_contiguous():
        return _RowScores.apply(h, w, buffer)
    return h @ w.to(h.dtype).T


class AggregatedSoftmax(nn.Module):
    """p(w | h) = Σ_r M[r, w] softmax(score(h, W_r)) over R rows (Xu et al. Eq. 5 with a parametric W_ds).

    score = h·W_r ('ip'), or −|h − W_r|² / τ up to a constant in h ('l2': (2 h·W_r − |W_r|²) / τ, clustered keys).
    weight: [R, D] initial rows (None: N(0, D^-1/2) as in the paper). agg: Aggregation over R rows.
    temperature: the initial τ of 'l2' scores (Eq. 5's τ), learned with the rows as log τ (parameter
    log_temperature). Scaling the rows cannot rescale an L2 score as it rescales an IP one, so without τ the
    softmax over centroids of unnormalised keys is nearly one-hot (App. C.3's clustered datastore: valid NLL of
    52 nats/token at τ = 1 on wikitext2). 'ip' scores have no τ (W absorbs it). Raises ValueError for an unknown
    metric or a τ ≤ 0.
    """

    def __init__(self, agg: Aggregation, dim: int, weight: torch.Tensor | None = None, metric: str = "ip",
                 seed: int = 1, temperature: float = 1.0):
        super().__init__()
        if metric not in ("ip", "l2"):
            raise ValueError(f"metric must be 'ip' or 'l2', found {metric!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, found {temperature!r}")
        n_rows = int(agg.indices.max()) + 1
        if weight is None:
            g = torch.Generator().manual_seed(seed)
            weight = torch.randn(n_rows, dim, generator=g) * dim ** -0.5
        if weight.shape != (n_rows, dim):
            raise ValueError(f"weight must be [{n_rows}, {dim}], found {list(weight.shape)}")
        self.weight = nn.Parameter(weight.float().clone())
        self.agg, self.metric = agg, metric
        self._scores_buffer = ScoresBuffer()  # log_prob's scores, one array step after step
        if metric == "l2":
            self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature), dtype=torch.float32))

    @property
    def temperature(self) -> float:
        """τ of the 'l2' scores (1.0 for 'ip')."""
        return math.exp(float(self.log_temperature.detach())) if self.metric == "l2" else 1.0

    def set_temperature(self, temperature: float) -> None:
        """Set τ of the 'l2' scores (ValueError for 'ip' or τ ≤ 0)."""
        if self.metric != "l2" or not temperature > 0:
            raise ValueError(f"only an 'l2' model has a temperature > 0 (metric {self.metric!r}, τ {temperature!r})")
        with torch.no_grad():
            self.log_temperature.fill_(math.log(temperature))

    def logits(self, h: torch.Tensor, buffer: ScoresBuffer | None = None) -> torch.Tensor:
        """[B, R] float32 row scores. The L2 scores (2 h·W_r − |W_r|²) / τ are of the order of |h| |W_r| (hundreds for
        unnormalised keys) and only their differences matter, so they are always computed in fp32: under bf16
        autocast their rounding moved logits by nats. IP scores follow autocast (tested to 0.05 nats); with `buffer`
        (row_scores) they are valid until the next call with it."""
        if self.metric == "l2":
            return self.l2_scores(h) * torch.exp(-self.log_temperature)
        return row_scores(h, self.weight, buffer).float()

    def l2_scores(self, h: torch.Tensor) -> torch.Tensor:
        """[B, R] float32 2 h·W_r − |W_r|² (−|h − W_r|² up to a constant in h), before τ; always in fp32."""
        with torch.autocast(h.device.type, enabled=False):
            return 2 * row_scores(h.float().contiguous(), self.weight) - (self.weight * self.weight).sum(1)

    def log_prob(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[B] log p(target | h) (natural log)."""
        b, rows, lw = self.agg.target_entries(targets)
        # the scores are consumed here, in place (_TargetLogProb): written into the model's reused array
        return _TargetLogProb.apply(self.logits(h, self._scores_buffer), b, rows, lw, len(targets))

    def full_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """[B, V] log p(w | h) for every word (for tests and small vocabularies)."""
        logp = torch.log_softmax(self.logits(h), 1)
        word = torch.as_tensor(self.agg.row_word())
        vals = logp[:, self.agg.indices] + self.agg.log_weight  # [B, E]
        out = torch.stack([_segment_logsumexp(v, word, self.agg.vocab_size) for v in vals])
        return out


class MixtureOfSoftmaxes(nn.Module):
    """p(w | h) = Σ_r π_r(h) softmax(W_sm (P_r h + b_r))_w, π(h) = softmax(w_π h) (Yang et al. 2018; Xu et al. Table 7).

    w_sm: [V, D] the LM's output matrix (frozen unless train_embed: "MoS only" vs "MoS + embed").
    Projections start at the identity (plus N(0, 0.01) noise to break the symmetry between mixtures) and
    the prior at uniform, so on ffn features the initial model is close to the base LM itself.
    """

    def __init__(self, w_sm: torch.Tensor, mixtures: int, train_embed: bool, seed: int = 1):
        super().__init__()
        v, d = w_sm.shape
        g = torch.Generator().manual_seed(seed)
        self.w_sm = nn.Parameter(w_sm.float().clone(), requires_grad=train_embed)
        self.proj = nn.Parameter(torch.eye(d).repeat(mixtures, 1, 1) + 0.01 * torch.randn(mixtures, d, d, generator=g))
        self.proj_bias = nn.Parameter(torch.zeros(mixtures, d))
        self.prior = nn.Linear(d, mixtures)
        nn.init.zeros_(self.prior.weight)
        nn.init.zeros_(self.prior.bias)

    def _mixture_log_probs(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hr = torch.einsum("bd,red->rbe", h, self.proj.to(h.dtype)) + self.proj_bias.to(h.dtype)[:, None]
        logits = (hr @ self.w_sm.to(h.dtype).T).float()  # [R, B, V]
        log_prior = torch.log_softmax(self.prior(h.float()), 1).T  # [R, B]
        return torch.log_softmax(logits, 2), log_prior

    def log_prob(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp, log_prior = self._mixture_log_probs(h)
        at = logp.gather(2, targets[None, :, None].expand(logp.shape[0], -1, 1)).squeeze(2)  # [R, B]
        return torch.logsumexp(at + log_prior, 0)

    def full_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        logp, log_prior = self._mixture_log_probs(h)
        return torch.logsumexp(logp + log_prior[:, :, None], 0)


def adaptive_counts(f: np.ndarray, total: int) -> tuple[np.ndarray, float]:
    """Rows per word 1 + ⌊log_b f_v⌋ with b chosen so that the total is `total` (Xu et al. Table 6).

    f: [V] non-negative word statistic (training frequency, or total training loss under the base LM);
    words with f_v < 1 get one row. b is the smallest base whose total does not exceed `total`
    (bisection on log b); the rows still missing then go one each to the words with the largest
    fractional part of log_b f_v (the next to gain a row as b shrinks), so the total is exactly `total`.
    Returns (counts [V] int64, b). Raises ValueError if total < V.
    """
    f = np.asarray(f, dtype=np.float64)
    v = len(f)
    if total < v:
        raise ValueError(f"total rows {total} < vocabulary size {v}")
    logf = np.log(np.maximum(f, 1.0))

    def count(log_b):
        return 1 + np.floor(logf / log_b + 1e-12).astype(np.int64)

    lo, hi = 1e-6, max(float(logf.max()), 1e-6) * 2 + 1.0  # count(hi) = 1 per word ≤ total
    for _ in range(100):
        mid = (lo + hi) / 2
        if count(mid).sum() > total:
            lo = mid
        else:
            hi = mid
    c = count(hi)
    missing = int(total - c.sum())
    if missing > 0:
        frac = logf / hi - np.floor(logf / hi + 1e-12)
        c[np.argsort(-frac, kind="stable")[:missing]] += 1
    return c, float(math.exp(hi))


def cluster_aggregation(assign: np.ndarray, vals: np.ndarray, n_clusters: int, vocab: int) -> Aggregation:
    """M from clustered keys (App. C.3): M[c, w] = (# keys of cluster c with val w) / |c|, as CSR over words.

    assign: [N] cluster id per key, vals: [N] next-token id per key. Words never seen get no entries
    (probability 0).
    """
    assign, vals = np.asarray(assign, dtype=np.int64), np.asarray(vals, dtype=np.int64)
    pair = vals * n_clusters + assign
    uniq, cnt = np.unique(pair, return_counts=True)
    w, c = uniq // n_clusters, uniq % n_clusters
    size = np.bincount(assign, minlength=n_clusters)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(w, minlength=vocab))])
    return Aggregation(indptr, c, np.log(cnt / size[c]).astype(np.float32))


class KeyBatches:
    """Shuffled minibatches of (keys, vals) from the datastore memmaps, optionally a seeded subset of rows.

    keys: [N, D] fp16 memmap, vals: [N] int32. Each epoch reshuffles (seed + epoch); a batch reads its
    rows in sorted order (page-cache friendly), so memory is one batch, never the datastore.
    """

    def __init__(self, keys, vals, rows: np.ndarray | None, batch_size: int, seed: int, aux_keys=None):
        self.keys, self.vals, self.batch_size, self.seed = keys, vals, batch_size, seed
        self.aux_keys = aux_keys  # another key type of the same rows ([N, D'] memmap), yielded third when given
        self.rows = np.arange(len(vals)) if rows is None else np.asarray(rows)

    def __len__(self):
        return -(-len(self.rows) // self.batch_size)

    def epoch(self, epoch: int, skip: int = 0):
        order = np.random.default_rng(self.seed + epoch).permutation(self.rows)
        for i in range(skip, len(self)):
            idx = np.sort(order[i * self.batch_size:(i + 1) * self.batch_size])
            out = (torch.from_numpy(np.asarray(self.keys[idx], dtype=np.float32)),
                   torch.from_numpy(np.asarray(self.vals[idx], dtype=np.int64)))
            if self.aux_keys is not None:
                out += (torch.from_numpy(np.asarray(self.aux_keys[idx], dtype=np.float32)),)
            yield out


@torch.no_grad()
def evaluate_log_probs(model: nn.Module, queries, targets, batch_size: int = 4096, bf16: bool = True,
                       limit: int | None = None) -> np.ndarray:
    """[T] float64 log p(target) for the first `limit` (all when None) query rows, in batches."""
    model.eval()
    t = len(targets) if limit is None else min(limit, len(targets))
    out = np.empty(t)
    for s in range(0, t, batch_size):
        h = torch.from_numpy(np.array(queries[s:s + batch_size], dtype=np.float32))
        y = torch.from_numpy(np.asarray(targets[s:s + batch_size], dtype=np.int64))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out[s:s + len(y)] = model.log_prob(h, y).double().numpy()
    return out


TEMPERATURE_GRID = tuple(2.0 ** (i / 2) for i in range(25))  # 1 … 4096, factor √2


@torch.no_grad()
def tune_l2_temperature(model: AggregatedSoftmax, queries, targets, grid=TEMPERATURE_GRID,
                        batch_size: int = 4096) -> tuple[float, dict[float, float]]:
    """The τ of `grid` with the lowest mean valid NLL of an 'l2' AggregatedSoftmax (τ tuned on valid, as the kNN
    softmax's τ of Eq. 5); sets it on the model and returns (τ, {τ: NLL nats/token over the targets with p > 0}).

    queries: [T, D] (memmap or array, any float dtype), targets: [T] int. The fp32 scores 2 h·W_r − |W_r|² are
    computed once per batch and divided by every τ. Raises ValueError for an 'ip' model or an empty grid, and
    ArtifactError when the model gives p = 0 to every target.
    """
    if model.metric != "l2" or not len(grid):
        raise ValueError(f"tune_l2_temperature needs an 'l2' model and a grid (metric {model.metric!r}, grid {grid!r})")
    model.eval()
    sums, n_total = np.zeros(len(grid)), 0
    for s in range(0, len(targets), batch_size):
        h = torch.from_numpy(np.array(queries[s:s + batch_size], dtype=np.float32))
        y = torch.from_numpy(np.asarray(targets[s:s + batch_size], dtype=np.int64))
        scores = model.l2_scores(h)
        b, rows, lw = model.agg.target_entries(y)
        for i, tau in enumerate(grid):
            lp = _TargetLogProb.apply(scores / tau, b, rows, lw, len(y))
            fin = torch.isfinite(lp)  # the same set for every τ: the targets some row of the model has
            sums[i] -= float(lp[fin].double().sum())
        n_total += int(fin.sum())
    if n_total == 0:
        raise ArtifactError("the model gives probability 0 to every valid target")
    nll = {float(t): float(v / n_total) for t, v in zip(grid, sums)}
    best = min(nll, key=nll.get)
    model.set_temperature(best)
    return best, nll


LR_SCHEDULES = ("constant", "plateau")


def _finite_nll(lp: np.ndarray) -> float:
    """Mean NLL (nats/token) over the tokens with p > 0 (the early-stopping criterion; the set is fixed per model)."""
    fin = np.isfinite(lp)
    if not fin.any():
        raise ArtifactError("the model gives probability 0 to every valid target")
    return -float(np.mean(lp[fin]))


def train(model: nn.Module, batches: KeyBatches, valid: tuple, ckpt_path: str | Path, lr: float, max_epochs: int,
          patience: int, bf16: bool = True, log_every: int = 50, evals_per_epoch: int = 1, on_eval=None,
          settings: dict | None = None, interp: tuple[float, np.ndarray] | None = None,
          lr_schedule: str = "constant", plateau: float | None = None) -> dict:
    """Adam on −log p(val | key) with early stopping on the valid NLL, evaluated `evals_per_epoch` times per epoch;
    resumable at every evaluation.

    valid: (queries [T, D], targets [T]) for early stopping (mean NLL in nats/token over the targets with p > 0).
    At every evaluation the state (model, optimiser, learning-rate schedule, position in the epoch, best state,
    history) is saved atomically to ckpt_path; a rerun resumes from it (the epoch's finished batches are skipped, the
    shuffle is seeded per epoch). lr_schedule: 'constant', or 'plateau' (the learning rate halves at every evaluation
    that does not improve the best valid NLL: torch's ReduceLROnPlateau, patience 0). Training stops, converged, at
    the first of: `patience` evaluations without a better valid NLL ('stop': 'patience'); one epoch (the last
    evals_per_epoch evaluations) that improved the best valid perplexity by less than the fraction `plateau`
    ('stop': 'plateau'; None: never). It stops at max_epochs otherwise ('converged': False, 'stop': 'max_epochs':
    still improving, under-trained). The model is left at its best state.
    Returns the history: {'train': [(step, loss)], 'valid': [(step, epoch (fractional), nll)], 'lr': [(step, lr)]
    (the learning rate after each evaluation), 'best_step', 'best_nll', 'steps', 'epochs' (fractional), 'evals',
    'converged', 'stop', 'seconds', 'tokens_per_second'}. Raises ValueError for evals_per_epoch < 1 or an unknown
    lr_schedule.
    on_eval(step, {'valid_nll': nll, 'train_loss': ..., 'epoch': ...}) is called at every evaluation (live curves:
    knnlm.job.Job.curve). Raises ValueError for evals_per_epoch < 1.
    interp: (λ, valid log p_LM [T]) to train on the interpolated loss of Xu et al. 2023, App. E.6.3 (Eq. 12):
    −log(λ p_model(y) + (1 − λ) p_LM(y)), log p_LM(y) of each training row from the batches' third element
    (KeyBatches(aux_keys=...): the base LM's log-probability of every datastore row's value, computed once by
    compute_word_stats); early stopping then uses the same interpolated NLL on valid.
    settings: what the run's trajectory depends on (lr, bf16, batch size, seed, training rows, ...; plain JSON
    values), saved in the checkpoint: a checkpoint saved under other settings is not resumed but started over
    (logged), so a changed config never continues a stale run. max_epochs and patience are not settings: raising
    them continues the saved run, which then equals a fresh run with the new values (per-epoch seeded shuffle,
    saved optimiser state). A checkpoint from before settings were saved is resumed as it is (logged).
    """
    if evals_per_epoch < 1:
        raise ValueError(f"evals_per_epoch must be >= 1, found {evals_per_epoch}")
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, found {lr_schedule!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0, threshold=0.0) \
        if lr_schedule == "plateau" else None
    hist = {"train": [], "valid": [], "lr": [], "best_step": -1, "best_eval": -1, "best_nll": math.inf, "epoch": 0,
            "batch": 0, "steps": 0, "evals": 0, "seconds": 0.0, "train_tokens": 0, "stop": None}
    best_state = None
    ckpt_path = Path(ckpt_path)
    settings = dict(settings or {}, lr=lr, bf16=bf16, evals_per_epoch=evals_per_epoch, batches=len(batches))
    if lr_schedule != "constant":  # (a constant-lr checkpoint keeps the settings it was saved with)
        settings["lr_schedule"] = lr_schedule
    if interp is not None:
        settings["interp_loss"] = interp[0]
        log_lam, log_rest = math.log(interp[0]), math.log(1 - interp[0])
    st = load_checkpoint(ckpt_path) if ckpt_path.exists() else None
    if st is not None and "settings" not in st:
        log.warning("%s has no saved settings (an older checkpoint): resumed as it is", ckpt_path)
    elif st is not None and st["settings"] != settings:
        changed = sorted(k for k in settings.keys() | st["settings"].keys()
                         if st["settings"].get(k) != settings.get(k))
        log.warning("%s was saved under other settings (%s): training starts over", ckpt_path,
                    ", ".join(f"{k}: {st['settings'].get(k)!r} -> {settings.get(k)!r}" for k in changed))
        st = None
    if st is not None:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        if sched is not None:
            sched.load_state_dict(st["scheduler"])
        hist, best_state = st["history"], st["best_state"]
        hist.setdefault("lr", [])
        hist.setdefault("stop", None)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ckpt_path, hist["steps"], hist["epoch"], hist["batch"])
    n = len(batches)
    eval_at = {max(1, round(n * (i + 1) / evals_per_epoch)) for i in range(evals_per_epoch)}

    def stop_reason() -> str | None:  # 'patience' | 'plateau' once converged, else None
        if not hist["evals"]:
            return None
        if hist["evals"] - 1 - hist["best_eval"] >= patience:
            return "patience"
        if plateau is not None and hist["evals"] > evals_per_epoch:  # the best NLL one epoch ago vs now
            before = min(nll for _, _, nll in hist["valid"][:-evals_per_epoch])
            if math.expm1(before - hist["best_nll"]) < plateau:
                return "plateau"
        return None

    def waiting() -> bool:
        return stop_reason() is None

    while hist["epoch"] < max_epochs and waiting():
        epoch, skip = hist["epoch"], hist["batch"]
        model.train()
        t0, run, n_run = time.time(), 0.0, 0
        for i, (h, y, *aux) in enumerate(tqdm(batches.epoch(epoch, skip), total=n - skip, desc=f"epoch {epoch}",
                                              mininterval=30), start=skip):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                lp = model.log_prob(h, y)
            if interp is not None:  # Eq. 12: the loss of the interpolation with the frozen base LM
                lp = torch.logaddexp(log_lam + lp.float(), log_rest + aux[0])
            # targets the model gives no row (a clustered datastore whose clusters never saw the word) have
            # log p = −inf and no gradient path: they are left out of the loss
            loss = -lp[torch.isfinite(lp)].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            hist["steps"] += 1
            run += float(loss.detach())
            n_run += 1
            hist["train_tokens"] += len(y)
            if hist["steps"] % log_every == 0:
                hist["train"].append((hist["steps"], run / n_run))
                run, n_run = 0.0, 0
            if i + 1 not in eval_at:
                continue
            hist["seconds"] += time.time() - t0
            lp_valid = evaluate_log_probs(model, *valid, bf16=bf16)
            if interp is not None:
                lp_valid = np.logaddexp(log_lam + lp_valid, log_rest + interp[1][:len(lp_valid)])
            nll = _finite_nll(lp_valid)
            hist["valid"].append((hist["steps"], epoch + (i + 1) / n, nll))
            hist["evals"] += 1
            hist["epoch"], hist["batch"] = (epoch + 1, 0) if i + 1 == n else (epoch, i + 1)
            log.info("step %d (epoch %.2f): valid NLL %.4f nats/token (best %.4f)", hist["steps"], epoch + (i + 1) / n,
                     nll, hist["best_nll"])
            if on_eval is not None:
                on_eval(hist["steps"], {"valid_nll": nll, "epoch": epoch + (i + 1) / n,
                                        **({"train_loss": hist["train"][-1][1]} if hist["train"] else {})})
            if nll < hist["best_nll"]:
                hist["best_nll"], hist["best_step"], hist["best_eval"] = nll, hist["steps"], hist["evals"] - 1
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if sched is not None:
                sched.step(nll)
            hist["lr"].append((hist["steps"], opt.param_groups[0]["lr"]))
            with atomic_path(ckpt_path) as tmp:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "history": hist,
                            "best_state": best_state, "settings": settings,
                            "scheduler": None if sched is None else sched.state_dict()}, tmp)
            t0 = time.time()
            if not waiting():
                break
    if best_state is None:
        raise ArtifactError(f"{ckpt_path}: training produced no valid evaluation")
    model.load_state_dict(best_state)
    hist["stop"] = stop_reason() or "max_epochs"
    hist["converged"] = hist["stop"] != "max_epochs"
    hist["epochs"] = hist["valid"][-1][1]
    hist["tokens_per_second"] = hist["train_tokens"] / max(hist["seconds"], 1e-9)
    return hist


def converged_label(hist: dict) -> str:
    """The 'converged' cell of a trained row: 'yes (plateau)' / 'yes (patience)' for a training that stopped
    converged (train's 'stop'), 'no (under-trained)' for one that reached max_epochs still improving; hist: a train()
    history ('yes' when it records no stop reason)."""
    if not hist.get("converged"):
        return "no (under-trained)"
    return f"yes ({hist['stop']})" if hist.get("stop") in ("patience", "plateau") else "yes"


# Building, caching and configuring the models of the parametric variants (knnlm.experiments.parametric's jobs).


def parse_variant(name: str) -> dict:
    """{'kind': 'nv'|'adaptive'|'mos'|'cluster', ...} from a variant name; ValueError for unknown names. 'nv<n>-sub'
    is nV trained on the shrunk subset of config 'parametric.train_tokens' ('subset': True): W_ds (nv1) again on the
    rows the other variants saw, when W_ds itself trains on all rows (knnlm.config.subset_references)."""
    m = VARIANT_RE.match(name)
    if not m:
        raise ValueError(f"unknown parametric variant {name!r}; expected nv<n>[-sub], adaptive-freq|loss, "
                         f"mos<R>-only|embed or cluster<m>")
    if m["n"]:
        return {"kind": "nv", "n": int(m["n"])} | ({"subset": True} if m["sub"] else {})
    if m["by"]:
        return {"kind": "adaptive", "by": m["by"]}
    if m["r"]:
        return {"kind": "mos", "mixtures": int(m["r"]), "train_embed": m["mos"] == "embed"}
    if m["il"]:  # W_ds (1V) trained on the interpolated loss with λ = il / 100 (App. E.6.3)
        lam = int(m["il"]) / 100
        if not 0 < lam < 1:
            raise ValueError(f"parametric variant {name!r}: the interpolated loss needs 0 < λ < 1, found {lam}")
        return {"kind": "nv", "n": 1, "interp_loss": lam} | ({"subset": True} if m["ilsub"] else {})
    return {"kind": "cluster", "m": int(m["m"])}


@torch.no_grad()
def compute_word_stats(keys_ffn, vals, w_sm: torch.Tensor, chunk: int = 16384, bf16: bool = True,
                       row_logprobs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per word v: 'freq' = # training tokens with next token v, 'loss' = Σ of their base-LM NLL (nats).

    The base-LM NLL of a training token is −log softmax(W_sm h_sm)[v], recomputed from the ffn keys
    (h_sm itself, stored fp16); keys_ffn: [N, D] memmap, vals: [N] int32, w_sm: [V, D] float32. Used by the
    adaptive counts (Table 6). row_logprobs: an optional writable [N] float32 array (a memmap) that receives
    log p_LM(val_i) of every datastore row, the frozen LM's term of the interpolated loss (App. E.6.3, Eq. 12).
    Raises ValueError when row_logprobs does not have N entries.
    """
    v = w_sm.shape[0]
    if row_logprobs is not None and len(row_logprobs) != len(vals):
        raise ValueError(f"row_logprobs must have one entry per datastore row ({len(vals)}), found {len(row_logprobs)}")
    freq = np.bincount(np.asarray(vals), minlength=v).astype(np.float64)
    loss = torch.zeros(v, dtype=torch.float64)
    w_np = w_sm.detach().float().numpy()
    for s in range(0, len(vals), chunk):
        h = np.asarray(keys_ffn[s:s + chunk], dtype=np.float32)
        y = torch.from_numpy(np.asarray(vals[s:s + chunk], dtype=np.int64))
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = (torch.from_numpy(h) @ w_sm.T).float()
        else:  # fp32 through numpy's BLAS (knnlm.parametric.row_scores)
            logits = torch.from_numpy(h @ w_np.T)
        # one fused log-softmax in place (torch.logsumexp's separate passes took half of the job)
        nll = -torch.log_softmax(logits, 1, out=logits).gather(1, y[:, None]).squeeze(1)
        loss.index_add_(0, y, nll.double())
        if row_logprobs is not None:
            row_logprobs[s:s + len(y)] = -nll.numpy()
    return {"freq": freq, "loss": loss.numpy()}


def build_model(spec: dict, cfg: dict, vocab: int, dim: int, w_sm: torch.Tensor, stats_path: str | None,
                centroids: torch.Tensor | None = None, agg: Aggregation | None = None):
    """The model of a parsed variant; returns (model, info dict)."""
    p, seed = cfg["parametric"], cfg["parametric"]["seed"]
    if spec["kind"] == "nv":
        return AggregatedSoftmax(Aggregation.from_counts(np.full(vocab, spec["n"])), dim, seed=seed), {"rows": spec["n"] * vocab}
    if spec["kind"] == "adaptive":
        if not stats_path:
            raise ValueError("adaptive counts need the word statistics (--word-stats)")
        f = np.load(stats_path)[spec["by"]]
        counts, base = adaptive_counts(f, p["adaptive"]["total_n"] * vocab)
        info = {"rows": int(counts.sum()), "log_base": float(np.log(base)), "max_rows_per_word": int(counts.max()),
                "words_with_1_row": int((counts == 1).sum())}
        return AggregatedSoftmax(Aggregation.from_counts(counts), dim, seed=seed), info
    if spec["kind"] == "mos":
        return MixtureOfSoftmaxes(w_sm, spec["mixtures"], spec["train_embed"], seed=seed), {"mixtures": spec["mixtures"]}
    return AggregatedSoftmax(agg, dim, weight=centroids, metric="l2"), {"rows": int(centroids.shape[0])}


def cached(path: Path, settings: dict, compute) -> dict:
    """compute() (a dict of tensors/arrays) saved at path with its settings and the seconds it took, or the saved one
    when it was computed under the same settings; a file saved under other settings is recomputed (logged), so a
    changed config never reuses a stale result. A file from before settings were saved is reused as it is."""
    out = load_checkpoint(path) if Path(path).exists() else None
    if out is not None and out.get("settings", settings) != settings:
        log.warning("%s was computed under other settings (%s, now %s): recomputed", path, out["settings"], settings)
        out = None
    if out is None:
        t0 = time.time()
        out = dict(compute(), seconds=time.time() - t0, settings=settings)
        with atomic_path(path) as tmp:
            torch.save(out, tmp)
    return out


def kmeans_centroids(keys, rows: np.ndarray, n_clusters: int, iters: int, sample: int, seed: int, threads: int):
    """faiss k-means of the keys (trained on a seeded sample of `rows`); returns (centroids [C, D] fp32, assign [len(rows)])."""
    import faiss

    faiss.omp_set_num_threads(threads)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(rows, size=min(sample, len(rows)), replace=False))
    x = np.ascontiguousarray(keys[pick], dtype=np.float32)
    if len(x) < n_clusters:
        raise ValueError(f"k-means needs at least {n_clusters} keys, found {len(x)} (parametric.clustered.kmeans_sample)")
    km = faiss.Kmeans(x.shape[1], n_clusters, niter=iters, seed=seed, max_points_per_centroid=max(1, len(x) // n_clusters + 1),
                      verbose=False)
    km.train(x)
    assign = np.empty(len(rows), dtype=np.int64)
    for s in range(0, len(rows), 65536):
        _, a = km.index.search(np.ascontiguousarray(keys[rows[s:s + 65536]], dtype=np.float32), 1)
        assign[s:s + len(a)] = a[:, 0]
    return torch.from_numpy(km.centroids.copy()), assign


def training_settings(p: dict, variant: str) -> dict:
    """{'train_tokens', 'max_epochs', 'patience', 'evals_per_epoch', 'plateau'} of a variant: config
    'parametric.converge' for the variants it lists (trained until the valid NLL stops improving), else the section's shrunk settings."""
    keys = ("train_tokens", "max_epochs", "patience", "evals_per_epoch", "plateau")
    if variant.startswith("iloss"):  # W_ds on another loss: trained exactly as its W_ds (nv1 or nv1-sub), same rows
        variant = "nv1-sub" if variant.endswith("-sub") else "nv1"
    src = p["converge"] if variant in p["converge"]["variants"] else p
    return {k: src[k] for k in keys} | {"until_converged": variant in p["converge"]["variants"]}
