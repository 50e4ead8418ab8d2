"""The kNN-LM from Python: score text, generate, and build a datastore from any text.

    from knnlm import KNNLM
    knn = KNNLM.from_run("configs/wikitext2.yaml", lm="base", key="att", metric="l2")
    out = knn.score(open("my.txt").read())        # per-token log-probs, perplexity per word and per token
    print(knn.generate("The castle was", max_new_tokens=20))

The model is Eq. 5 of Xu et al. (2023) (Khandelwal et al. 2020, Eq. 2 with τ):
    P(w) = (1 − λ) softmax(W_sm h_sm)(w) + λ Σ_{i ∈ top-k, v_i = w} softmax(s_i / τ)
with keys of type att or ffn, s the negative squared L2 distance or the inner product, the top-k from the IVFPQ
index ("FAISS mask") or an exact search ("real mask"), and s from the index's PQ codes ("FAISS score") or recomputed
from the keys ("real score"). Text is scored as the pipeline scores a split: the LM's tokens of every line plus
one end of line, fairseq-eval-lm's sliding windows (knnlm.lm.windows.window_states), so `score` over a run's test split
gives the run's Table 1 numbers.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import torch

from .io import ArtifactError, open_npy, read_checked_json, read_json
from .lm import LanguageModel, backend, text_lines
from .lm.fairseq import FairseqLM  # noqa: F401 (the API's LMs)
from .lm.hf import HuggingFaceLM
from .paths import DatastoreLayout

log = logging.getLogger(__name__)
MASKS = ("faiss", "exact")
SCORES = ("faiss", "real")
BUNDLE_CONFIG = "knnlm_config.json"  # a saved kNN-LM's settings and identities (KNNLM.save_pretrained)
BUNDLE_FORMAT = 1
# the hooked state of each key type (Xu et al. 2023, Sec. 3), by knn-transformers' names
KEY_HOOKS = {"att": "last_ffn_input: the input of the last layer's FFN, after its LayerNorm",
             "ffn": "last_ffn_output: the final decoder output, the input of the output projection"}
# verify(): the largest relative error ‖h − k‖ / ‖k‖ of a recomputed key that still counts as the same state (fp16
# storage alone gives ~5e-4 at most; another model of the same shape, or the same one with other context, ~1)
VERIFY_TOLERANCE = 0.02
# the peers' names of the settings (neulab/knn-transformers' KNNWrapper and run_clm.py options: --lmbda, --knn_temp,
# --knn_keytype, --probe, --knn_sim_func, --recompute_dists, --dstore_size), accepted by from_datastore,
# from_pretrained and build as this API's names (peer_settings); their values by this project's names
PEER_NAMES = {"lmbda": "lam", "knn_temp": "temperature", "knn_keytype": "key", "probe": "nprobe",
              "knn_sim_func": "metric", "recompute_dists": "score", "dstore_size": "dstore_size"}
PEER_KEYTYPES = {"last_ffn_input": "att", "last_ffn_output": "ffn"}
PEER_METRICS = {"l2": "l2", "dot": "ip"}  # knn-transformers' DIST names
# this API's setting names: what an unknown name is checked against, for a hint
API_SETTINGS = ("k", "temperature", "lam", "nprobe", "mask", "score", "key", "metric")


def peer_settings(given: dict) -> dict:
    """The peers' setting names (PEER_NAMES) as this API's: {'lmbda': 0.25, 'knn_keytype': 'last_ffn_input',
    'knn_sim_func': 'dot', 'recompute_dists': True, 'probe': 32} -> {'lam': 0.25, 'key': 'att', 'metric': 'ip',
    'score': 'real', 'nprobe': 32}; 'dstore_size' is kept (the caller checks it against the datastore's rows). Enum
    values (knn-transformers' KEY_TYPE.last_ffn_input, DIST.dot) are read by their names. Raises TypeError naming an
    unknown setting, with this API's name where the unknown one is close to it (lambda_ -> lam)."""
    import difflib

    out = {}
    for name, v in given.items():
        if name not in PEER_NAMES:
            close = difflib.get_close_matches(name, [*API_SETTINGS, *PEER_NAMES], n=1, cutoff=0.5)
            hint = f"; did you mean {PEER_NAMES.get(close[0], close[0])!r}?" if close else ""
            raise TypeError(f"unknown setting {name!r} (this API's {list(API_SETTINGS)}, or the peers' "
                            f"{sorted(PEER_NAMES)}){hint}")
        v = getattr(v, "name", v)  # an Enum member of the peer's own code
        if name == "knn_keytype":
            v = PEER_KEYTYPES.get(v, v)
        elif name == "knn_sim_func":
            if v not in PEER_METRICS:
                raise ValueError(f"knn_sim_func must be one of {list(PEER_METRICS)} (knn-transformers' DIST), found {v!r}")
            v = PEER_METRICS[v]
        elif name == "recompute_dists":
            v = "real" if v else "faiss"  # knn-transformers' --recompute_dists: distances recomputed from the keys
        out[PEER_NAMES[name]] = v
    return out


def check_settings(*, key: str = "att", metric: str = "l2", k=1, temperature=1.0, lam=0.25, mask: str = "faiss",
                   score: str = "faiss", nprobe=None, context_window=None, tokens_per_sample: int | None = None) -> None:
    """Every setting of a kNN-LM checked at once, before any work (KNNLM.build, the CLIs): key 'att' | 'ffn', metric
    'l2' | 'ip', mask in MASKS, score in SCORES, k ≥ 1, τ > 0, λ in [0, 1], nprobe ≥ 1 (or None), context_window in
    [0, tokens_per_sample) (or None). Raises ValueError or TypeError naming the setting, what it must be and what was
    found."""
    for name, value, allowed in (("key", key, ("att", "ffn")), ("metric", metric, ("l2", "ip")),
                                 ("mask", mask, MASKS), ("score", score, SCORES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, found {value!r}")
    check_setting("k", k, integer=True, lo=1)
    check_setting("temperature", temperature, lo=0.0, lo_open=True)
    check_setting("lam", lam, lo=0.0, hi=1.0)
    if nprobe is not None:
        check_setting("nprobe", nprobe, integer=True, lo=1)
    if context_window is not None:
        hi = None if tokens_per_sample is None else tokens_per_sample - 1
        check_setting("context_window", context_window, integer=True, lo=0, hi=hi)


def check_setting(name: str, value, *, integer: bool = False, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False) -> float | int:
    """`value` of the kNN-LM setting `name` (k, temperature, lam, nprobe) checked: a number (an integer when `integer`;
    not a bool or a string), finite, within [lo, hi] (lo excluded when `lo_open`). Returns it as int or float.
    Raises TypeError or ValueError naming the setting, what it must be and what was found."""
    import math
    import numbers

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        raise TypeError(f"{name} must be {'an integer' if integer else 'a number'}, found {type(value).__name__} {value!r}")
    v = int(value) if integer else float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, found {value!r}")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        low = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        high = "" if hi is None else f"<= {hi:g}"
        raise ValueError(f"{name} must be {' and '.join(x for x in (low, high) if x)}, found {value!r}")
    return v


def _token_range(vals) -> tuple[int, int]:
    """(smallest, largest) val of [N] int vals, a memmap read in chunks (its pages leave the RSS)."""
    from .io import iter_chunks

    lo, hi = None, None
    for s, e in iter_chunks(len(vals), 1 << 24, vals):
        part = np.asarray(vals[s:e])
        lo = int(part.min()) if lo is None else min(lo, int(part.min()))
        hi = int(part.max()) if hi is None else max(hi, int(part.max()))
    return lo, hi


def read_bundle_config(bundle: str | Path) -> dict:
    """BUNDLE_CONFIG of the bundle folder `bundle` (KNNLM.save_pretrained), checked before anything is loaded
    against its schema (src/knnlm/schemas/bundle_config.schema.yaml: this version's format, every field of its type,
    k ≥ 1, τ > 0, λ in [0, 1], a known key type, metric, mask and score). Raises ArtifactError naming the file and
    each key at fault (a missing file, invalid JSON, a missing key, a wrong type or value)."""
    path = Path(bundle) / BUNDLE_CONFIG
    if not path.is_file():
        raise ArtifactError(f"{path}: no bundle config (a folder written by KNNLM.save_pretrained)")
    return read_checked_json(path, "bundle_config", remake="save the kNN-LM again with KNNLM.save_pretrained")


def bundle_lm_location(identity: dict, bundle: str | Path) -> dict:
    """The LM identity a bundle saved in folder `bundle` records: `identity` (HuggingFaceLM.identity or
    FairseqLM.identity) with, for a Hugging Face LM, 'hub': whether 'model' is a Hub id (no local folder of that
    name), and for a local folder its absolute path and 'model_relative', the path relative to the bundle (so a
    bundle moved with its model, or used from another working folder, finds it)."""
    out = dict(identity)
    if out.get("source") != "hf" or not out.get("model"):
        return out
    d = Path(str(out["model"])).expanduser()
    out["hub"] = not d.is_dir()
    if not out["hub"]:
        out["model"] = str(d.resolve())
        out["model_relative"] = os.path.relpath(d.resolve(), Path(bundle).resolve())
    return out


def find_bundle_lm(lm: dict, bundle: str | Path) -> str:
    """The Hugging Face model a bundle's config names (its 'lm' entry, bundle_lm_location): its folder relative to
    the bundle, else the absolute path it was saved with; a Hub id only when the bundle was made from one (so no
    moved folder is ever taken for a Hub id). Raises ArtifactError naming the bundle config and every place looked
    at."""
    path = Path(bundle) / BUNDLE_CONFIG
    model = str(lm.get("model") or "")
    if lm.get("hub") is True:
        return model
    tried = []
    for cand in ([Path(bundle) / lm["model_relative"]] if lm.get("model_relative") else []) + [Path(model).expanduser()]:
        if cand.is_dir():
            return str(cand)
        tried.append(str(cand))
    earlier = (f"; a bundle of an earlier version does not say whether {model!r} is a Hub id: if it is, pass "
               f"lm=HuggingFaceLM({model!r})") if lm.get("hub") is None else ""
    raise ArtifactError(f"{path}: the bundle's LM is not found (looked for {' and '.join(tried)}): pass the same "
                        f"weights as lm= (HuggingFaceLM(<its folder>)){earlier}")


def count_words(lines: list[str]) -> int:
    """WikiText words of `lines`: whitespace words plus one <eos> per line (knnlm.data.count_words)."""
    return sum(len(x.split()) for x in lines) + len(lines)


@dataclasses.dataclass
class Scored:
    """Per-token scores of a text: targets [T] int64 token ids; lp_lm, lp_knn, lp [T] float64 natural-log
    probabilities of each target under the base LM, the kNN distribution and their interpolation (Eq. 5); words:
    the text's WikiText word count. Perplexities are exp(total NLL / words) and exp(total NLL / T)."""

    targets: np.ndarray
    lp_lm: np.ndarray
    lp_knn: np.ndarray
    lp: np.ndarray
    words: int
    settings: dict

    @property
    def ppl_word(self) -> float:
        return float(np.exp(-self.lp.sum() / self.words))

    @property
    def ppl_token(self) -> float:
        return float(np.exp(-self.lp.mean()))

    @property
    def lm_ppl_word(self) -> float:
        return float(np.exp(-self.lp_lm.sum() / self.words))

    @property
    def lm_ppl_token(self) -> float:
        return float(np.exp(-self.lp_lm.mean()))

    def summary(self) -> dict:
        """{'tokens', 'words', 'ppl_word', 'ppl_token', 'lm_ppl_word', 'lm_ppl_token', **settings}."""
        return {"tokens": int(len(self.lp)), "words": int(self.words), "ppl_word": self.ppl_word,
                "ppl_token": self.ppl_token, "lm_ppl_word": self.lm_ppl_word, "lm_ppl_token": self.lm_ppl_token,
                **self.settings}


class KNNLM:
    """A base LM, a datastore (keys [N, D] fp16, vals [N] int32) and its IVFPQ index, interpolated as in Eq. 5.

    lm: FairseqLM or HuggingFaceLM; keys: [N, D] float16 array or memmap (needed for mask 'exact' and score 'real';
    may be None otherwise); vals: [N] int32; index: a faiss index or its path (needed for mask 'faiss');
    key: 'att' | 'ffn' (Xu et al. 2023, Sec. 3); metric: 'l2' | 'ip'; k neighbours; temperature τ > 0; lam λ in
    [0, 1]; nprobe: lists probed per query; mask: 'faiss' (IVFPQ top-k) | 'exact'; score: 'faiss' (PQ distances)
    | 'real' (recomputed from the keys; mask 'exact' always has real scores). context_window, max_tokens: the
    sliding windows of scoring (knnlm.lm.windows.window_states). manifest: the datastore's manifest (what LM, text
    and windows made the keys; verify() and save_pretrained() read it); tuned_on: where τ and λ come from, in words
    (saved with a bundle). Raises ValueError on a bad setting.
    """

    def __init__(self, lm, keys, vals, *, key: str, metric: str, k: int, temperature: float, lam: float,
                 index=None, nprobe: int | None = None, mask: str = "faiss", score: str = "faiss",
                 context_window: int = 0, max_tokens: int = 4096, threads: int | None = None, index_params=None,
                 manifest: dict | None = None, tuned_on: str | None = None):
        check_settings(key=key, metric=metric, mask=mask, score=score)
        if (mask == "exact" or score == "real") and keys is None:
            raise ValueError(f"mask {mask!r} / score {score!r} needs the datastore's keys")
        if mask == "faiss" and index is None:
            raise ValueError("mask 'faiss' needs an index (or use mask='exact')")
        self.lm, self.keys, self.vals = lm, keys, np.asarray(vals) if not isinstance(vals, np.memmap) else vals
        vocab = getattr(lm, "vocab_size", None)
        if vocab is not None and len(self.vals):  # a val outside the LM's vocabulary: another tokenizer's datastore
            lo, hi = _token_range(self.vals)
            if lo < 0 or hi >= int(vocab):
                raise ValueError(f"{getattr(self.vals, 'filename', None) or 'vals'}: token ids {lo} … {hi}, outside the "
                                 f"LM's vocabulary of {int(vocab)} (a datastore of another tokenizer?)")
        self.key, self.metric = key, metric
        self.k, self.temperature, self.lam = k, temperature, lam  # checked by their setters
        self.mask, self.score_from = mask, score
        self.context_window, self.max_tokens = int(context_window), int(max_tokens)
        self.threads = threads
        self.index_params = index_params
        self.manifest, self.tuned_on = manifest, tuned_on
        self.config: dict = {}  # config sections 'knn', 'temperature', 'stats' of a run (from_run): tune()'s grids
        self._index, self.nprobe = None, nprobe
        if index is not None:
            self._set_index(index, nprobe)

    @property
    def k(self) -> int:
        """Neighbours per query: an integer from 1 to the datastore's size; checked on assignment."""
        return self._k

    @k.setter
    def k(self, value) -> None:
        self._k = check_setting("k", value, integer=True, lo=1, hi=len(self.vals) if self.vals is not None else None)

    @property
    def temperature(self) -> float:
        """τ of Eq. 5, > 0; checked on assignment."""
        return self._temperature

    @temperature.setter
    def temperature(self, value) -> None:
        self._temperature = check_setting("temperature", value, lo=0.0, lo_open=True)

    @property
    def lam(self) -> float:
        """λ of Eq. 5, in [0, 1]; checked on assignment."""
        return self._lam

    @lam.setter
    def lam(self, value) -> None:
        self._lam = check_setting("lam", value, lo=0.0, hi=1.0)

    def _set_index(self, index, nprobe):
        import faiss

        from .search.index import read_index

        self._index = read_index(index) if isinstance(index, (str, Path)) else index
        self._ivf = faiss.extract_index_ivf(self._index)
        self.nprobe = int(nprobe or self._ivf.nprobe)
        self._ivf.nprobe = self.nprobe

    # ---- construction from a pipeline run -------------------------------------------------------------------
    @classmethod
    def from_run(cls, config, lm: str = "base", key: str = "att", metric: str = "l2", store: str = "full",
                 mask: str = "faiss", score: str = "faiss", tuned: bool = False, overrides: dict | None = None,
                 **settings) -> "KNNLM":
        """The kNN-LM of a finished (or partly finished) run: its LM, datastore and index of `store`.

        config: a config file (with `overrides`, a nested dict, merged as `--config` would) or a validated config
        dict. k is config 'knn.k'; τ and λ are those of Table 1's row for (key, metric) (its score JSON:
        the config τ and its λ tuned on valid; tuned=True: τ* and λ tuned on valid), unless given in `settings`
        (temperature=, lam=, k=, nprobe=). Raises ArtifactError naming the file when an artifact is missing.
        """
        from .config import load_config, validate_config
        from .search.index import resolve_index_params
        from .paths import Layout

        if store != "full":
            raise ValueError(f"store {store!r}: from_run reads the full store (the datastore's own rows); subsets and "
                             "PCA stores are the pipeline's ablations")
        cfg = validate_config(config) if isinstance(config, dict) else load_config(config, overrides)
        if lm not in cfg["lms"]:
            raise ArtifactError(f"config key 'lms': no base LM {lm!r} (has {sorted(cfg['lms'])})")
        lay = Layout.of(cfg)
        base = load_run_lm(cfg, lm)
        man_path = lay.path("datastore_manifest", lm=lm)
        need = [man_path, lay.path("vals", lm=lm), lay.path("keys", lm=lm, key=key)]
        if mask == "faiss":
            need.append(lay.path("index", lm=lm, store=store, key=key, metric=metric))
        missing = [str(p) for p in need if not Path(p).exists()]
        if missing:
            raise ArtifactError(f"run {lay.root}: missing {', '.join(missing)} (run the pipeline's dump and build_index "
                                f"jobs for lm {lm!r}, store {store!r} first)")
        man = read_checked_json(man_path, "datastore_manifest")
        keys = open_npy(lay.path("keys", lm=lm, key=key), (man["N"], man["D"]), np.float16)
        vals = open_npy(lay.path("vals", lm=lm), (man["N"],), np.int32)
        k = int(settings.pop("k", cfg["knn"]["k"]))
        if "temperature" not in settings or "lam" not in settings:
            sp = lay.path("score", lm=lm, store="full", key=key, metric=metric)
            if not sp.exists():
                raise ArtifactError(f"{sp}: no Table 1 score for {key}/{metric} to take τ and λ from; run the "
                                    f"pipeline's score job, or pass temperature= and lam=")
            s = read_checked_json(sp, "score")
            row = s["tuned"] if tuned else s
            settings.setdefault("temperature", row["temperature"])
            settings.setdefault("lam", row["lambda"])
            settings.setdefault("tuned_on", f"run {lay.root}, Table 1 ({key}/{metric}): " +
                                ("τ and λ tuned on valid" if tuned else "config τ, λ tuned on valid") + f" ({sp})")
        params = resolve_index_params(cfg["index"], man["N"], man["D"], k)
        settings.setdefault("nprobe", params["nprobe"])
        index = lay.path("index", lm=lm, store=store, key=key, metric=metric) if mask == "faiss" else None
        knn = cls(base, keys, vals, key=key, metric=metric, k=k, index=index, mask=mask, score=score,
                  context_window=cfg["eval"]["context_window"], max_tokens=cfg["eval"]["max_tokens"],
                  threads=cfg.get("threads"), index_params=dict(cfg["index"]), manifest=man, **settings)
        knn.config = {n: cfg[n] for n in ("knn", "temperature", "stats")}
        return knn

    @classmethod
    def from_datastore(cls, lm, folder: str | Path, key: str | None = None, metric: str = "l2", *, k: int = 1024,
                       temperature: float = 1.0, lam: float = 0.25, mask: str = "faiss", score: str = "faiss",
                       nprobe: int | None = None, index: dict | None = None, context_window: int | None = None,
                       max_tokens: int = 4096, threads: int = 2, verify: bool = True,
                       tuned_on: str | None = None, rebuild_index: bool = True, **peer) -> "KNNLM":
        """Any supported LM (FairseqLM, HuggingFaceLM) with a datastore folder in this pipeline's layout
        (knnlm.datastore.dump, build_datastore or knnlm.datastore.importer; knnlm.paths.DatastoreLayout). key: default
        the manifest's first key type. The IVFPQ index of (key, metric) in the folder is built when missing (mask
        'faiss'; parameters: config section 'index', `index` overriding its defaults); nprobe defaults to the resolved
        'auto' (rebuild_index=False: a missing index is an error instead). Defaults of k, τ, λ are Khandelwal et al.
        (2020)'s; context_window (the scoring windows' context) defaults to half the LM's window, as knn-transformers'
        stride of half the block. verify: check that this LM reproduces the stored
        keys (verify(); a few hundred rows' forward passes). Raises ArtifactError naming a missing or truncated file, a
        key type the datastore lacks, keys of another dimension than the LM's, or keys this LM's states do not
        reproduce. An LM whose weights' sha256 (its identity) differs from the one the manifest records is checked
        whatever `verify` says: its reproduced keys give a warning, others an error naming both sha256. `peer`: the
        peers' names (peer_settings: lmbda, knn_temp, knn_keytype, probe, knn_sim_func, recompute_dists, and
        dstore_size, checked against the datastore's rows). Every setting is checked before anything is read."""
        from .config import section_defaults
        from .datastore.dump import open_datastore
        from .search.index import build_ivfpq, resolve_index_params

        p = peer_settings(peer)
        key, temperature, lam = p.get("key", key), p.get("temperature", temperature), p.get("lam", lam)
        metric, nprobe, score = p.get("metric", metric), p.get("nprobe", nprobe), p.get("score", score)
        if context_window is None:
            context_window = lm.tokens_per_sample // 2
        check_settings(key=key or "att", metric=metric, k=k, temperature=temperature, lam=lam, mask=mask, score=score,
                       nprobe=nprobe, context_window=context_window, tokens_per_sample=lm.tokens_per_sample)
        ds = DatastoreLayout(folder)
        man_path = ds.path("manifest")
        if not man_path.is_file():
            raise ArtifactError(f"{man_path}: no datastore manifest (a folder from build_datastore or knnlm.datastore.importer)")
        key = key or read_checked_json(man_path, "datastore_manifest")["key_types"][0]
        keys, vals, man = open_datastore(man_path, ds.path("vals"), ds.path("keys", key=key), key)
        if "dstore_size" in p and int(p["dstore_size"]) != man["N"]:
            raise ArtifactError(f"{man_path}: dstore_size={p['dstore_size']} given, the datastore has {man['N']} rows")
        if man["D"] != lm.dim:
            raise ArtifactError(f"{ds.path('keys', key=key)}: keys of dim {man['D']}, the LM's hidden states have "
                                f"{lm.dim} (a datastore of another LM)")
        icfg = {**section_defaults("index"), **(index or {})}
        params = resolve_index_params(icfg, man["N"], man["D"], k)
        ipath = ds.path("index", key=key, metric=metric)
        imported = ds.path("index_meta", key=key, metric=metric)
        if ipath.exists() and imported.is_file():  # an imported index (import_index): its own lists and nprobe
            meta = read_json(imported)
            params = {**params, "nprobe": meta["nprobe"]}
            icfg = {**icfg, "ncentroids": meta["ncentroids"], "code_size": meta["code_size"], "imported": True}
        if mask == "faiss" and not ipath.exists():
            if not rebuild_index:
                raise ArtifactError(f"{ipath}: the {key}/{metric} index is missing; pass rebuild_index=True to train it "
                                    "again from the keys (an IVFPQ of other centroids: other FAISS neighbours), or "
                                    "mask='exact'")
            ipath.parent.mkdir(exist_ok=True)
            build_ivfpq(keys, metric, params, ipath, threads)
        knn = cls(lm, keys, vals, key=key, metric=metric, k=k, temperature=temperature, lam=lam,
                  index=ipath if mask == "faiss" else None, nprobe=nprobe or params["nprobe"], mask=mask, score=score,
                  context_window=context_window, max_tokens=max_tokens, threads=threads, index_params=icfg,
                  manifest=man, tuned_on=tuned_on or ("the defaults of Khandelwal et al. (2020): τ = 1, λ = 0.25"
                                                      if (temperature, lam) == (1.0, 0.25) else "given by the caller"))
        ident = getattr(lm, "identity", None) or {}
        have_tok, want_tok = ident.get("tokenizer_sha256"), man.get("tokenizer_sha256")
        if have_tok and want_tok and have_tok != want_tok:  # other tokenizer files: the same vocabulary?
            have_v, want_v = ident.get("vocab_sha256"), man.get("vocab_sha256")
            if have_v and want_v and have_v == want_v:
                log.info("%s: other tokenizer files (sha256 %s…, this LM's %s…), the same vocabulary", man_path,
                         want_tok[:16], have_tok[:16])
            elif have_v and want_v:
                raise ArtifactError(f"{man_path}: made with a tokenizer of sha256 {want_tok} (vocabulary sha256 "
                                    f"{want_v}), this LM's is {have_tok} (vocabulary {have_v}): its vals are token ids "
                                    "of another vocabulary; pass the LM and tokenizer that made it")
            else:
                log.warning("%s: made with a tokenizer of sha256 %s…, this LM's is %s…, and its vocabulary was not "
                            "recorded: check that the vals mean the same tokens", man_path, want_tok[:16], have_tok[:16])
        have, want = ident.get("checkpoint_sha256"), man.get("checkpoint_sha256")
        if have and want and have != want:  # another file than the one that made the keys: do its states match?
            v = knn.verify()  # refused here, naming both LMs and their sha256, unless the keys reproduce
            if not (v["matches"] and v["matches"][0] == key):  # no windows in the manifest: the keys cannot tell
                raise ArtifactError(f"{man_path}: made by an LM with checkpoint sha256 {want}, this LM's is {have}, and "
                                    "its manifest records no windows to recompute its keys in: pass the LM that made it")
            log.warning("%s: the datastore was made by an LM with checkpoint sha256 %s…, this LM's is %s…; its keys "
                        "reproduce (median relative error %.2g), so the same weights in another file", man_path,
                        want[:16], have[:16], v[key])
        elif verify:
            knn.verify()
        return knn

    # ---- bundles: a kNN-LM saved and loaded with everything that gives its numbers back -----------------------------
    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Save this kNN-LM as a bundle (the Hugging Face convention): a datastore folder (knnlm.paths.DatastoreLayout:
        keys of self.key, vals, manifest, the IVFPQ index of (key, metric)) and BUNDLE_CONFIG with the LM's identity
        (source, path or checkpoint, revision; the sha256 of the weights and tokenizer that made the keys, from the
        manifest), the hooked state (KEY_HOOKS), metric, k, τ, λ, nprobe, mask, score, the index parameters, the
        windows, the datastore's size and corpus sha256, where τ and λ were tuned, and the run's config sections
        'knn', 'temperature', 'stats' (tune() and compare() use them). Files are hard-linked where
        the file system allows, else copied; each is written under a temporary name and renamed. Returns out_dir.
        Raises ArtifactError when the keys or the manifest are not there to save."""
        import shutil

        from .io import atomic_path, write_json

        if self.keys is None or self.manifest is None:
            raise ArtifactError("save_pretrained: this kNN-LM has no keys or datastore manifest to save (build it with "
                                "from_run, from_datastore or build_datastore)")
        ds = DatastoreLayout(out_dir)
        ds.path("index", key=self.key, metric=self.metric).parent.mkdir(parents=True, exist_ok=True)
        linked = bool((self.manifest.get("linked_keys") or {}).get(self.key))
        for name, arr in (("keys", self.keys), ("vals", self.vals)):
            dst = ds.path(name, key=self.key)
            if name == "keys" and linked:  # keys read in place from a headerless file: the bundle gets an .npy of them
                from .io import create_npy, iter_chunks

                with create_npy(dst, arr.shape, np.float16) as out:
                    for a, b in iter_chunks(len(arr), 1 << 16, out, arr):
                        out[a:b] = arr[a:b]
                continue
            with atomic_path(dst) as tmp:
                src = getattr(arr, "filename", None)
                if src:
                    try:
                        os.link(src, tmp)
                    except OSError:
                        shutil.copyfile(src, tmp)
                else:
                    with open(tmp, "wb") as f:
                        np.save(f, np.asarray(arr, dtype=np.float16 if name == "keys" else np.int32))
        write_json(ds.path("manifest"), {**{n: v for n, v in self.manifest.items() if n != "linked_keys"},
                                         "key_types": [self.key]})
        if self._index is not None:
            import faiss

            with atomic_path(ds.path("index", key=self.key, metric=self.metric)) as tmp:
                faiss.write_index(self._index, str(tmp))
        man = self.manifest
        write_json(Path(out_dir) / BUNDLE_CONFIG, {
            "format": BUNDLE_FORMAT,
            "lm": {**bundle_lm_location(self.lm.identity, out_dir), "checkpoint_sha256": man.get("checkpoint_sha256"),
                   "tokenizer_sha256": man.get("tokenizer_sha256")},
            "key": self.key, "hook": KEY_HOOKS[self.key], "metric": self.metric, "k": self.k,
            "temperature": self.temperature, "lambda": self.lam, "nprobe": self.nprobe, "mask": self.mask,
            "score": self.score_from, "index": self.index_params, "context_window": self.context_window,
            "max_tokens": self.max_tokens, "tuned_on": self.tuned_on,
            "config": self.config,  # the run's grids and statistics for tune() and compare()
            "datastore": {n: man.get(n) for n in ("N", "D", "corpus", "data_sha256", "source", "tokens_per_sample",
                                                  "context_window")}})
        return Path(out_dir)

    @classmethod
    def from_pretrained(cls, bundle: str | Path, lm=None, *, verify: bool = True, threads: int = 2,
                        rebuild_index: bool = False, **settings) -> "KNNLM":
        """A kNN-LM saved by save_pretrained, with the k, τ, λ, nprobe, mask, score and windows it was saved with
        (`settings` override them: k=, temperature=, lam=, nprobe=, mask=, score=, or the peers' lmbda=,
        knn_temp=). lm: the LM (FairseqLM, HuggingFaceLM); default: the Hugging Face LM the bundle names
        (find_bundle_lm: a local folder by its path relative to the bundle, then as saved; a Hub id only when the
        bundle was made from one; a fairseq LM must be given). verify: as from_datastore (the LM must reproduce the
        stored keys); an LM whose weights' or tokenizer's sha256 differs from the bundle's is checked whatever
        `verify` says. rebuild_index: train a missing index again (else a missing index is an error). Raises
        ArtifactError naming BUNDLE_CONFIG when it is missing or of another format, when its LM is not found (what
        was looked for), and when the LM does not reproduce the keys (naming both identities)."""
        path = Path(bundle) / BUNDLE_CONFIG
        c = read_bundle_config(bundle)
        if lm is None:
            if c["lm"].get("source") != "hf":
                raise ArtifactError(f"{path}: the bundle's LM is a {c['lm'].get('source')} checkpoint "
                                    f"({c['lm'].get('checkpoint')}): pass it as lm= (FairseqLM)")
            lm = HuggingFaceLM(find_bundle_lm(c["lm"], bundle), dtype=c["lm"].get("dtype") or "float32",
                               revision=c["lm"].get("revision"))
        opts = {"k": c["k"], "temperature": c["temperature"], "lam": c["lambda"], "nprobe": c["nprobe"],
                "mask": c["mask"], "score": c["score"],
                **peer_settings({n: v for n, v in settings.items() if n in PEER_NAMES}),
                **{n: v for n, v in settings.items() if n not in PEER_NAMES}}
        for fixed, what in (("key", "key type"), ("metric", "metric")):
            if fixed in opts:  # the keys and the index it was saved with
                raise TypeError(f"from_pretrained: a bundle's {what} is the one it was saved with ({c[fixed]!r})")
        knn = cls.from_datastore(lm, bundle, c["key"], c["metric"], index=c.get("index"),
                                 context_window=c["context_window"], max_tokens=c["max_tokens"], threads=threads,
                                 verify=verify, tuned_on=c.get("tuned_on"), rebuild_index=rebuild_index, **opts)
        knn.config = c.get("config") or {}
        return knn

    def verify(self, rows: int = 256, seed: int = 0, tolerance: float = VERIFY_TOLERANCE) -> dict:
        """Recompute the keys of a seeded sample of datastore rows with this LM and compare them with the stored ones.

        The token stream is the vals' (row i's target is vals[i]; the stream starts with the LM's start token), fed
        in the sliding windows the manifest records (tokens_per_sample L, context_window C; the LM's and this
        kNN-LM's otherwise), aligned as the tool that wrote the store aligns them (the manifest's 'stream_offset'
        o): fairseq-eval-lm, urvashik/knnlm and this pipeline (o = 0) predict every token of the stream, the first
        from the start token, in windows of rows [w·b, (w+1)·b), b = L − C; knn-transformers' run_clm.py + KNNSaver
        (o = 1) never predicts the stream's first token (which its vals do not keep), so its windows hold rows
        [w·b − 1, (w+1)·b − 1). Either way window w is fed from stream position max(0, w·b − C). Rows whose window
        would need a token the store does not keep (o = 1: the first windows, fed from the stream's unknown first
        token) are not sampled. For both key types (att = the input of the last layer's FFN after its LayerNorm,
        knn-transformers' `last_ffn_input`; ffn = the final decoder output, `last_ffn_output`) it measures the
        relative L2 error ‖h − k‖ / ‖k‖ of every sampled row and judges the largest. Returns {'rows' (how many were
        checked), 'checked_rows' (which), 'att', 'ffn' (the largest errors), 'median' {'att', 'ffn'}, 'worst_rows'
        {'att', 'ffn'} (the rows of the largest errors), 'matches' (the key types within `tolerance`, closest
        first), 'key', 'windows' (whether the manifest records them)}. A manifest without the windows (a store
        imported with --unknown-windows) gives states with another amount of context than the dump's: then the
        result is only logged, as a warning when nothing matches. Raises ArtifactError, naming the key file, the
        worst row, the datastore's LM and this LM, when the stored keys are not this LM's states of type self.key
        (another LM, or keys of the other type: the error says which one matches), or when no row can be recomputed
        in the recorded windows."""
        man = self.manifest or {}
        n = len(self.vals)
        length = int(man.get("tokens_per_sample") or self.lm.tokens_per_sample)
        context = int(man.get("context_window", self.context_window) or 0)
        offset = int(man.get("stream_offset", 0))
        b = length - context
        window_of = lambda r: (r + offset) // b  # noqa: E731
        # with o = 1 the stream's first token is not kept: a window fed from stream position 0 cannot be recomputed
        first = 0 if offset == 0 else min(n, (context // b + 1) * b - offset)  # the first row of the first such window
        if first >= n:
            raise ArtifactError(f"{getattr(self.keys, 'filename', None) or 'the keys'}: none of the {n} rows can be "
                                f"recomputed in the recorded windows (tokens_per_sample {length}, context_window "
                                f"{context}, stream_offset {offset}): every window is fed from the stream's first token, "
                                "which the store does not keep")
        sample = first + np.sort(np.random.default_rng(seed).choice(n - first, size=min(rows, n - first),
                                                                    replace=False))
        stored = np.asarray(self.keys[sample], dtype=np.float32)
        got = {kt: np.empty_like(stored) for kt in ("att", "ffn")}
        with torch.inference_mode():
            for w in np.unique(window_of(sample)):
                a, e = max(0, int(w) * b - context), min(n, (int(w) + 1) * b - offset)
                # stream[a:e] with stream = [start] + vals: the states of rows a..e-1, the window's rows its last
                x = np.concatenate([[self.lm.start], np.asarray(self.vals[:e - 1])]) if a == 0 else \
                    np.array(self.vals[a - 1:e - 1])
                att, ffn, _ = self.lm.forward(torch.as_tensor(x, dtype=torch.int64)[None])
                here = np.nonzero(window_of(sample) == w)[0]
                for kt, h in (("att", att), ("ffn", ffn)):
                    got[kt][here] = h[0, sample[here] - a].float().cpu().numpy()
        norm = np.maximum(np.linalg.norm(stored, axis=1), 1e-6)
        rel = {kt: np.linalg.norm(got[kt] - stored, axis=1) / norm for kt in got}
        err = {kt: float(rel[kt].max()) for kt in rel}
        matches = sorted((kt for kt in ("att", "ffn") if err[kt] <= tolerance), key=err.get)
        out = {"rows": int(len(sample)), "checked_rows": [int(r) for r in sample], **err,
               "median": {kt: float(np.median(rel[kt])) for kt in rel},
               "worst_rows": {kt: int(sample[int(np.argmax(rel[kt]))]) for kt in rel}, "matches": matches,
               "key": self.key, "windows": "tokens_per_sample" in man}
        if not out["windows"]:
            (log.info if matches and matches[0] == self.key else log.warning)(
                "verify: the datastore's manifest does not record the windows its keys were dumped in, so their "
                "recomputed states are not comparable (largest relative error att %.3g, ffn %.3g); import it with the "
                "windows (python -m knnlm.importer: --block-size/--stride or --tokens-per-sample/--context-window) "
                "to check it", err["att"], err["ffn"])
            return out
        if not matches or matches[0] != self.key:
            what = (f"they are this LM's {matches[0]} states, not {self.key}: load the store with key={matches[0]!r}"
                    if matches else "they are neither this LM's att nor its ffn states (a datastore of another LM?)")
            raise ArtifactError(
                f"{getattr(self.keys, 'filename', None) or 'the keys'}: {self.key} keys of {len(sample)} rows recomputed "
                f"with this LM differ from the stored ones (largest relative error att {err['att']:.3g} at row "
                f"{out['worst_rows']['att']}, ffn {err['ffn']:.3g} at row {out['worst_rows']['ffn']}; median att "
                f"{out['median']['att']:.3g}, ffn {out['median']['ffn']:.3g}; tolerance {tolerance}): {what}. "
                f"Datastore's LM: { {k: man.get(k) for k in ('source', 'model', 'checkpoint_sha256') if man.get(k)} }; "
                f"this LM: {self.lm.identity}")
        return out

    # ---- the LM's pass ---------------------------------------------------------------------------------------
    def lm_pass(self, ids: np.ndarray, with_log_probs: bool = True) -> dict:
        """The LM over token ids [n] int64 (the stream after the start token): {'keys' [n, D] float32 (of key type
        self.key), 'targets' [n] int64, 'lp_lm' [n] float64}, in the pipeline's sliding windows."""
        from .lm.windows import window_states

        stream = np.concatenate([[self.lm.start], np.asarray(ids, dtype=np.int64)])
        parts: dict[str, list] = {"keys": [], "targets": [], "lp_lm": []}
        with torch.inference_mode():
            for b in window_states(self.lm.forward, stream, self.lm.tokens_per_sample, self.context_window,
                                   self.max_tokens, with_log_probs, desc="score", progress=False):
                parts["keys"].append(b[self.key].numpy())
                parts["targets"].append(b["target"].numpy())
                if with_log_probs:
                    parts["lp_lm"].append(b["lp"].numpy().astype(np.float64))
        return {name: np.concatenate(v) if v else None for name, v in parts.items()}

    # ---- retrieval ---------------------------------------------------------------------------------------------
    def neighbours(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k neighbours of queries [B, D] float32: (ids [B, k] int64 datastore rows, −1 where missing; dists [B, k]
        float32 in faiss convention: squared L2 or inner product), by self.mask with self.score's distances."""
        from .search.exact import exact_topk, recompute_distances
        from .search.index import search_filled

        q = np.ascontiguousarray(queries, dtype=np.float32)
        if self.mask == "exact":
            ids, dists = exact_topk(self.keys, q, min(self.k, len(self.vals)), self.metric, progress=False)
            return ids.astype(np.int64), dists
        if self.threads:
            import faiss

            faiss.omp_set_num_threads(int(self.threads))
        dists, ids, _, _ = search_filled(self._index, self._ivf, q, self.k, self.nprobe, self._ivf.nlist)
        if self.score_from == "real":
            dists = recompute_distances(self.keys, q, ids, self.metric)
        return ids.astype(np.int64), dists

    def knn_log_prob(self, queries: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """log p_kNN(target) per query: queries [B, D] float32, targets [B] int. Returns [B] float64 (−inf where no
        neighbour's val is the target)."""
        from .scoring.interpolation import knn_log_prob_from_cache

        ids, dists = self.neighbours(queries)
        return knn_log_prob_from_cache(ids, dists, self.vals, np.asarray(targets), self.metric, self.temperature)

    def knn_distribution(self, queries: np.ndarray) -> np.ndarray:
        """p_kNN over the whole vocabulary: [B, V] float64 (the neighbours' softmax(s/τ) summed per val, Eq. 5's M;
        knnlm.scoring.interpolation.knn_distribution)."""
        from .scoring.interpolation import knn_distribution

        ids, dists = self.neighbours(queries)
        return knn_distribution(ids, dists, self.vals, self.metric, self.temperature, self.lm.vocab_size)

    def mix(self, lm_log_probs: np.ndarray, knn_probs: np.ndarray) -> np.ndarray:
        """log((1 − λ) p_LM + λ p_kNN) over the vocabulary: lm_log_probs [B, V] natural-log, knn_probs [B, V]; [B, V]
        float64. The interpolation score() applies to the targets (knnlm.scoring.interpolation.interpolate)."""
        from .scoring.interpolation import interpolate

        with np.errstate(divide="ignore"):
            return interpolate(np.asarray(lm_log_probs), np.log(knn_probs), self.lam)

    # ---- tuning and comparing, as the pipeline does ---------------------------------------------------------------
    def _section(self, name: str, given: dict | None = None) -> dict:
        """Config section `name` of this kNN-LM's run (from_run), else the schema's defaults, `given` overriding."""
        from .config import section_defaults

        return {**section_defaults(name), **self.config.get(name, {}), **(given or {})}

    def tune(self, valid_text: str | list[str], tuned: bool = True, grids: dict | None = None) -> dict:
        """Tune λ and τ on a validation text as the pipeline's Table 1 does (Xu et al. 2023, Sec. 3 and 5.2), from one
        search of its tokens: λ on the grid of config 'knn.lambda_steps' at this kNN-LM's τ; τ* over the grid of
        config section 'temperature' (start, stop, step; extended by its own span while τ* is its last value, at most
        'max_extensions' times), each τ with its best λ of 'temperature.lambda_steps'; then λ* at τ* on the 'knn' grid.
        The grids are the run's (from_run) or the schema's defaults; `grids` ({'knn': {...}, 'temperature': {...}})
        overrides them. Sets τ, λ to (τ*, λ*) when `tuned`, else λ at the current τ, and records where they were
        tuned (saved with a bundle). Returns {'temperature', 'lambda' (at the current τ), 'tuned_temperature',
        'tuned_lambda', 'tau_grid', 'tau_edge', 'tokens', 'valid_nll_per_token' (interpolated, at each)}. Raises
        ValueError for an empty text and ConfigError naming the key for a grid the config schema refuses (a step
        ≤ 0, fewer than 2 λ steps, ...)."""
        import hashlib

        from .config import check_section, extend_while_on_edge, tau_edge, temperatures
        from .scoring.interpolation import (interpolate, knn_log_prob_from_cache, lambda_grid,
                                            sweep_temperature_from_cache, tune_lambda, tune_temperature)

        lines = text_lines(valid_text)
        if not lines:
            raise ValueError("tune: empty text")
        unknown = sorted(set(grids or {}) - {"knn", "temperature"})
        if unknown:
            raise ValueError(f"tune: grids has sections {unknown}; expected 'knn' and/or 'temperature'")
        c = {n: check_section(n, self._section(n, (grids or {}).get(n)), f"tune: grids['{n}']")
             for n in ("knn", "temperature")}
        run = self.lm_pass(self.lm.encode(lines))
        ids, dists = self.neighbours(run["keys"])  # the one search the whole tuning reads
        lp_lm, targets = run["lp_lm"], run["targets"]
        grid = lambda_grid(c["knn"]["lambda_steps"])
        lp_knn = knn_log_prob_from_cache(ids, dists, self.vals, targets, self.metric, self.temperature)
        lam, _ = tune_lambda(lp_lm, lp_knn, grid)
        taus = temperatures(c)
        sweep = sweep_temperature_from_cache(ids, dists, self.vals, targets, self.metric, taus)

        def add(more):
            nonlocal sweep
            sweep = np.concatenate([sweep, sweep_temperature_from_cache(ids, dists, self.vals, targets, self.metric,
                                                                        more)])

        taus, i = extend_while_on_edge(c, taus, lambda g: tune_temperature(lp_lm, sweep, g,
                                                                           c["temperature"]["lambda_steps"]), add)
        lam_star, _ = tune_lambda(lp_lm, sweep[i], grid)
        out = {"temperature": self.temperature, "lambda": float(lam), "tuned_temperature": float(taus[i]),
               "tuned_lambda": float(lam_star), "tau_grid": [float(t) for t in taus], "tau_edge": tau_edge(taus, i, c),
               "tokens": int(len(targets)),
               "valid_nll_per_token": {
                   "at τ": float(-interpolate(lp_lm, lp_knn, lam).mean()),
                   "at τ*": float(-interpolate(lp_lm, sweep[i], lam_star).mean())}}
        digest = hashlib.sha256("".join(lines).encode()).hexdigest()[:16]
        if tuned:
            self.temperature, self.lam = out["tuned_temperature"], out["tuned_lambda"]
        else:
            self.lam = out["lambda"]
        self.tuned_on = (f"KNNLM.tune on a text of {len(targets)} tokens (sha256 {digest}…): "
                         + ("τ* and λ*" if tuned else f"λ at τ = {self.temperature:g}"))
        return out

    def compare(self, text: str | list[str], against="lm", stats: dict | None = None) -> dict:
        """The paired comparison the pipeline's tables make, on a text: this kNN-LM's perplexity per word relative
        to `against` ('lm': its base LM, as Table 1's 'vs base' rows; or another KNNLM of the same LM), ppl_a / ppl_b
        − 1, with the 95 % interval over the text's documents (found as the pipeline finds a split's, config
        'stats.documents': with 'auto', WikiText articles when the text has at least 'stats.target_documents' of
        their headings, else paragraphs or token blocks; the result's 'unit' says which; knnlm.statistics.documents)
        and the verdict (knnlm.statistics.intervals.compare, config section 'stats' of the run or its defaults,
        `stats` overriding). Returns {'comparison', 'relative difference', 'CI low', 'CI high', 'verdict',
        'documents', 'effective', 'unit', 'ppl': {name: {'value', 'lo', 'hi'}}}. Raises ValueError when `against` is
        a kNN-LM of another tokenizer (other targets) or fewer than 2 documents are found."""
        from .statistics.documents import SCHEME_NAMES, lines_token_documents
        from .statistics.intervals import compare as paired, per_document

        lines = text_lines(text)
        st = self._section("stats", stats)
        enc = self.lm.encode_lines(lines)
        doc, scheme, _ = lines_token_documents(lines, enc["line"], st["documents"], st["block_tokens"],
                                               st["target_documents"], min_block_tokens=st["min_block_tokens"])
        doc_words = np.bincount(doc, weights=enc["words"]).astype(np.int64)
        if len(doc_words) < 2:
            raise ValueError(f"compare: the text has {len(doc_words)} document ({SCHEME_NAMES[scheme]}); an interval over "
                             "documents needs at least 2")
        mine = self.score(lines)
        name = f"kNN-LM {self.key}/{self.metric.upper()}"
        if isinstance(against, str):
            if against != "lm":
                raise ValueError(f"compare: against must be 'lm' or a KNNLM, found {against!r}")
            other, other_name = mine.lp_lm, "base"
        else:
            theirs = against.score(lines)
            if not np.array_equal(theirs.targets, mine.targets):
                raise ValueError("compare: the other kNN-LM's LM tokenizes the text into other targets")
            other, other_name = theirs.lp, f"kNN-LM {against.key}/{against.metric.upper()}"
            if other_name == name:
                other_name += " (other)"
        nll = per_document(-np.stack([mine.lp, other]), doc, len(doc_words))
        res = paired(nll, doc_words, [name, other_name], [(name, other_name)], {**st, "scheme": scheme})
        d = res["diff"][f"{name} vs {other_name}"]
        return {"comparison": f"{name} vs {other_name}", "relative difference": d["value"], "CI low": d["lo"],
                "CI high": d["hi"], "verdict": d["verdict"], "documents": d["documents"], "effective": d["effective"],
                "unit": SCHEME_NAMES[scheme], "ppl": res["ppl"]}

    # ---- scoring and generation -------------------------------------------------------------------------------
    def score(self, text: str | list[str]) -> Scored:
        """Score a text (a string, or its lines) as the pipeline scores a split: every line's tokens and its end of
        line are targets, the first predicted from the start token. Returns Scored (per-token log-probs, perplexity
        per word and per token, and the settings used). Raises ValueError for an empty text."""
        from .scoring.interpolation import interpolate

        lines = text_lines(text)
        if not lines:
            raise ValueError("score: empty text")
        run = self.lm_pass(self.lm.encode(lines))
        lp_knn = self.knn_log_prob(run["keys"], run["targets"])
        lp = interpolate(run["lp_lm"], lp_knn, self.lam)
        return Scored(run["targets"], run["lp_lm"], lp_knn, lp, count_words(lines), self.settings())

    def score_texts(self, texts: list[str]) -> list[Scored]:
        """score() of each of several texts (documents scored apart, each from the start token), in one call."""
        return [self.score(t) for t in texts]

    def settings(self) -> dict:
        """The kNN-LM's settings: key, metric, k, temperature, lambda, mask, score, nprobe."""
        return {"key": self.key, "metric": self.metric, "k": self.k, "temperature": self.temperature,
                "lambda": self.lam, "mask": self.mask, "score": self.score_from,
                "nprobe": self.nprobe if self.mask == "faiss" else None}

    @torch.inference_mode()
    def next_token_log_probs(self, context_ids) -> np.ndarray:
        """Interpolated log-probs of the next token over the vocabulary, [V] float64, after token ids `context_ids`
        (the start token is prepended; the last tokens_per_sample are fed, the LM's window)."""
        ids = np.concatenate([[self.lm.start], np.asarray(context_ids, dtype=np.int64)])
        x = torch.as_tensor(ids[-self.lm.tokens_per_sample:])[None]
        att, ffn, logits = self.lm.forward(x)
        h = (att if self.key == "att" else ffn)[0, -1:].float().cpu().numpy()
        lp_lm = logits[0, -1:].float().log_softmax(-1).cpu().numpy()
        return self.mix(lp_lm, self.knn_distribution(h))[0]

    def generate(self, prompt: str, max_new_tokens: int = 30, sample: bool = False, top_k: int = 0,
                 seed: int = 0) -> str:
        """Continue `prompt` with tokens drawn from the interpolated distribution (greedy unless `sample`; top_k > 0
        samples among the top_k tokens). Returns the continuation's text (generate_ids for the token ids)."""
        return self.lm.decode(self.generate_ids(self.lm.encode_prompt(prompt), max_new_tokens, sample, top_k, seed))

    def generate_ids(self, prompt_ids, max_new_tokens: int = 30, sample: bool = False, top_k: int = 0,
                     seed: int = 0) -> list[int]:
        """The token ids generate() draws after token ids `prompt_ids` (the start token is prepended). Within the LM's
        window the LM decodes step by step (knnlm.lm.decoding.step_decoder: incremental for a fairseq LM), beyond it
        each step runs the window's last tokens (next_token_log_probs); the same distributions either way."""
        from .lm.decoding import start

        rng = np.random.default_rng(seed)
        ids, new = [int(i) for i in prompt_ids], []
        dec = None
        if 1 + len(ids) + max_new_tokens <= self.lm.tokens_per_sample:
            with torch.inference_mode():
                dec, seq = start(self.lm, torch.tensor([ids], dtype=torch.long).reshape(1, len(ids)))
        for _ in range(max_new_tokens):
            if dec is None:
                lp = self.next_token_log_probs(ids)
            else:
                att, ffn, lp_lm = dec.step(seq)
                h = (att if self.key == "att" else ffn).cpu().numpy()
                lp = self.mix(lp_lm.cpu().numpy(), self.knn_distribution(h))[0]
            if sample:
                cand = np.argsort(-lp)[:top_k] if top_k else np.arange(len(lp))
                p = np.exp(lp[cand] - lp[cand].max())
                t = int(rng.choice(cand, p=p / p.sum()))
            else:
                t = int(np.argmax(lp))
            ids.append(t)
            new.append(t)
            if dec is not None:
                seq = torch.cat([seq, torch.tensor([[t]])], 1)
        return new

    def wrap(self):
        """Make the Hugging Face model's own forward this kNN-LM (HuggingFaceLM only; knn-transformers' KNNWrapper
        .break_into does the same): the model's `logits` become Eq. 5's log-probabilities log((1 − λ) softmax(W_sm h_sm)
        + λ p_kNN(h_ds)) at every position ([B, T, V] float32; a softmax of them is the mixture itself; mix(), the
        one interpolation of the API), and with `labels` its `loss` is their mean NLL of labels[:, 1:] (−100
        ignored), as the model's own loss is. The forward keeps the model's signature (functools.wraps), so
        Trainer.evaluate / predict (whose default remove_unused_columns reads it), model.generate and any code that
        calls the model see the kNN-LM with their defaults. The keys are the inputs of the hooked module (KEY_HOOKS),
        captured by a forward pre-hook; with a cache (generate) only the positions whose logits the model returns
        are mixed. This kNN-LM's own score / tune / compare / generate keep reading the LM's own forward
        (knnlm.lm.hf.own_forward), so they give the same numbers wrapped or not. Feed the start token first, as
        score() does (knn.lm.start): the loss over [start] + ids equals score()'s NLL of ids within one window.
        Returns the model (knn.lm.model); unwrap() restores it. Raises ValueError for a fairseq LM, or for a model
        another kNN-LM has wrapped."""
        import functools

        from .lm.hf import OWN_FORWARD, find_key_modules

        if not isinstance(self.lm, HuggingFaceLM):
            raise ValueError("wrap needs a Hugging Face LM; use KNNLM.score / generate for a fairseq LM")
        model = self.lm.model
        if getattr(self, "_wrapped", None):
            return model
        if OWN_FORWARD in model.__dict__:
            raise ValueError("wrap: another kNN-LM already wraps this model; unwrap() it first")
        att_mod, out_mod = find_key_modules(model)
        cap: dict[str, torch.Tensor] = {}
        hook = (att_mod if self.key == "att" else out_mod).register_forward_pre_hook(
            lambda m, a: cap.__setitem__("h", a[0]))
        original = model.forward
        knn = self

        @functools.wraps(original)
        def forward(*args, labels=None, **kwargs):
            kwargs["return_dict"] = True
            out = original(*args, **kwargs)
            logits = out.logits
            b, t, v = logits.shape
            h = cap["h"]
            h = h.reshape(b, -1, h.shape[-1])[:, -t:].reshape(b * t, -1).float().cpu().numpy()
            lp_lm = logits.float().log_softmax(-1).reshape(b * t, v).cpu().numpy()
            mixed = torch.as_tensor(knn.mix(lp_lm, knn.knn_distribution(h)), dtype=torch.float32,
                                    device=logits.device).reshape(b, t, v)
            out.logits, out.loss = mixed, None
            if labels is not None:
                out.loss = torch.nn.functional.nll_loss(mixed[:, :-1].reshape(-1, v),
                                                        labels[:, 1:].reshape(-1).to(mixed.device), ignore_index=-100)
            return out

        model.forward = forward
        model.__dict__[OWN_FORWARD] = original
        self._wrapped = (model, hook)
        return model

    def unwrap(self) -> None:
        """Undo wrap(): the model's own forward and no hook of this kNN-LM."""
        wrapped = getattr(self, "_wrapped", None)
        if wrapped:
            from .lm.hf import OWN_FORWARD

            model, hook = wrapped
            hook.remove()
            del model.forward  # the instance's forward: the class's is the model's own again
            model.__dict__.pop(OWN_FORWARD, None)
            self._wrapped = None

    def logits_processor(self):
        """A Hugging Face LogitsProcessor that mixes this kNN distribution into model.generate (HuggingFaceLM only):
        see KNNLogitsProcessor."""
        if not isinstance(self.lm, HuggingFaceLM):
            raise ValueError("logits_processor needs a Hugging Face LM; use KNNLM.generate for fairseq LMs")
        return KNNLogitsProcessor(self)

    # ---- a datastore from any text ------------------------------------------------------------------------------
    @classmethod
    def build(cls, lm, text, out_dir: str | Path, key: str = "att", metric: str = "l2", *, k: int = 1024,
              temperature: float = 1.0, lam: float = 0.25, mask: str = "faiss", score: str = "faiss",
              context_window: int | None = None, max_tokens: int = 4096, index: dict | None = None, threads: int = 2,
              verify: bool = False, **peer) -> "KNNLM":
        """A kNN-LM from any supported LM and any text, without a pipeline run (Khandelwal et al. 2020; Xu et al.
        2023, Eq. 5): dump the LM's keys (att and ffn, [N, D] fp16) and vals ([N] int32) over the text's tokens in its
        sliding windows (tokens_per_sample, `context_window`), record the manifest (the LM's identity, the windows,
        the text's sha256), build the IVFPQ index of (key, metric) (config section 'index', `index` overriding its
        defaults) in out_dir (knnlm.paths.DatastoreLayout), and return the kNN-LM on it.

        lm: FairseqLM or HuggingFaceLM; text: a string, a list of lines, or a file (a pathlib.Path) or a list of
        files, read as UTF-8; k, temperature, lam, mask, score: the kNN-LM's settings (Khandelwal et al.'s
        defaults; tune() sets τ and λ on a validation text), or the peers' names (peer_settings); context_window:
        the context each window carries before its targets, default half the LM's window (knn-transformers' stride
        of half the block: every key but the first window's has at least that much context, and no token is dumped
        twice); verify: recompute a sample of keys (verify()). Every setting, the text and the windows are checked
        before anything is written. Raises ValueError for a bad setting or a text of fewer tokens than k, and
        ArtifactError naming a file that is missing."""
        import hashlib

        from .lm import LMPass
        from .datastore.dump import dump_datastore
        from .lm.windows import window_states

        if isinstance(text, Path) or (isinstance(text, list) and text and all(isinstance(t, Path) for t in text)):
            files = [text] if isinstance(text, Path) else text
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise ArtifactError(f"KNNLM.build: missing text file(s) {missing}")
            text = "".join(f.read_text(encoding="utf-8") for f in files)
        p = peer_settings(peer)
        p.pop("dstore_size", None)  # the text's tokens are the datastore's rows
        key, metric, temperature, lam = (p.get("key", key), p.get("metric", metric), p.get("temperature", temperature),
                                         p.get("lam", lam))
        score, nprobe = p.get("score", score), p.get("nprobe")
        if context_window is None:
            context_window = lm.tokens_per_sample // 2
        check_settings(key=key, metric=metric, k=k, temperature=temperature, lam=lam, mask=mask, score=score,
                       nprobe=nprobe, context_window=context_window, tokens_per_sample=lm.tokens_per_sample)
        lines = text_lines(text)
        ids = lm.encode(lines)
        if len(ids) < k:
            raise ValueError(f"KNNLM.build: the text has {len(ids)} tokens, fewer than k = {k}")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stream = np.concatenate([[lm.start], ids])

        def states(split, lp):
            return window_states(lm.forward, stream, lm.tokens_per_sample, context_window, max_tokens, lp,
                                 desc="datastore")

        digest = hashlib.sha256("".join(lines).encode()).hexdigest()
        lmp = LMPass(n=lambda split: len(ids), d=int(lm.dim), states=states,
                     identity=lambda split: {**lm.identity, "data_sha256": digest, "context_window": context_window,
                                             "tokens_per_sample": lm.tokens_per_sample})
        ds = DatastoreLayout(out)
        dump_datastore(lmp, {kt: ds.path("keys", key=kt) for kt in ("att", "ffn")}, ds.path("vals"),
                       ds.path("manifest"), threads)
        return cls.from_datastore(lm, out, key, metric, k=k, temperature=temperature, lam=lam, mask=mask,
                                  score=score, nprobe=nprobe, index=index, context_window=context_window,
                                  max_tokens=max_tokens, threads=threads, verify=verify)

    def build_datastore(self, text: str | list[str], out_dir: str | Path, index: dict | None = None,
                        threads: int = 2) -> "KNNLM":
        """KNNLM.build with this kNN-LM's LM, key type, metric, k, τ, λ, mask, score, windows and index parameters
        (`index` overriding them): the same settings on a datastore of other text (the domain-adaptation use of
        Khandelwal et al. 2020, Sec. 4.3). Raises ValueError when the text has fewer tokens than k."""
        return type(self).build(self.lm, text, out_dir, self.key, self.metric, k=self.k, temperature=self.temperature,
                                lam=self.lam, mask=self.mask, score=self.score_from,
                                context_window=self.context_window, max_tokens=self.max_tokens,
                                index={**(self.index_params or {}), **(index or {})}, threads=threads)


def load_run_lm(cfg: dict, lm: str) -> LanguageModel:
    """FairseqLM or HuggingFaceLM of base LM `lm` of a validated run config, by its backend (knnlm.lm.backend of
    config 'lms.<lm>.source', its run_lm: the trained or shipped checkpoint with the run's BPE and dictionary,
    config 'lms.<lm>.path', or its Hugging Face model card). Raises ArtifactError naming the file when it is missing."""
    from .paths import Layout

    return backend(cfg["lms"][lm]["source"]).impl().run_lm(cfg, lm, Layout.of(cfg))


try:  # transformers is optional for fairseq-only use
    from transformers import LogitsProcessor as _LogitsProcessor
except ImportError:  # pragma: no cover
    _LogitsProcessor = object


class KNNLogitsProcessor(_LogitsProcessor):
    """Mixes p_kNN into each next-token distribution of a Hugging Face model.generate (Eq. 5 over the whole
    vocabulary): returns log((1 − λ) softmax(scores) + λ p_kNN(h)), h the key of the position just fed, captured by
    the KNNLM's hooks on the same model. Use: model.generate(ids, logits_processor=LogitsProcessorList([proc]),
    ...) with knn.lm.model as `model`. Processors that run before it must leave the scores as logits."""

    def __init__(self, knn: KNNLM):
        self.knn = knn
        self._last: dict[str, torch.Tensor] = {}
        from .lm.hf import find_key_modules

        att_mod, out_mod = find_key_modules(knn.lm.model)
        mod = att_mod if knn.key == "att" else out_mod
        self._hook = mod.register_forward_pre_hook(lambda m, a: self._last.__setitem__("h", a[0]))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        h = self._last["h"]
        h = h.reshape(scores.shape[0], -1, h.shape[-1])[:, -1].float().cpu().numpy()
        lp_lm = scores.float().log_softmax(-1).cpu().numpy()
        mixed = self.knn.mix(lp_lm, self.knn.knn_distribution(h))
        return torch.as_tensor(mixed, dtype=scores.dtype, device=scores.device)

    def close(self) -> None:
        """Remove the hook from the model."""
        self._hook.remove()
