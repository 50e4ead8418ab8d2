"""An interpolated Kneser–Ney n-gram LM over a token stream, the component Khandelwal et al. (2020, Sec. 6, "Is the
kNN-LM just an n-gram LM?") interpolate with the base LM in place of p_kNN: does the datastore add more than the
n-gram statistics of the same training tokens?

Interpolated Kneser–Ney (Chen and Goodman 1999, Sec. 3.5, one discount per order): for the highest order n, with
c the counts of the training stream,

    p_n(w | h) = max(c(h w) − D_n, 0) / c(h ·) + D_n · N1+(h ·) / c(h ·) · p_{n−1}(w | h'),

and for each lower order k (h' = h without its first token), with the continuation counts N1+(· g) (how many
distinct tokens precede the k-gram g) in place of counts,

    p_k(w | h) = max(N1+(· h w) − D_k, 0) / N1+(· h ·) + D_k · N1+(h ·)_k / N1+(· h ·) · p_{k−1}(w | h'),

N1+(h ·)_k being the number of distinct w with N1+(· h w) > 0; down to p_0(w) = 1 / V. A history never seen at an
order (a zero denominator) passes p_{k−1} on unchanged. D_k = n1 / (n1 + 2 n2), n1 and n2 the numbers of k-grams
whose (continuation) count is 1 and 2. Every p_k(· | h) sums to 1 over the vocabulary.

n-grams are keyed by 64-bit polynomial hashes of their tokens (one array per order, sorted for np.searchsorted);
two distinct n-grams of the training stream share a hash with probability about (number of n-grams)² / 2⁶⁵, 2·10⁻⁵
for WikiText-103's 100M tokens at one order. Memory: a few int64 arrays of the stream's length per order at a time,
never the stream's n-grams of every order together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit multiplier (the golden ratio's bits)


def _hashes(stream: np.ndarray, k: int, prev: np.ndarray | None) -> np.ndarray:
    """[T − k + 1] uint64 hashes of the k-grams of stream starting at each position, from the (k − 1)-grams' `prev`
    ([T − k + 2], None for k = 1): H_k[i] = H_{k−1}[i] · B + stream[i + k − 1] + 1 (mod 2⁶⁴)."""
    t = np.asarray(stream, dtype=np.uint64) + np.uint64(1)
    if k == 1:
        return t.copy()
    with np.errstate(over="ignore"):
        return prev[:len(t) - k + 1] * _BASE + t[k - 1:]


def _count(keys: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique keys, their counts, or their summed weights)."""
    u, inv = np.unique(keys, return_inverse=True)
    return u, np.bincount(inv, weights=weights, minlength=len(u)).astype(np.int64 if weights is None else np.float64)


