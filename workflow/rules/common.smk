# Shared by every rule: the validated config, the artifact layout (knnlm.paths, its one owner), the wildcard
# constraints, and the helpers that turn a rule into a `python -m knnlm <job>` call.
# Parsing the DAG imports no torch: only knnlm.config, knnlm.paths and knnlm.datastore.stores (numpy).
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir).parent.joinpath("src")))
from knnlm.config import (
    ConfigError,
    check_data,
    check_k_fits_stores,
    data_inputs,
    derived_lm,
    interpolated_loss_variants,
    lm_section,
    interpolated_loss_reference,
    lm_tokens_per_sample,
    parametric_tables,
    parametric_variants,
    split_files,
    table4_lms,
    temperatures,
    validate_config,
    yaml_overrides,
)
from knnlm.io import sha256_files
from knnlm.lm import backend
from snakemake.utils import update_config
from knnlm.paths import WILDCARDS, Layout, PretrainedLayout
from knnlm.report.front_page import front_page
from knnlm.datastore.stores import (
    ALL_TOKENS,
    TRAINING_SUBSET,
    nested_shards,
    probe_store,
    same_index_store,
    same_keys_store,
    same_search_store,
    scores_every_token,
    searches_every_token,
    store_name,
    store_wildcard,
)

# Snakemake's report() marker of an output (its --report) by another name: a line that begins with "report(" reads
# to Snakemake's parser as its global 'report:' keyword, and the formatter (snakefmt) begins lines with calls
in_report = report

if not config:
    raise ConfigError("no config given: run snakemake with --configfile configs/<name>.yaml (see README)")
# --config key=value: Snakemake leaves the values inside a mapping or list strings; read each as YAML (knnlm.config).
# config_settings.config holds the --config values alone (overwrite_config also holds the config files' contents).
update_config(config, yaml_overrides(dict(getattr(workflow.config_settings, "config", None) or {})))
CFG = validate_config(config, source="snakemake config (--configfile / --config)")
check_data(CFG)

