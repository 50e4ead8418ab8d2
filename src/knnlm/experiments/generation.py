"""Generation (Wang et al. 2023, "kNN-LM does not improve open-ended text generation", arXiv 2305.14625): does retrieval
get less reliable as a generated text grows? Prefixes of test articles (config 'generation': prefixes_per_document
per article, prefix_tokens each, at seeded offsets) are continued for new_tokens tokens three ways, batched, with the
kNN-LM of Table 1 (Table 3's pair, FAISS mask and score at its τ* and λ tuned on valid):
  kNN-LM samples   -- tokens drawn from the interpolated distribution (nucleus sampling, generation.top_p);
  base LM samples  -- tokens drawn from p_LM alone (the retrieval still runs, to measure it);
  true continuation -- the article's own next tokens (teacher forcing): the control, text the model did not write.
At every step the entropies H(p_kNN) and H(p_LM) of the next-token distributions are recorded (nats). The claim:
along the kNN-LM's samples H(p_kNN) rises faster with the step than H(p_LM) (the least-squares slope of
H(p_kNN) − H(p_LM) on the step, per 100 steps, with a delete-one-article jackknife interval), and faster than along the
true continuation (the difference of the two slopes: retrieval suffers from the model's own text, exposure bias).
Distinct-n and the share of repeated 4-grams of each kind of continuation are reported beside it, without a verdict.

Job: table (table and figure 'generation', comparisons CSV 'generation_comparisons' read by the findings).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..io import ArtifactError, read_checked_json, read_json
from ..job import Job
from ..report.figures import save_figure
from ..report.tables import write_csv, write_table
from ..statistics.captions import DESIGN_N_EFF, ci_caption
from ..statistics.intervals import effective_documents, jackknife_sums
from ..statistics.regression import regression_leverage, regression_sums, slope_of
from ..statistics.verdicts import verdict
from .common import documents_label, lm_training_label, open_datastore, split_documents, stats_options

log = logging.getLogger(__name__)
KNN, LM, TRUE = "kNN-LM samples", "base LM samples", "true continuation (teacher forcing)"
MODES = {KNN: "knn", LM: "lm", TRUE: "true"}
SLOPE = "slope of H(p_kNN) − H(p_LM) by step"
PER_STEPS = 100  # slopes are per this many steps
CITE = "Wang et al. 2023, arXiv 2305.14625"


def slope_name(mode: str) -> str:
    """The comparisons CSV's name of the slope of H(p_kNN) − H(p_LM) along continuations `mode` (KNN, LM or TRUE)."""
    return f"{SLOPE}: {mode}"


EXPOSURE = f"{SLOPE}: {KNN} minus {TRUE}"


