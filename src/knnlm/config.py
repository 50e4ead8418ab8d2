"""Experiment configs: load YAML, validate against workflow/schemas/config.schema.yaml, fill defaults.

Errors name the config key, what was expected and what was found.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = PROJECT_ROOT / "workflow" / "schemas" / "config.schema.yaml"
SPLITS = ("train", "valid", "test")
RAW_SPLIT_NAME = "wiki.{split}.tokens"  # the raw corpus files in config key 'data.dir' (WikiText layout)
# the values of config 'lms.<name>.source' whose LMs read the run's own BPE tokens (knnlm.lm.BACKENDS' run_tokens);
# an 'hf' LM tokenises the text itself
RUN_TOKEN_SOURCES = ("train", "fairseq")


class ConfigError(ValueError):
    """A config value is missing, of the wrong type, or points at something that does not exist."""


def load_schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def section_defaults(section: str) -> dict:
    """The schema's defaults of config section `section` (e.g. 'stats'), as a config without it gets them (a copy)."""
    return copy.deepcopy(_section_defaults(section))


@functools.lru_cache(maxsize=None)
def _section_defaults(section: str) -> dict:
    return _fill_defaults({}, load_schema()["properties"][section])


def _fill_defaults(node: Any, schema: dict) -> Any:
    if schema.get("type") == "object" or "properties" in schema:
        if node is None:
            node = copy.deepcopy(schema.get("default", {}))
        if isinstance(node, dict):
            for key, sub in schema.get("properties", {}).items():
                if key not in node and "default" in sub:
                    node[key] = copy.deepcopy(sub["default"])
                if key in node and isinstance(node[key], dict):
                    node[key] = _fill_defaults(node[key], sub)
    return node


def check_section(section: str, values: dict, source: str) -> dict:
    """Config section `section` given as `values` (e.g. the grids of KNNLM.tune), with the schema's defaults filled
    in and checked against the schema. Returns the filled section. Raises ConfigError naming `source`, the key, what
    was expected and what was found."""
    sub = load_schema()["properties"][section]
    filled = _fill_defaults(copy.deepcopy(values), sub)
    errors = sorted(jsonschema.Draft202012Validator(sub).iter_errors(filled), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e).replace("config key '", f"config key '{section}.", 1)
                                                   for e in errors))
    return filled


def _describe(err: jsonschema.ValidationError) -> str:
    """A config schema error as 'config key '<key>': expected …, found …' (knnlm.io.schema_error)."""
    from .io import schema_error

    return schema_error(err, "config key")


def _check_keys_and_metrics(cfg: dict, source: str) -> None:
    """Every section that names key types or metrics names only those the datastore dumps ('datastore.key_types')
    and the index builds ('index.metrics'); ConfigError naming the key otherwise, before any job runs."""
    var = cfg["variance"]
    varied = bool(var["index_seeds"] or var["draw_seeds"])  # the variance section is used only then
    rg = cfg["regime"]
    key_types = {"retrieval.key_types": cfg["retrieval"]["key_types"],
                 "datastore_size.key_types": cfg["datastore_size"]["key_types"],
                 "parametric.key_types": cfg["parametric"]["key_types"],
                 **{f"parametric.{p}.key_types": cfg["parametric"][p]["key_types"] for p in ("adaptive", "mos", "clustered")},
                 **({"variance.key_type": [var["key_type"]]} if varied else {}),
                 "table4.key_type": [cfg["table4"]["key_type"]],
                 "regime.key_type / regime.variants": [rg["key_type"]] + [k for k, _ in rg["variants"]]}
    metrics = {"retrieval.metrics": cfg["retrieval"]["metrics"], "datastore_size.metrics": cfg["datastore_size"]["metrics"],
               "regime.metric / regime.variants": [rg["metric"]] + [m for _, m in rg["variants"]],
               **({"variance.metric": [var["metric"]]} if varied else {}), "table4.metric": [cfg["table4"]["metric"]]}
    for named, source_key, noun, verb in ((key_types, "datastore.key_types", "key types", "dump"),
                                          (metrics, "index.metrics", "metrics", "build")):
        have = cfg[source_key.split(".")[0]][source_key.split(".")[1]]
        for k, v in named.items():
            if set(v) - set(have):
                raise ConfigError(f"{source}: config key '{k}' names {noun} {sorted(set(v) - set(have))} that "
                                  f"'{source_key}' does not {verb} (it {verb}s {have})")


