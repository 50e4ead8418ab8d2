"""When retrieval helps, token by token: features of a query's retrieval and of the LM's prediction, buckets of
them, and λ chosen per bucket (Drozdov et al. 2022, "You can't pick your neighbors, or can you?"; He et al. 2021,
"Efficient Nearest Neighbor Language Models").

Features of a scored token t (its target y_t, the FAISS neighbours of its query, the base LM's distribution):
  nearest-neighbour distance  the distance of the top FAISS neighbour (faiss convention: squared L2, or the inner
                              product for IP), a semantic-similarity proxy (Drozdov et al., Sec. 4)
  LM entropy / max log-prob   of the base LM's next-token distribution softmax(W_sm h_sm), in nats (He et al.)
  target training frequency   how often y_t is a next token in the datastore (its training split)
  n-gram overlap              the length of the longest common suffix of the tokens before t and the tokens before
                              the top neighbour's target in the training stream (Drozdov et al.'s lexical overlap)
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def _common_suffix(query_stream, query_pos, store_stream, rows, cap, out):
    for j in prange(query_pos.shape[0]):
        t, i = query_pos[j], rows[j]
        n = 0
        if i >= 0:
            while n < cap and t - 1 - n >= 0 and i - 1 - n >= 0 and query_stream[t - 1 - n] == store_stream[i - 1 - n]:
                n += 1
        out[j] = n


def longest_common_suffix(query_stream: np.ndarray, query_pos: np.ndarray, store_stream: np.ndarray,
                          rows: np.ndarray, cap: int = 64) -> np.ndarray:
    """[n] int32: for each scored token j, the number L of tokens before it that equal, in order, the L tokens before
    the target of datastore row rows[j] (the n-gram overlap of its context with the neighbour's), at most `cap`.

    query_stream: [T] int the split's target tokens in stream order (targets[t − 1], targets[t − 2], ... precede
    target t); query_pos: [n] int positions t in it; store_stream: [N] int the datastore's vals (row i's target is
    vals[i], preceded by vals[i − 1], vals[i − 2], ...); rows: [n] int neighbour rows (−1: none, overlap 0).
    Raises ValueError for mismatched lengths, a position or row out of range, or cap < 0.
    """
    query_pos, rows = np.asarray(query_pos, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    if query_pos.shape != rows.shape or cap < 0:
        raise ValueError(f"query_pos and rows must have one entry per token and cap >= 0, found {query_pos.shape}, "
                         f"{rows.shape}, cap {cap}")
    if len(query_pos) and (query_pos.min() < 0 or query_pos.max() >= len(query_stream)):
        raise ValueError(f"query positions must lie in [0, {len(query_stream)})")
    if len(rows) and rows.max() >= len(store_stream):
        raise ValueError(f"neighbour rows must lie below {len(store_stream)}, found {rows.max()}")
    out = np.zeros(len(rows), dtype=np.int32)
    _common_suffix(np.asarray(query_stream, dtype=np.int64), query_pos, np.asarray(store_stream, dtype=np.int64),
                   rows, int(cap), out)
    return out


def lm_entropy(h_sm: np.ndarray, w_sm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entropy [n], max log-prob [n], log-prob table's log-sum-exp [n]) of softmax(h_sm · W_smᵀ), float64 nats.

    h_sm: [n, D] the final decoder states (the 'ffn' queries), w_sm: [V, D] the output projection (float32).
    With d = logits − max and z = Σ e^d: log-sum-exp = max + log z, max log-prob = −log z and entropy
    = log z − Σ e^d · d / z; the exponentials in float32, their sums accumulated in float64 (~1e-6 relative)."""
    d = np.asarray(h_sm, dtype=np.float32) @ np.asarray(w_sm, dtype=np.float32).T
    m = d.max(1)
    d -= m[:, None]  # ≤ 0
    e = np.exp(d)
    z = e.sum(1, dtype=np.float64)
    s = np.multiply(e, d, out=e).sum(1, dtype=np.float64)
    log_z = np.log(z)
    return log_z - s / z, -log_z, m.astype(np.float64) + log_z