def _lookup(table: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """values of keys in the sorted table (0 where a key is absent)."""
    if len(table) == 0:
        return np.zeros(len(keys), dtype=values.dtype)
    pos = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    return np.where(table[pos] == keys, values[pos], 0)


def _discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 + n2 else 0.5


@dataclass
class _Order:
    """One order k's statistics: the k-grams' (continuation) counts, and per history (the k-grams' first k − 1
    tokens) the denominator and the number of distinct continuations."""
    grams: np.ndarray       # sorted k-gram hashes
    counts: np.ndarray      # c(h w) (as the highest order) or N1+(· h w) (below it)
    hists: np.ndarray       # sorted (k − 1)-gram hashes of histories
    denom: np.ndarray       # c(h ·) or N1+(· h ·)
    types: np.ndarray       # N1+(h ·): distinct w after h
    discount: float

    @classmethod
    def of(cls, grams: np.ndarray, counts: np.ndarray, hist_of: np.ndarray) -> "_Order":
        hists, denom = _count(hist_of, counts.astype(np.float64))
        _, types = _count(hist_of)
        return cls(grams, counts, hists, denom, types, _discount(counts))

    def interpolate(self, g: np.ndarray, h: np.ndarray, ok: np.ndarray, lower: np.ndarray) -> np.ndarray:
        """p_k of the k-grams g with histories h (ok: where the k-gram exists), from p_{k−1} `lower`; lower where
        the history was never seen."""
        num = _lookup(self.grams, self.counts, g).astype(np.float64)
        den = _lookup(self.hists, self.denom, h)
        typ = _lookup(self.hists, self.types, h).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.maximum(num - self.discount, 0.0) / den + self.discount * typ / den * lower
        return np.where(ok & (den > 0), q, lower)


class KneserNeyLM:
    """The interpolated Kneser–Ney LMs of every order 1..n (module doc) over the token stream `stream` ([T] integer
    ids in [0, vocab_size)), built in one pass: order k's raw counts (its statistics as the highest order) and its
    continuation counts (below a higher one). Raises ValueError for n < 1, an empty stream or ids outside the
    vocabulary.

    log_probs(context, targets) scores a stream with the order-n model, log_probs_by_order with each order's;
    discounts: the order-n model's D_1 .. D_n.
    """

    def __init__(self, stream: np.ndarray, n: int, vocab_size: int):
        stream = np.asarray(stream, dtype=np.int64)
        if n < 1:
            raise ValueError(f"n-gram order must be >= 1, found {n}")
        if len(stream) == 0:
            raise ValueError("n-gram LM: empty training stream")
        if stream.min() < 0 or stream.max() >= vocab_size:
            raise ValueError(f"n-gram LM: token ids must lie in [0, {vocab_size}), found [{stream.min()}, {stream.max()}]")
        self.n, self.vocab_size = min(n, len(stream)), int(vocab_size)
        self.raw: list[_Order] = []   # raw[k − 1]: order k as the highest order
        self.cont: list[_Order] = []  # cont[k − 1]: order k below a higher one (k < n)
        prev = cur = None
        for k in range(1, self.n + 1):
            cur = _hashes(stream, k, prev) if cur is None else cur  # the k-grams at each position
            nxt = _hashes(stream, k + 1, cur) if k < self.n else None
            # one sort of this order's k-grams serves its raw counts and the history of every k-gram
            grams, first, counts = np.unique(cur, return_index=True, return_counts=True)
            hist_at = np.zeros(len(grams), dtype=np.uint64) if k == 1 else prev[first]
            self.raw.append(_Order.of(grams, counts, hist_at))
            if nxt is not None:  # continuation counts N1+(· g): the distinct (k + 1)-grams whose suffix is g
                _, left = np.unique(nxt, return_index=True)  # the (k + 1)-gram at i ends with the k-gram at i + 1
                suffixes, n_left = _count(cur[left + 1])
                self.cont.append(_Order.of(suffixes, n_left, _lookup(grams, hist_at, suffixes)))
            prev, cur = cur, nxt
        self.discounts = [o.discount for o in self.cont[:self.n - 1]] + [self.raw[self.n - 1].discount]

    def _target_grams(self, full: np.ndarray, pos: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per order k: (hash of the k-gram ending at each position of `pos` in `full`, hash of its first k − 1
        tokens, whether the k-gram lies inside `full`), hashed as _hashes does."""
        out = []
        m = len(pos)
        for k in range(1, self.n + 1):
            start = pos - k + 1
            ok = start >= 0
            g, h = np.zeros(m, dtype=np.uint64), np.zeros(m, dtype=np.uint64)
            with np.errstate(over="ignore"):
                for j in range(k):
                    tok = full[np.where(ok, start + j, 0)].astype(np.uint64) + np.uint64(1)
                    if j == k - 1:
                        h = g.copy() if k > 1 else h
                    g = tok if j == 0 else g * _BASE + tok
            out.append((g, h, ok))
        return out

    def log_probs_by_order(self, context: np.ndarray, targets: np.ndarray) -> dict[int, np.ndarray]:
        """{k: [m] float64 natural-log p_k(targets[i] | its history)} for k = 1..n, the order-k model's (its raw
        counts at order k over the continuation counts below), in one pass. The history of targets[i] is the tokens
        before it in concat(context, targets), the last k − 1 of them (fewer at the start); context: the tokens
        before the first target."""
        targets = np.asarray(targets, dtype=np.int64)
        full = np.concatenate([np.asarray(context, dtype=np.int64), targets])
        grams = self._target_grams(full, np.arange(len(full) - len(targets), len(full)))
        lower = np.full(len(targets), 1.0 / self.vocab_size)
        out = {}
        for k, (g, h, ok) in enumerate(grams, start=1):
            with np.errstate(divide="ignore"):
                out[k] = np.log(self.raw[k - 1].interpolate(g, h, ok, lower))
            if k < self.n:
                lower = self.cont[k - 1].interpolate(g, h, ok, lower)
        return out

    def log_probs(self, context: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """[m] float64 natural-log p_n(targets[i] | its history), the order-n model (log_probs_by_order)."""
        return self.log_probs_by_order(context, targets)[self.n]