def _check_regime(cfg: dict, source: str) -> None:
    """Fill config 'regime''s defaults from the run ('lms': every LM of 'lms' over the run's BPE; 'ratios':
    'datastore_size.ratios') and check them: ConfigError for an LM 'lms' does not have or one with its own tokenizer
    (its tokens are not the others', so its points would not pair), or a variant that repeats the map's own pair."""
    rg = cfg["regime"]
    own_bpe = [n for n, lm in cfg["lms"].items() if lm["source"] in RUN_TOKEN_SOURCES]
    if rg["lms"] is None:
        rg["lms"] = own_bpe
    bad = [n for n in rg["lms"] if n not in own_bpe]
    if bad:
        raise ConfigError(f"{source}: config key 'regime.lms' names {bad}: expected LMs of 'lms' that read the run's "
                          f"own BPE (so every point scores the same tokens): {own_bpe}")
    if rg["ratios"] is None:
        rg["ratios"] = list(cfg["datastore_size"]["ratios"])
    if [rg["key_type"], rg["metric"]] in [list(v) for v in rg["variants"]]:
        raise ConfigError(f"{source}: config key 'regime.variants' repeats the map's own (key_type, metric) "
                          f"{[rg['key_type'], rg['metric']]}: expected other pairs")


def _check_lms(cfg: dict, schema: dict, source: str) -> None:
    """Fill the defaults of each 'lms' entry (and 'eval.context_window' when null: 128, or half the smallest LM window);
    ConfigError for a missing 'path', 'lm' overrides of a non-'train' LM
    or of keys section 'lm' does not have, a context window not below the LM's window, or a trained LM whose
    section 'lm' (with its overrides) fails the schema or has attention heads that do not divide its width."""
    item = schema["properties"]["lms"]["additionalProperties"]["properties"]
    lm_schema = jsonschema.Draft202012Validator(schema["properties"]["lm"])
    ev = cfg["eval"]
    for lm in cfg["lms"].values():
        for k, sub in item.items():
            lm.setdefault(k, copy.deepcopy(sub.get("default")))
    if ev["context_window"] is None:  # 128, or half the smallest LM window where 128 does not fit
        ev["context_window"] = min(128, min(lm_tokens_per_sample(cfg, n) for n in cfg["lms"]) // 2)
    for name, lm in cfg["lms"].items():
        for k, sub in item.items():
            lm.setdefault(k, copy.deepcopy(sub.get("default")))
        if lm["source"] != "train" and not lm.get("path"):
            raise ConfigError(f"{source}: config key 'lms.{name}.path': a {lm['source']!r} LM needs a path "
                              f"({'a checkpoint file' if lm['source'] == 'fairseq' else 'a model directory or Hub id'}), found none")
        if lm["source"] == "train" and lm.get("path"):
            raise ConfigError(f"{source}: config key 'lms.{name}.path': a 'train' LM is trained from section 'lm'; "
                              f"found path {lm['path']!r} (use source 'fairseq' for an existing checkpoint)")
        if lm["lm"] and lm["source"] != "train":
            raise ConfigError(f"{source}: config key 'lms.{name}.lm': only a 'train' LM takes section 'lm' overrides, "
                              f"found them on a {lm['source']!r} LM")
        unknown = sorted(set(lm["lm"]) - set(cfg["lm"]))
        if unknown:
            raise ConfigError(f"{source}: config key 'lms.{name}.lm': {unknown} are not keys of section 'lm' "
                              f"(allowed: {sorted(cfg['lm'])})")
        window = lm_tokens_per_sample(cfg, name)
        if ev["context_window"] >= window:
            key = f"lms.{name}.tokens_per_sample" if lm.get("tokens_per_sample") else "lm.tokens_per_sample"
            raise ConfigError(f"{source}: config key 'eval.context_window' must be < '{key}' ({window}, the window "
                              f"of base LM {name!r}), found {ev['context_window']}")
        if lm["source"] != "train":
            continue
        sec, where = lm_section(cfg, name), (f"lms.{name}.lm" if lm["lm"] else "lm")
        for err in lm_schema.iter_errors(sec):
            raise ConfigError(f"{source}: config key '{where}.{'.'.join(map(str, err.absolute_path))}': expected "
                              f"{ {k: v for k, v in err.schema.items() if k not in ('description', 'default')} }, "
                              f"found {err.instance!r}")
        if sec["decoder_embed_dim"] % sec["decoder_attention_heads"]:
            raise ConfigError(
                f"{source}: config key '{where}.decoder_attention_heads' must divide '{where}.decoder_embed_dim' "
                f"({sec['decoder_embed_dim']}), found {sec['decoder_attention_heads']}")
    _check_derived_lms(cfg, source)


ARCHITECTURE = ("decoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads")


def derived_lm(cfg: dict, name: str) -> bool:
    """Whether base LM `name` is trained from another LM of the run ('init_from' or 'teacher', App. E.6): such an LM
    is an object of the hypotheses, not a base LM of Table 4."""
    lm = cfg["lms"][name]
    return bool(lm.get("init_from") or lm.get("teacher"))


def table4_lms(cfg: dict) -> list[str]:
    """The base LMs of Table 4 (App. A), in the order of 'lms': config 'table4.lms', or every LM of 'lms' that is not
    trained from another one (derived_lm) when it is null."""
    chosen = cfg["table4"]["lms"]
    return [n for n in cfg["lms"] if not derived_lm(cfg, n) and (chosen is None or n in chosen)]


def _check_table4_lms(cfg: dict, source: str) -> None:
    """ConfigError for a 'table4.lms' entry that is not a base LM of 'lms' (not derived_lm), or that leaves out the
    primary LM."""
    chosen = cfg["table4"]["lms"]
    if chosen is None:
        return
    base = [n for n in cfg["lms"] if not derived_lm(cfg, n)]
    bad = [n for n in chosen if n not in base]
    primary = next(iter(cfg["lms"]))
    if bad or primary not in chosen:
        raise ConfigError(f"{source}: config key 'table4.lms': expected names of 'lms' not trained from another LM "
                          f"({base}) including the primary LM {primary!r}, found {chosen}")


def _check_derived_lms(cfg: dict, source: str) -> None:
    """ConfigError for an 'init_from' or 'teacher' that is not another LM of 'lms' of the right source (init_from:
    'train' with the same architecture; teacher: 'train' or 'fairseq'), for a cycle of 'init_from', and for
    'hypotheses.overfit_lms' / 'soft_label_lms' entries that are not such LMs of the primary LM."""
    lms = cfg["lms"]
    primary = next(iter(lms))
    for name, lm in lms.items():
        for key, sources in (("init_from", ("train",)), ("teacher", ("train", "fairseq"))):
            other = lm.get(key)
            if other is None:
                continue
            if lm["source"] != "train":
                raise ConfigError(f"{source}: config key 'lms.{name}.{key}': only a 'train' LM is trained from another "
                                  f"LM, found it on a {lm['source']!r} LM")
            if other == name or other not in lms or lms[other]["source"] not in sources:
                raise ConfigError(f"{source}: config key 'lms.{name}.{key}': expected the name of another LM of 'lms' "
                                  f"with source {' or '.join(map(repr, sources))}, found {other!r}")
        if lm.get("init_from"):
            mine, theirs = lm_section(cfg, name), lm_section(cfg, lm["init_from"])
            diff = [k for k in ARCHITECTURE if mine[k] != theirs[k]]
            if diff:
                raise ConfigError(f"{source}: config key 'lms.{name}.init_from': LM {lm['init_from']!r} has another "
                                  f"architecture ({', '.join(f'{k} {theirs[k]} vs {mine[k]}' for k in diff)})")
            seen, cur = {name}, lm["init_from"]
            while cur is not None:
                if cur in seen:
                    raise ConfigError(f"{source}: config key 'lms.{name}.init_from': the chain of 'init_from' is a "
                                      f"cycle through {sorted(seen)}")
                seen.add(cur)
                cur = lms[cur].get("init_from")
    hyp = cfg["hypotheses"]
    for key, field, what in (("overfit_lms", "init_from", "continues training"), ("soft_label_lms", "teacher",
                                                                                 "is taught by")):
        for name in hyp.get(key, []):
            chain, cur = [], name
            while cur in lms and lms[cur].get(field) and cur not in chain:
                chain.append(cur)
                cur = lms[cur][field]
                if field == "teacher":
                    break
            if name not in lms or not chain or cur != primary:
                raise ConfigError(f"{source}: config key 'hypotheses.{key}': expected LMs of 'lms' whose '{field}' "
                                  f"{what} the primary LM {primary!r}, found {name!r}")


def lm_section(cfg: dict, name: str) -> dict:
    """Section 'lm' for base LM `name`: the run's, with the entry's overrides ('lms.<name>.lm') applied."""
    return {**cfg["lm"], **(cfg["lms"][name].get("lm") or {})}


def lm_tokens_per_sample(cfg: dict, name: str) -> int:
    """The evaluation window L of base LM `name`: 'lms.<name>.tokens_per_sample', else its 'lm.tokens_per_sample'."""
    return cfg["lms"][name].get("tokens_per_sample") or lm_section(cfg, name)["tokens_per_sample"]


def yaml_overrides(overrides: dict) -> dict:
    """`snakemake --config key=value ...` overrides with every string leaf read as a YAML value (PyYAML safe_load,
    YAML 1.1), so that `knn={k: 32}` sets an integer and `pretrained=null` or `data={archive: null}` a null.

    Snakemake reads a value's top level itself but leaves every value inside a mapping or a list a string ('32',
    'null'). A leaf that is not valid YAML stays the string it was. Returns a new dict; `overrides` is unchanged.
    """
    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [value(x) for x in v]
        if isinstance(v, str):
            try:
                return yaml.safe_load(v) if v.strip() else v
            except yaml.YAMLError:
                return v
        return v

    return {k: value(v) for k, v in (overrides or {}).items()}


def validate_config(config: dict, source: str = "<config>") -> dict:
    """Validate `config` against the schema and return a deep copy with defaults filled in.

    Raises ConfigError naming the offending key(s), the expectation and the value found.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping at top level, found {type(config).__name__}")
    schema = load_schema()
    cfg = _fill_defaults(copy.deepcopy(config), schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(f"{source} failed the schema {SCHEMA_PATH.name}:\n  " + "\n  ".join(_describe(e) for e in errors))
    _check_lms(cfg, schema, source)
    extra = sorted(set(cfg["temperature"]["ratios"]) - set(cfg["datastore_size"]["ratios"]))
    if extra:
        raise ConfigError(f"{source}: config key 'temperature.ratios' must be a subset of 'datastore_size.ratios' "
                          f"({cfg['datastore_size']['ratios']}), found {extra} outside it")
    from .datastore.stores import store_kind_of

    for name in cfg["stores"]["extra"]:
        try:
            store_kind_of(name)
        except ValueError as e:
            raise ConfigError(f"{source}: config key 'stores.extra': {e}") from None
    _check_regime(cfg, source)
    _check_keys_and_metrics(cfg, source)
    _check_table4_lms(cfg, source)
    t = cfg["temperature"]
    if t["stop"] < t["start"]:
        raise ConfigError(f"{source}: config key 'temperature.stop' must be >= 'temperature.start' ({t['start']}), "
                          f"found {t['stop']}")
    grid = temperatures(cfg)
    if len(grid) < 2 or max(grid) <= 0:  # one τ (or only the limit τ → 0) cannot be tuned
        raise ConfigError(f"{source}: config keys 'temperature.start', 'stop', 'step' ({t['start']}, {t['stop']}, "
                          f"{t['step']}) give the τ grid {grid}: tuning τ needs at least 2 values, one of them > 0")
    g, primary = cfg["generation"], next(iter(cfg["lms"]))
    window = lm_tokens_per_sample(cfg, primary)
    if g["prefix_tokens"] is None:  # 64, or a quarter of the primary LM's window where 64 + 128 do not fit
        g["prefix_tokens"] = min(64, max(1, window // 4))
    if g["new_tokens"] is None:  # 128, or half of that window
        g["new_tokens"] = min(128, max(8, window // 2))
    if g["prefix_tokens"] + g["new_tokens"] + 1 > window:
        raise ConfigError(f"{source}: config keys 'generation.prefix_tokens' + 'generation.new_tokens' + 1 (the start "
                          f"token) must fit the window of base LM {primary!r} ({window} tokens), found "
                          f"{g['prefix_tokens']} + {g['new_tokens']} + 1")
    return cfg


def check_k_fits_stores(cfg: dict, layout) -> None:
    """Config 'knn.k' against the stores the run searches, before any job: for every base LM whose datastore is
    already dumped (its manifest under `layout`, a knnlm.paths.Layout), k must not exceed the keys of its smallest
    subset store (round(ratio × N) for the ratios of 'datastore_size.ratios' and 'retrieval.probe_sweep.ratios'),
    and a search job refuses it too where the store is first opened (knnlm.search.index.resolve_index_params); and
    where the queries are dumped and the full store not yet searched, the disk its FAISS neighbour caches alone will
    take (T × k × 8 bytes per split, key type and metric; memmaps, written and read in chunks, so disk and not
    memory is what they need) must be free. Raises ConfigError naming the key, the store and its keys, or the
    caches' size and the free space."""
    import shutil

    from .io import read_json

    k = cfg["knn"]["k"]
    smallest = min([*cfg["datastore_size"]["ratios"], *cfg["retrieval"]["probe_sweep"]["ratios"]] or [1.0])
    need, free = 0, None
    for lm in cfg["lms"]:
        man = layout.path("datastore_manifest", lm=lm)
        if not man.is_file():
            continue
        n = int(read_json(man)["N"])
        keys = int(round(smallest * n))
        if k > keys:
            raise ConfigError(f"config key 'knn.k' = {k:,}: the smallest store this run searches (ratio {smallest:g} of "
                              f"the {n:,} keys of LM {lm!r}, {man}) has {keys:,} keys; k must be at most that (or drop "
                              "the ratio from 'datastore_size.ratios' / 'retrieval.probe_sweep.ratios')")
        # the neighbour caches of the full store's FAISS searches alone (ids int32 + distances float32, k per token,
        # every token of valid and test, each key type and metric): a lower bound of what k costs on disk
        for split in ("valid", "test"):
            qm = layout.path("queries_manifest", lm=lm, split=split)
            if qm.is_file() and not layout.path("nb_ids", lm=lm, store="full", key=cfg["datastore"]["key_types"][0],
                                                metric=cfg["index"]["metrics"][0], split=split).exists():
                need += (int(read_json(qm)["T"]) * k * 8 * len(cfg["datastore"]["key_types"])
                         * len(cfg["index"]["metrics"]))
        free = shutil.disk_usage(man.parent).free
    if free is not None and need > free:
        raise ConfigError(f"config key 'knn.k' = {k:,}: the full store's FAISS neighbour caches alone need "
                          f"{need / 2**30:,.1f} GiB (k ids and distances per valid and test token, each key type and "
                          f"metric), more than the {free / 2**30:,.1f} GiB free under {layout.root}; choose a smaller k "
                          "or free the disk")


def temperatures(cfg: dict) -> list[float]:
    """The τ grid of config section 'temperature': start, start+step, ..., stop (inclusive, rounded to 1e-9)."""
    t = cfg["temperature"]
    n = int(round((t["stop"] - t["start"]) / t["step"])) + 1
    return [round(t["start"] + i * t["step"], 9) for i in range(n) if t["start"] + i * t["step"] <= t["stop"] + 1e-9]


def extended_temperatures(cfg: dict, taus: list[float]) -> list[float]:
    """The next segment of a τ grid whose tuned τ is its last value: the config grid's steps again beyond the
    current end (stop + step, ..., stop + (stop − start)), so each extension adds the grid's own span. Used while
    τ* is the grid's last value, at most 'temperature.max_extensions' times (Xu et al. 2023, Sec. 5.2: τ tuned,
    not τ at the edge of a grid)."""
    base = temperatures(cfg)
    return [round(taus[-1] + (b - base[0]), 9) for b in base[1:]]


def extend_while_on_edge(cfg: dict, taus: list[float], best, add) -> tuple[list[float], int]:
    """Extend τ grid `taus` while its tuned τ is its last value, at most 'temperature.max_extensions' times.

    best(taus) -> index of τ* on the grid (tuned on valid, with the values computed so far); add(new_taus)
    computes the values of the grid's next segment (extended_temperatures). Returns (the final grid, τ*'s index).
    """
    i = best(taus)
    for _ in range(cfg["temperature"]["max_extensions"]):
        if i != len(taus) - 1:
            break
        more = extended_temperatures(cfg, taus)
        add(more)
        taus = taus + more
        i = best(taus)
    return taus, i


def tau_edge(taus: list[float], i: int, cfg: dict) -> str:
    """'upper' when τ* = taus[i] is the grid's last value, 'lower' when it is its first and the grid starts above
    0 (τ → 0 is the natural lower limit), else ''."""
    if i == len(taus) - 1:
        return "upper"
    return "lower" if i == 0 and cfg["temperature"]["start"] > 0 else ""


VARIANT_RE = re.compile(r"^(nv(?P<n>\d+)(?P<sub>-sub)?|adaptive-(?P<by>freq|loss)|mos(?P<r>\d+)-(?P<mos>only|embed)|cluster(?P<m>\d+)"
                        r"|iloss(?P<il>\d+)(?P<ilsub>-sub)?)$")


def parametric_variants(cfg: dict) -> list[tuple[str, str]]:
    """Every (variant, key type) of config section 'parametric', in table order (names: knnlm.experiments.parametric)."""
    p = cfg["parametric"]
    out = [(f"nv{n}", k) for k in p["key_types"] for n in p["n_values"]]
    out += [(f"adaptive-{by}", k) for k in p["adaptive"]["key_types"] for by in p["adaptive"]["by"]]
    out += [(f"mos{r}-{v}", k) for k in p["mos"]["key_types"] for r in p["mos"]["mixtures"] for v in p["mos"]["variants"]]
    out += [(f"cluster{p['clustered']['m']}", k) for k in p["clustered"]["key_types"]]
    return out + [("nv1-sub", k) for k in subset_references(cfg, out)]


def subset_references(cfg: dict, variants: list[tuple[str, str]]) -> list[str]:
    """The key types that need W_ds (nv1) trained again on the shrunk subset ('nv1-sub'): where W_ds trains on other
    rows than some variant of that key type (config 'parametric.converge' vs 'parametric.train_tokens'), so that
    every comparison between variants is at equal training rows (Xu et al. 2023, Sec. 4 and App. B-C compare
    them on the same data)."""
    p = cfg["parametric"]
    conv = p["converge"]
    if "nv1" not in conv["variants"] or conv["train_tokens"] == p["train_tokens"]:
        return []
    return [k for k in p["key_types"] if ("nv1", k) in variants
            and any(v not in conv["variants"] and kk == k for v, kk in variants)]


def interpolated_loss_variants(cfg: dict) -> list[tuple[str, str]]:
    """The (variant, key type) of W_ds trained on the interpolated loss (Xu et al. 2023, App. E.6.3; config
    'hypotheses.interpolated_loss'): 'iloss<100 λ>', e.g. 'iloss25' for λ = 0.25, or 'iloss25-sub' on the shrunk
    subset (interpolated_loss.rows: subset, where W_ds has its subset twin nv1-sub)."""
    il = cfg["hypotheses"]["interpolated_loss"]
    subset = il["rows"] == "subset"
    refs = parametric_variants(cfg) if subset else []
    return [(f"iloss{round(100 * il['lambda'])}" + ("-sub" if ("nv1-sub", k) in refs else ""), k)
            for k in il["key_types"]]


def interpolated_loss_reference(variant: str) -> str:
    """The W_ds an interpolated-loss variant is compared with (App. E.6.3): W_ds on the same rows and settings, nv1, or
    nv1-sub for 'iloss<100 λ>-sub' (config 'hypotheses.interpolated_loss.rows': subset)."""
    return "nv1-sub" if variant.endswith("-sub") else "nv1"


def parametric_tables(cfg: dict) -> list[str]:
    """The parametric tables config section 'parametric' fills: table2 always, then tables 5, 6, 7, clustered."""
    p = cfg["parametric"]
    out = ["table2"]
    out += ["table5"] if p["n_values"] and p["key_types"] else []
    out += ["table6"] if p["adaptive"]["by"] and p["adaptive"]["key_types"] else []
    out += ["table7"] if p["mos"]["mixtures"] and p["mos"]["variants"] and p["mos"]["key_types"] else []
    out += ["clustered"] if p["clustered"]["key_types"] else []
    return out


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config file, merge `overrides` (nested dict), validate and fill defaults."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate_config(cfg, source=str(path))


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def split_files(cfg: dict) -> dict[str, Path]:
    """Names of the raw split files: config key 'data.dir' / 'data.files.<split>' (default: the WikiText names).

    With config key 'data.archive' these are the archive members' file names (no folder: a member matches by name).
    """
    d, files = Path(cfg["data"].get("dir") or ""), cfg["data"].get("files") or {}
    return {s: d / files.get(s, RAW_SPLIT_NAME.format(split=s)) for s in SPLITS}


def data_inputs(cfg: dict) -> list[Path]:
    """The files the `prepare_data` job reads: the archive of config key 'data.archive', else the split files."""
    archive = cfg["data"].get("archive")
    return [Path(archive)] if archive else list(split_files(cfg).values())


def check_data(cfg: dict) -> None:
    """Raise ConfigError if config key 'data.archive', 'data.dir' or one of the split files is missing.

    Skipped when 'data.download' is true (the download rule creates the files). Members of an archive are
    checked when the `prepare_data` job reads them (knnlm.data.prepare_splits).
    """
    data = cfg["data"]
    if bool(data.get("archive")) == bool(data.get("dir")):
        raise ConfigError("config key 'data': expected exactly one of 'data.dir' (a folder with the split files) or "
                          f"'data.archive' (a .tar.xz/.tar.gz/.zip holding them), found dir={data.get('dir')!r}, "
                          f"archive={data.get('archive')!r}")
    if data.get("download"):
        return
    if data.get("archive"):
        a = Path(data["archive"])
        if not a.is_file():
            raise ConfigError(f"config key 'data.archive': archive {str(a)!r} does not exist (resolved: {a.resolve()}); "
                              "expected a .tar.xz/.tar.gz/.tar/.zip holding wiki.{train,valid,test}.tokens or the "
                              "names given in 'data.files'")
        return
    d = Path(data["dir"])
    if not d.is_dir():
        raise ConfigError(
            f"config key 'data.dir': data directory {str(d)!r} does not exist (resolved: {d.resolve()}); "
            "expected a directory with wiki.{train,valid,test}.tokens, or set data.download: true to fetch it")
    missing = [str(p) for p in split_files(cfg).values() if not p.is_file()]
    if missing:
        raise ConfigError(f"config key 'data.dir' ({d}): missing split file(s) {missing}; expected "
                          "wiki.{train,valid,test}.tokens (the WikiText names) or the names given in 'data.files'")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists are kept as their string form (for MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