LAYOUT = Layout.of(CFG)
check_k_fits_stores(CFG, LAYOUT)  # k against every store of a datastore already dumped, before any job
# The software of every job (each rule's `conda:`): the project's pinned environment, used with --sdm conda;
# by default jobs run in the environment snakemake itself runs in (.venv from scripts/setup.sh).
ENV = str(Path(workflow.basedir).parent.joinpath("environment.yml"))
# Jobs run `python` from the environment Snakemake runs in (its folder first on PATH, which the jobs inherit; a conda
# env of --sdm conda comes before it in a job's shell): no job's command names the interpreter's path, so a moved or
# rebuilt environment reruns nothing.
_BIN = Path(sys.executable).parent
os.environ["PATH"] = os.pathsep.join(
    [str(_BIN)] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != str(_BIN)]
)
PY = "python" if (_BIN / "python").exists() else shlex.quote(Path(sys.executable).name)
THREADS = CFG["threads"]
SPLITS = ["train", "valid", "test"]
EVAL_SPLITS = ["valid", "test"]  # the order of every per-split input list (knnlm.experiments.common.SPLITS)
LMS = list(CFG["lms"])  # the base LMs of this run (config 'lms'); the first is the primary LM
PRIMARY = LMS[0]  # every experiment runs on it; the others add their row to Table 4
# Each base LM's backend (knnlm.lm.BACKENDS, by config 'lms.<name>.source'): which inputs its jobs get
BACKEND = {name: backend(lm["source"]) for name, lm in CFG["lms"].items()}
HF_LMS = [n for n in LMS if not BACKEND[n].run_tokens]  # tokenised by their own tokenizer
# config 'pretrained': the shipped LMs (knnlm.lm.shipped) that replace the training of 'train' LMs of the same name
SHIPPED = PretrainedLayout(CFG["pretrained"]) if CFG["pretrained"] else None
PRETRAINED = [n for n in LMS if SHIPPED and BACKEND[n].trained and SHIPPED.path("checkpoint", lm=n).is_file()]
PRETRAINED_BPE = (
    [str(SHIPPED.path(f)) for f in ("bpe_model", "bpe_vocab")]
    if SHIPPED and SHIPPED.path("bpe_model").is_file()
    else []
)
FAIRSEQ_LMS = [n for n in LMS if BACKEND[n].run_tokens]  # tokenised by the run's BPE, scored over data-bin
KEYS = CFG["datastore"]["key_types"]
# The primary LM's output layer is one matrix W_sm (not an adaptive softmax): the jobs that read W_sm run for it
PLAIN_W_SM = not CFG["lms"][PRIMARY]["adaptive_softmax"]
DATASTORE_DATA = CFG["datastore"]["data"]  # the datastore's own corpus (domain adaptation), or None: the train split
METRICS = CFG["index"]["metrics"]
DATASTORE_SIZE = CFG["datastore_size"]  # (key, metric) pairs of Figures 2, 4 and 5
RETRIEVAL = CFG["retrieval"]  # (key, metric) pairs of Table 3 and of the stores of 'stores.extra'
# The smallest store of 'temperature.ratios' (the paper's 5 %): its Sec. 5 claims (findings), and, with
# 'retrieval.small_store_all_tokens' while the scope samples the splits, the same store scored on every token.
SMALL_STORE = store_name(min(CFG["temperature"]["ratios"]))
SMALL_ALL_TOKENS = (
    SMALL_STORE + ALL_TOKENS
    if RETRIEVAL["small_store_all_tokens"] and RETRIEVAL["max_queries"] and SMALL_STORE != "full"
    else None
)
# The (key, metric) of the paper's Table 3 (att/L2 when the run has them) and, with 'retrieval.table3_all_tokens'
# while the scope samples the splits, the full store scored on every token for it ('table3_all'): finding 2 of
# the paper (approximate beats exact retrieval, Sec. 5.1) then rests on every document of valid and test.
TABLE3_KEY = dict(
    key="att" if "att" in RETRIEVAL["key_types"] else RETRIEVAL["key_types"][0],
    metric="l2" if "l2" in RETRIEVAL["metrics"] else RETRIEVAL["metrics"][0],
)
BASE_LMS = table4_lms(CFG)  # Table 4's base LMs (config 'table4.lms'; LMs trained from another one never)
# The (key, metric) whose per-token gains token_gains, lambda_by_quality and adaptive_retrieval read
GAINS_KEY = TABLE3_KEY
# The real mask in shards (config 'retrieval.exact_shards'): rules/retrieval.smk and rules/datastore_size.smk
EXACT_SHARDS = RETRIEVAL["exact_shards"]
FULL_ALL_TOKENS = f"full{ALL_TOKENS}" if RETRIEVAL["table3_all_tokens"] and RETRIEVAL["max_queries"] else None
# The share of their tokens the '-alltokens' stores score (a block sample, rule table3_sample, when below 1; sized by
# docs/statistics.md's rule, target 'sample_size'); FULL_EVERY_TOKEN: the full store is scored on every test token
TABLE3_FRACTION = RETRIEVAL["table3_fraction"]
FULL_EVERY_TOKEN = FULL_ALL_TOKENS if TABLE3_FRACTION >= 1 else None


wildcard_constraints:
    **{**WILDCARDS, "lm": "|".join(LMS), "store": store_wildcard()},


def names_constraint(names):
    """A regex for a wildcard ({lm}, {store}) that matches exactly `names` (never matches when there are none)."""
    import re

    return "|".join(re.escape(n) for n in names) or "(?!)"


def artifact(name, **fixed):
    """The layout's pattern of artifact `name`, with the given wildcards filled and the others left open."""
    return LAYOUT.pattern(name, **fixed)


def per_split(name, **fixed):
    """Pattern list of a per-split artifact over EVAL_SPLITS (the order jobs read per-split inputs in)."""
    return [artifact(name, split=s, **fixed) for s in EVAL_SPLITS]


def quoted_cfg(*sections, **extra):
    """The config sections a job depends on (plus `extra` sections given as values), as a shell-quoted JSON
    argument (in params, so a change reruns it)."""
    keep = ("name", "results_dir", "threads") + sections
    return shlex.quote(json.dumps({**{k: CFG[k] for k in keep if k in CFG}, **extra}, sort_keys=True))


def cfg_json(*sections):
    """quoted_cfg of the sections: a rule's `params.cfg`."""
    return quoted_cfg(*sections)


def cfg_with_keys(section, keys, *sections):
    """cfg_json(*sections) plus only `keys` of config section `section` (a change to its other keys reruns nothing
    here)."""
    return quoted_cfg(*sections, **{section: {k: CFG[section][k] for k in keys}})