def quantile_edges(x: np.ndarray, buckets: int) -> np.ndarray:
    """[≤ buckets − 1] increasing inner edges of `buckets` equal-count buckets of x (ties merged), for bucket_of."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, found {buckets}")
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x) or buckets == 1:
        return np.empty(0)
    return np.unique(np.quantile(x, np.arange(1, buckets) / buckets))


def bucket_of(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """[n] int64 bucket of each value: 0 below edges[0], i for edges[i − 1] ≤ x < edges[i], len(edges) at or above
    the last (non-finite values go to the last bucket)."""
    x = np.asarray(x, dtype=np.float64)
    return np.searchsorted(np.asarray(edges, dtype=np.float64), np.where(np.isfinite(x), x, np.inf), side="right")


def bucket_lambdas(lp_lm: np.ndarray, lp_knn: np.ndarray, bucket: np.ndarray, n_buckets: int,
                   lambdas: np.ndarray, fallback: float) -> np.ndarray:
    """[n_buckets] λ of each bucket: the λ of `lambdas` with the lowest interpolated NLL over the bucket's tokens
    (Drozdov et al. 2022: λ by retrieval quality, tuned on valid), `fallback` for an empty bucket.

    lp_lm, lp_knn: [n] float64 log p of the targets under the base LM and the kNN distribution; bucket: [n] int in
    [0, n_buckets). The first of tied minima wins (as knnlm.scoring.interpolation.tune_lambda)."""
    from .interpolation import interpolated_nll

    out = np.full(n_buckets, float(fallback))
    for b in range(n_buckets):
        sel = bucket == b
        if sel.any():
            nll = interpolated_nll(lp_lm[sel], lp_knn[sel], lambdas)
            out[b] = float(lambdas[int(np.argmin(nll))])
    return out


def interpolate_per_token(lp_lm: np.ndarray, lp_knn: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """[n] log((1 − λ_t) p_LM + λ_t p_kNN) with a λ per token (Eq. 5 with λ a function of the token), float64;
    λ_t = 0 gives the LM's own log-prob (a token whose retrieval was skipped)."""
    lam = np.asarray(lam, dtype=np.float64)
    with np.errstate(divide="ignore"):
        a = np.where(lam > 0, np.log(np.maximum(lam, 1e-300)) + lp_knn, -np.inf)
        b = np.where(lam < 1, np.log1p(-np.minimum(lam, 1.0)) + lp_lm, -np.inf)
    return np.logaddexp(a, b)


def gain_concentration(delta: np.ndarray, fractions=(0.01, 0.05, 0.1)) -> dict[float, float]:
    """{f: share of the total gain Σ Δ contributed by the top f of tokens by Δ} (Δ = log p_kNN-LM − log p_LM per
    token, nats): how concentrated the kNN-LM's gain is. Shares can exceed 1 (the other tokens lose on balance);
    nan when the total gain is 0."""
    d = np.sort(np.asarray(delta, dtype=np.float64))[::-1]
    total = d.sum()
    return {f: float(d[:max(1, int(round(f * len(d))))].sum() / total) if total else float("nan") for f in fractions}


def _context_keys(stream: np.ndarray, n: int, vocab: int) -> np.ndarray:
    """[len(stream)] int64 key of the n tokens before each position (stream[i − n .. i − 1]); −1 where fewer than n
    tokens precede. Exact (16 bits per token) when vocab ≤ 65,536, else a 64-bit polynomial hash."""
    s = np.asarray(stream, dtype=np.int64)
    key = np.zeros(len(s), dtype=np.uint64)
    for j in range(1, n + 1):  # token stream[i − j]
        prev = np.concatenate([np.zeros(j, dtype=np.int64), s[:-j]]) if len(s) > j else np.zeros(len(s), np.int64)
        if vocab <= 65536:
            key |= prev.astype(np.uint64) << np.uint64(16 * (j - 1))
        else:
            key = key * np.uint64(1000003) ^ prev.astype(np.uint64)
    out = key.view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)
    out[:n] = -1
    return out


def context_ngram_stats(store_stream: np.ndarray, n_max: int, vocab: int) -> list[tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]]:
    """For n = 1..n_max, (sorted context keys [U], how often each context occurs in the training stream [U],
    how many distinct next tokens follow it [U]: its 'fertility'), He et al. 2021's frequency features of a
    context; store_stream: [N] the datastore's vals in training order."""
    s = np.asarray(store_stream, dtype=np.int64)
    out = []
    for n in range(1, n_max + 1):
        key = _context_keys(s, n, vocab)
        ok = key >= 0
        uk, cnt = np.unique(key[ok], return_counts=True)
        pairs = np.unique(np.stack([key[ok], s[ok]]), axis=1)  # distinct (context, next token)
        fert = np.bincount(np.searchsorted(uk, pairs[0]), minlength=len(uk))
        out.append((uk, cnt.astype(np.int64), fert.astype(np.int64)))
    return out