def prefix_starts(doc: np.ndarray, need: int, per_doc: int, rng: np.random.Generator) -> np.ndarray:
    """Start positions of the prefixes in a split whose tokens belong to documents doc [T] int (each document one
    contiguous run): each document is cut into per_doc equal parts and each part long enough for `need` tokens (prefix
    and continuation) gives one start, uniform over the positions where they fit inside the part (parts never
    overlap). Returns [S] int64 sorted starts; a document shorter than `need` tokens per part gives fewer."""
    doc = np.asarray(doc)
    bounds = np.r_[0, np.flatnonzero(np.diff(doc)) + 1, len(doc)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = (b - a) // per_doc
        for j in range(per_doc):
            room = part - need
            if room >= 0:
                out.append(a + j * part + int(rng.integers(0, room + 1)))
    return np.asarray(out, dtype=np.int64)


class Retrieval:
    """The kNN component of Table 1's kNN-LM: FAISS neighbours of a batch of keys and p_kNN over the vocabulary."""

    def __init__(self, index_path, vals: np.ndarray, metric: str, k: int, nprobe: int, temperature: float, vocab: int,
                 threads: int):
        import faiss

        from ..search.index import read_index

        faiss.omp_set_num_threads(threads)
        self.index = read_index(index_path)
        self.ivf = faiss.extract_index_ivf(self.index)
        self.ivf.nprobe = nprobe
        self.vals, self.metric, self.k, self.nprobe, self.temperature, self.vocab = (
            vals, metric, k, nprobe, temperature, vocab)

    def distribution(self, h: np.ndarray) -> np.ndarray:
        """p_kNN [B, V] float64 of keys h [B, D] (knnlm.scoring.interpolation.knn_distribution)."""
        from ..scoring.interpolation import knn_distribution
        from ..search.index import search_filled

        d, ids, _, _ = search_filled(self.index, self.ivf, np.ascontiguousarray(h, dtype=np.float32), self.k,
                                     self.nprobe, self.ivf.nlist)
        return knn_distribution(ids, d, self.vals, self.metric, self.temperature, self.vocab)


def continue_prefixes(lm, retrieval: Retrieval, key: str, lam: float, prefixes: np.ndarray, truth: np.ndarray,
                      mode: str, top_p: float, rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """Continue each prefix of prefixes [S, P] int64 for L = truth.shape[1] steps: mode 'knn' samples from
    (1 − λ) p_LM + λ p_kNN, 'lm' from p_LM, 'true' feeds truth [S, L] (teacher forcing); the start token goes first, as
    in the LM's passes. Returns {'tokens' [S, L] int64 (the continuation), 'h_knn', 'h_lm' [S, L] float64: the
    entropies (nats) of p_kNN and p_LM for each continuation token, given the tokens before it}."""
    import torch  # here: the module is imported (its labels, its table job) without loading torch

    from ..lm.decoding import start
    from ..scoring.generation import entropy, top_p_sample

    s, length = truth.shape
    out = {"tokens": np.empty((s, length), dtype=np.int64), "h_knn": np.empty((s, length)),
           "h_lm": np.empty((s, length))}
    for a in range(0, s, batch):
        b = min(s, a + batch)
        dec, seq = start(lm, torch.as_tensor(prefixes[a:b]))
        for t in range(length):
            att, ffn, lp = dec.step(seq)
            p_lm = np.exp(lp.double().numpy())
            p_lm /= p_lm.sum(1, keepdims=True)
            p_knn = retrieval.distribution((att if key == "att" else ffn).numpy())
            out["h_knn"][a:b, t], out["h_lm"][a:b, t] = entropy(p_knn), entropy(p_lm)
            if mode == "true":
                nxt = truth[a:b, t]
            elif mode == "knn":
                nxt = top_p_sample((1 - lam) * p_lm + lam * p_knn, top_p, rng)
            else:
                nxt = top_p_sample(p_lm, top_p, rng)
            out["tokens"][a:b, t] = nxt
            seq = torch.cat([seq, torch.as_tensor(nxt, dtype=torch.long)[:, None]], 1)
    return out


def slope_sums(h_knn: np.ndarray, h_lm: np.ndarray, seq_doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document regression sums [n_docs, 6] (knnlm.statistics.regression.regression_sums) of y = H(p_kNN) −
    H(p_LM) on x = step / PER_STEPS (steps 1 … L) over every (sequence, step) of h_knn, h_lm [S, L], the sequences'
    documents seq_doc [S] int < n_docs. slope_of of their totals: the slope per PER_STEPS steps."""
    s, length = h_knn.shape
    x = np.tile(np.arange(1, length + 1) / PER_STEPS, s)
    return regression_sums(x, (h_knn - h_lm).ravel(), np.repeat(seq_doc, length), n_docs)


def _slope_difference(sums: np.ndarray) -> np.ndarray:
    """slope_of the first 6 sums minus slope_of the last 6 ([..., 12] -> [..., 1])."""
    return slope_of(sums[..., :6]) - slope_of(sums[..., 6:])


def table(job: Job) -> dict:
    """Continuations of test prefixes by the kNN-LM, by the base LM and the true ones; per step the entropies of p_kNN
    and p_LM; the slopes, their intervals over articles, diversity; table, figure and comparisons."""
    from ..api import load_run_lm
    from ..scoring.generation import distinct_n

    cfg, st, g = job.cfg, stats_options(job), job.cfg["generation"]
    lm_name = job.wildcards["lm"]
    sc = read_checked_json(job.path("score"), "score")
    tau, lam = float(sc["tuned"]["temperature"]), float(sc["tuned"]["lambda"])
    nb = read_json(job.path("nb_meta"))
    _, vals, _ = open_datastore(job, with_keys=False)
    lm = load_run_lm(cfg, lm_name)
    if g["prefix_tokens"] + g["new_tokens"] + 1 > lm.tokens_per_sample:
        raise ArtifactError(f"config 'generation': prefix_tokens {g['prefix_tokens']} + new_tokens {g['new_tokens']} + "
                            f"the start token exceed the LM's window of {lm.tokens_per_sample} tokens")
    retrieval = Retrieval(job.path("index"), np.asarray(vals), sc["metric"], int(cfg["knn"]["k"]), int(nb["nprobe"]),
                          tau, lm.vocab_size, job.threads)
    targets = np.load(job.path("targets")).astype(np.int64)
    doc, _ = split_documents(job, "test")
    p, n = g["prefix_tokens"], g["new_tokens"]
    starts = prefix_starts(doc, p + n, g["prefixes_per_document"], np.random.default_rng(g["seed"]))
    if len(starts) < 2:
        raise ArtifactError(f"config 'generation': no two test documents hold {p + n} tokens per part "
                            f"(prefix_tokens + new_tokens) for {g['prefixes_per_document']} prefixes each")
    win = starts[:, None] + np.arange(p + n)
    prefixes, truth = targets[win[:, :p]], targets[win[:, p:]]
    used, seq_doc = np.unique(doc[starts], return_inverse=True)
    log.info("generation: %d prefixes of %d tokens from %d test documents, %d new tokens each; τ = %g, λ = %g",
             len(starts), p, len(used), n, tau, lam)
    runs = {}
    for i, (name, mode) in enumerate(tqdm(MODES.items(), desc="generation", unit=" kind", mininterval=10)):
        runs[name] = continue_prefixes(lm, retrieval, sc["key_type"], lam, prefixes, truth, mode, g["top_p"],
                                       np.random.default_rng([g["seed"], i]), g["batch"])
    n_docs = len(used)
    x = np.tile(np.arange(1, n + 1) / PER_STEPS, len(starts))
    weights = regression_leverage(x, np.repeat(seq_doc, n), n_docs)
    n_eff = effective_documents(weights)
    sums = {name: slope_sums(r["h_knn"], r["h_lm"], seq_doc, n_docs) for name, r in runs.items()}
    cmp, rows = [], []

    def row(name: str, stat, s: np.ndarray) -> tuple[float, float, float]:
        v, lo, hi = jackknife_sums(stat, s, weights, st)
        cmp.append({"split": "test", "comparison": name, "relative difference": float(v[0]), "CI low": float(lo[0]),
                    "CI high": float(hi[0]), "verdict": verdict(lo[0], hi[0], n_docs, st["min_documents"], n_eff,
                                                                st.get("scheme", "")),
                    "documents": n_docs, "effective documents": n_eff, "n_eff of": DESIGN_N_EFF})
        return float(v[0]), float(lo[0]), float(hi[0])

    def ci(v: tuple[float, float, float]) -> str:
        return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"

    q = max(1, n // 8)  # the first and the last eighth of the steps
    for name, r in runs.items():
        diff = row(slope_name(name), slope_of, sums[name])
        one = {}
        for which in ("h_knn", "h_lm"):
            other = np.zeros_like(r[which])
            one[which] = jackknife_sums(slope_of, slope_sums(r[which], other, seq_doc, n_docs), weights, st)
        rows.append({"split": "test", "continuation": name, "sequences": len(starts), "documents": n_docs,
                     f"H(p_kNN) steps 1-{q}": float(r["h_knn"][:, :q].mean()),
                     f"H(p_kNN) steps {n - q + 1}-{n}": float(r["h_knn"][:, -q:].mean()),
                     f"H(p_LM) steps 1-{q}": float(r["h_lm"][:, :q].mean()),
                     f"H(p_LM) steps {n - q + 1}-{n}": float(r["h_lm"][:, -q:].mean()),
                     f"slope H(p_kNN) per {PER_STEPS} steps (95% CI)": ci(tuple(float(a[0]) for a in one["h_knn"])),
                     f"slope H(p_LM) per {PER_STEPS} steps (95% CI)": ci(tuple(float(a[0]) for a in one["h_lm"])),
                     f"slope H(p_kNN) − H(p_LM) per {PER_STEPS} steps (95% CI)": ci(diff),
                     **{f"distinct-{m}": float(distinct_n(r["tokens"], m).mean()) for m in (1, 2, 3)},
                     "repeated 4-grams": float(1 - distinct_n(r["tokens"], 4).mean())})
    gap = row(EXPOSURE, _slope_difference, np.concatenate([sums[KNN], sums[TRUE]], axis=1))
    on = (f"{sc['key_type']}/{sc['metric'].upper()}, full store, FAISS mask and score at τ* = {tau:g}, λ = {lam:g}; "
          f"{len(starts)} continuations of {n} tokens")
    cap = (f"Generation ({cfg['name']}; {CITE}, the entropy of the retrieval distribution by decoding step): "
           f"{g['prefixes_per_document']} prefixes of {p} tokens per test article (at seeded offsets in equal parts of "
           f"it; {len(starts)} from {n_docs} articles), continued for {n} tokens by the kNN-LM ({on.split(';')[0]}; "
           f"nucleus sampling, top-p {g['top_p']:g}), by the base LM alone (the retrieval still measured), and by the "
           f"article's own tokens (teacher forcing, the control). Per step the entropies (nats) of p_kNN and p_LM; "
           f"the least-squares slope of each on the step, per {PER_STEPS} steps, with delete-one-article jackknife "
           f"intervals. The kNN-LM's samples minus the true continuation: {ci(gap)} (exposure bias: retrieval from "
           f"the model's own text). Distinct-n: distinct n-grams over n-grams per continuation (mean); repeated 4-grams: "
           f"1 − distinct-4. Wang et al.: the entropy of p_kNN rises faster than p_LM's as the generated text grows. "
           f"{ci_caption(st, documents_label(job))}. {cfg.get('profile', {}).get('caption', '')}")
    write_table(pd.DataFrame(rows), job.path("csv"), job.path("md"),
                "Entropy of p_kNN and p_LM along continuations of test prefixes", cap, note=lm_training_label(job))
    write_csv(pd.DataFrame(cmp).assign(on=on), job.path("cmp_csv"))
    _figure(job, runs)
    return {"metrics": {"slope_knn_samples": cmp[0]["relative difference"], "exposure_gap": gap[0],
                        "sequences": len(starts), "documents": n_docs},
            "params": {"tau": tau, "lambda": lam, "top_p": g["top_p"]},
            "artifacts": [job.path(n) for n in ("csv", "md", "cmp_csv")]}


def _figure(job: Job, runs: dict) -> None:
    """Mean H(p_kNN) (left) and H(p_LM) (right) by step for each kind of continuation (Wang et al.'s axis)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharex=True)
    for name, style in zip(runs, ("-", ":", "--")):
        steps = np.arange(1, runs[name]["h_knn"].shape[1] + 1)
        for ax, which in zip(axes, ("h_knn", "h_lm")):
            ax.plot(steps, runs[name][which].mean(0), style, lw=1.2, label=name)
    for ax, title in zip(axes, ("H(p_kNN)", "H(p_LM)")):
        ax.set_xlabel("decoding step")
        ax.set_ylabel(f"mean {title} (nats)")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{job.cfg['name']}: entropy of the kNN and LM distributions along continuations", fontsize=9)
    save_figure(fig, [job.path("png"), job.path("pdf")])
    plt.close(fig)