def cfg_of_store(*sections):
    """params function: cfg_json(*sections) plus, for the alternatives' training subset (store TRAINING_SUBSET), the
    keys of config 'parametric' that choose its rows (train_tokens, seed), so that no other store reruns when they
    change."""

    def fn(wildcards):
        if wildcards.store != TRAINING_SUBSET:
            return quoted_cfg(*sections)
        return quoted_cfg(*sections, parametric={k: CFG["parametric"][k] for k in ("train_tokens", "seed")})

    return fn


def cfg_of_lm(*sections):
    """params function: cfg_json(*sections) plus, for a Hugging Face LM, its own entry of config 'lms' (with its
    window resolved), so that adding another LM to 'lms' reruns nothing of the others."""

    def fn(wildcards):
        lm = CFG["lms"][wildcards.lm]
        if BACKEND[wildcards.lm].run_tokens:  # an adaptive softmax is checked against the checkpoint when dumping
            return quoted_cfg(*sections, **({"adaptive_softmax": True} if lm["adaptive_softmax"] else {}))
        return quoted_cfg(
            *sections, lms={wildcards.lm: {**lm, "tokens_per_sample": lm_tokens_per_sample(CFG, wildcards.lm)}}
        )

    return fn


def _named(files):
    return {k: [str(f) for f in v] if isinstance(v, list) else str(v) for k, v in files.items()}


def io(fixed=None, **extra):
    """params function: the named inputs and outputs, wildcards and `extra` named paths (patterns) as JSON.

    Every input and output of a knnlm job is named, and the job finds its files by these names (knnlm.job.Job).
    `fixed`: wildcard values the rule fixes (its inputs are one store's, its outputs name no store), passed to the
    job as if they were wildcards.
    """

    def fn(wildcards, input, output):
        wc = {**dict(wildcards.items()), **(fixed or {})}
        return shlex.quote(
            json.dumps(
                {
                    "input": _named(input),
                    "output": _named(output),
                    "wildcards": wc,
                    "extra": {k: v.format(**wc) for k, v in extra.items()},
                }
            )
        )

    return fn


def knnlm(job):
    """Shell command of knnlm job `job` (knnlm.cli.resolve); the rule gives params cfg and io, and a log."""
    return f"{PY} -m knnlm {job} --threads {{threads}} --cfg {{params.cfg}} --io {{params.io}} --rule={{params.rule}} > {{log:q}} 2>&1"


def log_of(rule, *wildcards):
    """Log file pattern of a job: logs/<rule>_<wildcard values>.log."""
    return artifact("log", job="_".join([rule] + ["{%s}" % w for w in wildcards]))


def bench_of(rule, *wildcards):
    """Snakemake benchmark pattern of a job (wall time, peak RSS): benchmarks/<rule>_<wildcard values>.tsv."""
    return artifact("benchmark", job="_".join([rule] + ["{%s}" % w for w in wildcards]))


_io = io  # knnlm_rule's parameter 'io' hides the function


def files(*positional, **named):
    """The input or output files given to knnlm_rule, as input functions to unpack (positional) and named files,
    e.g. files(unpack(output_layer), lm_training=lm_training())."""
    return positional, named


def _wildcards_of(named):
    """The wildcards of named output patterns, in order of first appearance (a rule's log and benchmark names)."""
    import re

    seen = []
    for v in named.values():
        for pattern in (v if isinstance(v, list) else [v]):
            seen += [w for w in re.findall(r"{(\w+)", str(pattern)) if w not in seen]
    return seen


def knnlm_rule(
    name, job, input, output, cfg, io=None, wildcards=None, threads=1, resources=None, constraints=None, log_name=None
):
    """Define the rule `name` that runs knnlm job `job` ('<module>.<function>' of knnlm.experiments, run by knnlm.cli).

    input, output: files(...) (or a dict of named files); cfg: the rule's params.cfg, the config sections the job
    reads (cfg_json(...), cfg_with_keys(...) or cfg_of_lm(...)); io: params.io (default io(): the named files and
    wildcards); wildcards: those that name the job's log and benchmark (default: its outputs' wildcards, in order);
    threads, resources, constraints (wildcard_constraints) as in a Snakemake rule; log_name: the log's and
    benchmark's name when it is not the rule's (one that writes another rule's files for other wildcards). The rest
    is the same for every knnlm job: the log logs/<log_name>_<wildcards>.log, the benchmark, the environment and the
    shell command knnlm(job). Defined here, inside a function, so that each rule's command is its own (a rule defined
    in a loop would run the loop's last command)."""
    inputs = input if isinstance(input, tuple) else ((), input)
    outputs = output if isinstance(output, tuple) else ((), output)
    names = _wildcards_of(outputs[1]) if wildcards is None else list(wildcards)
    command = knnlm(job)

    rule:
        name:
            name
        input:
            *inputs[0],
            **inputs[1],
        output:
            *outputs[0],
            **outputs[1],
        log:
            log_of(log_name or name, *names),
        benchmark:
            bench_of(log_name or name, *names)
        wildcard_constraints:
            **(constraints or {}),
        conda:
            ENV
        threads: threads
        resources:
            **(resources or {}),
        params:
            cfg=cfg,
            io=io or _io(),
            rule=name,  # named by the checksum records of its outputs
        shell:
            command