def context_features(query_stream: np.ndarray, stats: list, vocab: int) -> dict[str, np.ndarray]:
    """{'ctx_freq_<n>', 'ctx_fertility_<n>': [T] int64} for every position of query_stream (a split's targets in
    stream order): how often the n tokens before it occur as a context in the training stream and how many
    distinct tokens follow them there (0 for an unseen context or fewer than n preceding tokens); stats from
    context_ngram_stats."""
    out = {}
    for n, (uk, cnt, fert) in enumerate(stats, start=1):
        key = _context_keys(query_stream, n, vocab)
        i = np.clip(np.searchsorted(uk, key), 0, max(len(uk) - 1, 0))
        hit = (key >= 0) & (len(uk) > 0) & (uk[i] == key) if len(uk) else np.zeros(len(key), bool)
        out[f"ctx_freq_{n}"] = np.where(hit, cnt[i] if len(uk) else 0, 0).astype(np.int64)
        out[f"ctx_fertility_{n}"] = np.where(hit, fert[i] if len(uk) else 0, 0).astype(np.int64)
    return out


def lambda_features(feats: dict[str, np.ndarray], n_ctx: int) -> tuple[np.ndarray, list[str]]:
    """([T, F] float32 design matrix, feature names) of what the LM knows before retrieval (He et al. 2021, Sec.
    3.1): its entropy and max log-prob, and log(1 + ·) of the context's n-gram frequency and fertility for n =
    1..n_ctx, from a features file (knnlm.experiments.token_gains.features)."""
    names = ["lm_entropy", "lm_max_logprob"] + [f"{w}_{n}" for n in range(1, n_ctx + 1)
                                                for w in ("ctx_freq", "ctx_fertility")]
    cols = [np.asarray(feats[n], dtype=np.float64) if n.startswith("lm_") else np.log1p(np.asarray(feats[n]))
            for n in names]
    return np.stack(cols, 1).astype(np.float32), names


def fit_lambda_model(x_train: np.ndarray, lp_lm_train: np.ndarray, lp_knn_train: np.ndarray, x_held: np.ndarray,
                     lp_lm_held: np.ndarray, lp_knn_held: np.ndarray, hidden: int = 32, lr: float = 3e-3,
                     batch_size: int = 4096, max_epochs: int = 50, patience: int = 3, seed: int = 1,
                     min_gain: float = 1e-4):
    """An MLP λ(x) = sigmoid(MLP(standardised x)) trained by the interpolated NLL −log(λ p_kNN + (1 − λ) p_LM)
    (He et al. 2021, Sec. 3.1: the retrieval adaptor), Adam, early-stopped on the held-out set's NLL (an epoch that
    lowers it by less than min_gain nats/token counts as no gain; after `patience` such epochs training stops).

    x_*: [n, F] float32 features (lambda_features); lp_*: [n] float64 log p of the targets under the base LM and the
    kNN distribution (−inf allowed for p_kNN). Returns (predict(x [m, F]) -> [m] float64 λ, history {'held_nll':
    [per epoch, nats/token], 'best_epoch', 'epochs', 'converged': stopped by patience rather than max_epochs}).
    Raises ValueError for an empty training or held-out set."""
    import torch

    if not len(x_train) or not len(x_held):
        raise ValueError(f"the λ model needs training and held-out tokens, found {len(x_train)} and {len(x_held)}")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-6
    net = torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def tensors(x, a, b):
        return (torch.from_numpy((x - mu) / sd).float(), torch.from_numpy(np.asarray(a, dtype=np.float64)).float(),
                torch.from_numpy(np.asarray(b, dtype=np.float64)).float())

    def nll(xt, lm, knn):
        z = net(xt)[:, 0]
        return -torch.logaddexp(torch.nn.functional.logsigmoid(z) + knn, torch.nn.functional.logsigmoid(-z) + lm)

    tr, ho = tensors(x_train, lp_lm_train, lp_knn_train), tensors(x_held, lp_lm_held, lp_knn_held)
    hist, best, best_state, waited = {"held_nll": []}, np.inf, None, 0
    for epoch in range(max_epochs):
        net.train()
        for idx in torch.randperm(len(tr[0]), generator=g).split(batch_size):
            loss = nll(*(t[idx] for t in tr)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            h = float(nll(*ho).mean())
        hist["held_nll"].append(h)
        if h < best - min_gain:
            best, best_state, waited, hist["best_epoch"] = h, {k: v.clone() for k, v in net.state_dict().items()}, 0, epoch
        else:
            waited += 1
            if waited > patience:
                break
    net.load_state_dict(best_state)
    hist.update(epochs=len(hist["held_nll"]), converged=waited > patience)

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(net(torch.from_numpy((x - mu) / sd).float())[:, 0]).double().numpy()

    return predict, hist