def lm_training(lm=None):
    """Input function: the training.json of base LM `lm` (default: the rule's {lm}) when this run trains it, else
    nothing (an existing checkpoint or a Hugging Face LM: its caption says so)."""

    def fn(wc):
        name = lm or wc.lm
        return artifact("lm_training", lm=name) if BACKEND[name].trained else []

    return fn


def lm_model(split):
    """Input function of a dump: the base LM {lm} itself. A fairseq LM gives its 'checkpoint' (the trained one, or
    config 'lms.<lm>.path') and 'data_bin'; a Hugging Face LM its 'model_card' and the split's 'text'. With config
    'datastore.data', the train split's are the datastore's own text and binarisation (rule datastore_corpus)."""
    own = DATASTORE_DATA and split == "train"

    def fn(wc):
        b = BACKEND[wc.lm]
        if b.run_tokens:
            return {b.weights_input: lm_weights(wc.lm), "data_bin": artifact("datastore_bin" if own else "data_bin")}
        text = artifact("datastore_text") if own else artifact("split_tokens", split=split or wc.split)
        return {b.weights_input: lm_weights(wc.lm), "text": text}

    return fn


def hf_local_files(wc):
    """The weight and config files of a Hugging Face LM given as a local directory (none for a Hub id)."""
    d = Path(CFG["lms"][wc.lm]["path"])
    return (
        sorted(str(f) for pat in ("*.safetensors", "*.bin", "config.json", "tokenizer*.json") for f in d.glob(pat))
        if d.is_dir()
        else []
    )


def lm_sources(wc):
    """Input function of train_lm: the checkpoints a derived LM is trained from ('init' for 'lms.<lm>.init_from',
    'teacher' for 'lms.<lm>.teacher'); nothing for an LM trained from scratch on one-hot labels."""
    lm = CFG["lms"][wc.lm]
    return {
        **({"init": artifact("checkpoint", lm=lm["init_from"])} if lm["init_from"] else {}),
        **({"teacher": lm_weights(lm["teacher"])} if lm["teacher"] else {}),
    }


def train_options(name):
    """{'train': {'checkpoint', 'soft_label_weight'}} of a 'train' LM that keeps its last checkpoint or has a teacher
    (App. E.6), else {} (so an LM trained from scratch keeps the params, and the outputs, it always had)."""
    lm = CFG["lms"][name]
    if lm["checkpoint"] == "best" and not lm["teacher"]:
        return {}
    return {"train": {"checkpoint": lm["checkpoint"], "soft_label_weight": lm["soft_label_weight"]}}


def lm_weights(name):
    """What holds base LM `name`'s weights (its backend's weights artifact): its checkpoint (trained, or config
    'lms.<name>.path'), or the model card of a Hugging Face LM."""
    b = BACKEND[name]
    return artifact(b.weights_artifact, lm=name) if b.weights_artifact else ancient(CFG["lms"][name]["path"])


def output_layer(wc):
    """Input function: what holds the output projection W_sm of base LM {lm} ('checkpoint' or 'model_card')."""
    return {BACKEND[wc.lm].weights_input: lm_weights(wc.lm)}


def token_source(wc):
    """Input function: what names base LM {lm}'s token ids ('data_bin' with the fairseq dictionary, or the
    'model_card' of a Hugging Face LM; knnlm.experiments.common.token_strings)."""
    name = BACKEND[wc.lm].tokens_input
    return {name: artifact(name, lm=wc.lm)}


def per_lm(name, **fixed):
    """Pattern of artifact `name` for every base LM of Table 4 (BASE_LMS: config 'lms' less the LMs trained from
    another one), in config order."""
    return [artifact(name, lm=lm, **fixed) for lm in BASE_LMS]


def datastore(key=None, lm="{lm}"):
    """Named inputs of the datastore: manifest, vals and (for a key type or "{key}") key_file."""
    out = {"manifest": artifact("datastore_manifest", lm=lm), "vals": artifact("vals", lm=lm)}
    if key:
        out["key_file"] = artifact("keys", lm=lm, key=key)
    return out


def queries(split=None, key=None, lm="{lm}"):
    """Named inputs of the dumped queries of one split (or per-split lists when split is None)."""
    get = (lambda n, **f: artifact(n, split=split, **f)) if split else per_split
    out = {
        "queries_manifest": get("queries_manifest", lm=lm),
        "targets": get("targets", lm=lm),
        "lm_logprobs": get("lm_logprobs", lm=lm),
    }
    if key:
        out["queries"] = get("queries", lm=lm, key=key)
    return out


def exact_of(name):
    """Input function: the exact search ('real mask') of the store with the same keys (an '-ivf<k>' store shares
    its base store's exact search: knnlm.datastore.stores.same_keys_store)."""

    def fn(wc):
        return [
            artifact(name, lm=wc.lm, store=same_keys_store(wc.store), key=wc.key, metric=wc.metric, split=s)
            for s in EVAL_SPLITS
        ]

    return fn


def index_of(name):
    """Input function: the IVFPQ index artifact `name` ('index', 'index_meta') the job's store searches (an
    '-alltokens' store searches its base store's index: knnlm.datastore.stores.same_index_store)."""

    def fn(wc):
        return artifact(name, lm=wc.lm, store=same_index_store(wc.store), key=wc.key, metric=wc.metric)

    return fn


def scope_of(full_is_all=False, both_splits=False):
    """Input function: the retrieval scope of the job's split ('scope'; of both splits, in EVAL_SPLITS order, when
    `both_splits`), or nothing for a store scored on every token (knnlm.datastore.stores.scores_every_token) and, when
    `full_is_all`, for a store whose FAISS search covers every token (searches_every_token: the full store, which
    Table 1 reads, and the alternatives' training subset)."""

    def fn(wc):
        if scores_every_token(wc.store) or (full_is_all and searches_every_token(wc.store)):
            return []
        return per_split("scope", lm=wc.lm) if both_splits else artifact("scope", lm=wc.lm, split=wc.split)

    return fn


def tuning_sample_of(both_splits=False):
    """Input function: for a store scored on every token, the tuning sample of valid (config
    'retrieval.tuning_documents', rule tuning_sample) when the job scores valid (or `both_splits`); else nothing."""

    def fn(wc):
        if not (RETRIEVAL["tuning_documents"] and scores_every_token(wc.store)) or not (
            both_splits or wc.split == "valid"
        ):
            return []
        return artifact("tuning_sample", lm=wc.lm, split="valid")

    return fn


def table3_sample_of(both_splits=False):
    """Input function: for a store scored on every token while config 'retrieval.table3_fraction' < 1, the block
    sample of the job's split (of both splits, in EVAL_SPLITS order, when `both_splits`; rule table3_sample); else
    nothing."""

    def fn(wc):
        if TABLE3_FRACTION >= 1 or not scores_every_token(wc.store):
            return []
        return (
            per_split("table3_sample", lm=wc.lm) if both_splits else artifact("table3_sample", lm=wc.lm, split=wc.split)
        )

    return fn


def nested_shards_of(name):
    """Input function: artifact `name` of the nested scan's shards (knnlm.datastore.stores.nested_shards of the datastore sizes,
    config 'retrieval.exact_shards') up to the end of store {store}, one of the sizes' stores in ascending order."""
    ratios = sorted(DATASTORE_SIZE["ratios"])

    def fn(wc):
        last = [store_name(r) for r in ratios].index(wc.store)
        return [
            artifact(name, lm=wc.lm, key=wc.key, metric=wc.metric, split=wc.split, shard=i)
            for i, (seg, _, _) in enumerate(nested_shards(ratios, RETRIEVAL["exact_shards"]))
            if seg <= last
        ]

    return fn


# Everything the mask/score settings of one (store, key, metric) read, on the retrieval scope (every token for an
# '-alltokens' store; rule settings).
def search_of(name, both_splits=False):
    """Input function: FAISS search artifact `name` ('nb_ids', 'nb_dists', 'nb_meta') of the job's store, of both
    splits when `both_splits`; 'full-alltokens' reads the full store's own search, which covers every token with the
    same index (knnlm.datastore.stores.same_search_store)."""

    def fn(wc):
        store = same_search_store(wc.store)
        return (
            per_split(name, lm=wc.lm, store=store, key=wc.key, metric=wc.metric)
            if both_splits
            else artifact(name, lm=wc.lm, store=store, key=wc.key, metric=wc.metric, split=wc.split)
        )

    return fn


SETTINGS_INPUTS = {
    **datastore(),
    **queries(),
    "store": artifact("store_prep"),
    "scope": scope_of(both_splits=True),
    "tuning_sample": tuning_sample_of(both_splits=True),
    "table3_sample": table3_sample_of(both_splits=True),
    **{n: search_of(n, both_splits=True) for n in ("nb_ids", "nb_dists", "nb_meta")},
    **{n: per_split(n) for n in ("real_dists", "documents")},
    **{n: exact_of(n) for n in ("exact_ids", "exact_dists", "exact_meta")},
}


def settings_point(lm, store, key, metric, all_settings=True):
    """The settings JSON of one (lm, store, key, metric): all three mask/score settings (rule settings), or FAISS mask
    + FAISS score alone (the settings_faiss job, without exact search or real score) when not `all_settings`."""
    return artifact("settings" if all_settings else "settings_faiss", lm=lm, store=store, key=key, metric=metric)


def settings_inputs(store, key, metric):
    """Input function (use with unpack): SETTINGS_INPUTS of one (store, key, metric) with only {lm} open, for a rule
    whose outputs name no store (its params io(fixed=...) gives the job the same values)."""
    from types import SimpleNamespace

    def fn(wc):
        w = SimpleNamespace(lm=wc.lm, store=store, key=key, metric=metric)
        fill = lambda p: p.format(lm=wc.lm, store=store, key=key, metric=metric)
        out = {}
        for name, v in SETTINGS_INPUTS.items():
            v = v(w) if callable(v) else v
            out[name] = [fill(p) for p in v] if isinstance(v, list) else fill(v)
        return out

    return fn


# Named targets, one per section of the paper: each file under rules/ adds its own (TARGETS[name] = files),
# and the Snakefile turns every entry into a target (`snakemake <name>`) and `all` into all of them.
TARGETS = {}

# The extras (config 'extras'): our own robustness checks and the costliest follow-ups, target 'extras' (the
# follow-ups also 'followups'), part of 'all' and of the findings only when 'extras.in_all'.
FOLLOWUP_TARGETS = ("retomaton", "pruning", "generation")
EXTRAS_TARGETS = ("variance", "probe_sweep") + FOLLOWUP_TARGETS
EXTRAS_IN_ALL = CFG["extras"]["in_all"]

# Tables that compare stores, all written by write_store_table in the Snakefile. A file under rules/ registers
# STORE_TABLES[name] = the settings files the table reads; knnlm.experiments.<name>.table writes it.
STORE_TABLES = {}


def settings_of(store, section):
    """The settings files of `store` for every (key, metric) of config section `section` ({lm} left open)."""
    return expand(
        artifact("settings", store=store), key=section["key_types"], metric=section["metrics"], allow_missing=True
    )


def tables(*names):
    """The Markdown files of tables `names` of the primary LM (the experiments' base LM)."""
    return expand(artifact("table", table="{t}", ext="md"), t=names, lm=PRIMARY)


def report_caption(name):
    """The RST caption of a table or figure in `snakemake --report`: workflow/report/<name>.rst, or the
    default caption (which points to the caption inside the table's Markdown) when there is none."""
    path = Path(workflow.basedir) / "report" / f"{name}.rst"
    return str(path if path.exists() else path.with_name("default.rst"))


def regime_figures(effects, ext=None):
    """The regime map's figures: one per effect id of `effects` (claims.yaml 'regime_effects'), PNG and PDF (or
    `ext` only)."""
    return {
        f"fig_{e}": [
            in_report(
                artifact("figure", lm=PRIMARY, figure=f"regime_{e}", ext=x),
                caption=report_caption("default"),
                category="Regime map",
            )
            for x in ([ext] if ext else ("png", "pdf"))
        ]
        for e in effects
    }
