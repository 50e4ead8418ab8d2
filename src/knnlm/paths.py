"""The artifact layout of a run: every file the pipeline writes, named in this one place.

Both sides use it: the Snakefile's helpers (workflow/rules/common.smk) turn the patterns into rule inputs
and outputs with Snakemake wildcards left in (`Layout.pattern`), and Python code and tests resolve them
to concrete paths (`Layout.path`). Jobs never rebuild a path: they receive every file they read and write
from their rule's `input:` / `output:` (knnlm.cli).

Levels (wildcards in braces):
  <results_dir>/<name>/                    one config = one run
    data/, bpe/, data-bin/                 the corpus, its BPE and its fairseq binarisation (shared by trained LMs)
    lms/{lm}/                              one base LM (config 'lms'): its checkpoint or model card, datastore
                                           (keys + vals), queries, and its tokens' documents and scope
      stores/{store}/                      one datastore variant ('full', 'r0.05' subsets, 'pca64', ...):
                                           its preparation, IVFPQ indexes, neighbour caches, evaluations
      parametric/{variant}_{key}/          the parametric alternatives trained on the LM's keys
      tables/, figures/                    the paper's tables and figures for this LM
    logs/, benchmarks/                     one log and one Snakemake benchmark per job

Wildcard values: lm = [A-Za-z0-9_.-]+, store = full | r<ratio> | ... (knnlm.datastore.stores kinds), key = att | ffn,
metric = l2 | ip, split = valid | test (queries; the datastore is train), shard = 0, 1, ... (a sharded exact search).
"""
from __future__ import annotations

import re
import string
from pathlib import Path

# name -> pattern relative to the run root. Wildcards: lm, store, key, metric, split, shard, variant, table, figure,
# ext.
PATTERNS: dict[str, str] = {
    # corpus
    "split_tokens": "data/{split}.tokens",
    "wordcounts": "data/wordcounts.json",
    "bpe_model": "bpe/spm.model",
    "bpe_vocab": "bpe/spm.vocab",
    "bpe_split": "bpe/{split}.bpe",
    "bpe_stats": "bpe/bpe_stats.json",
    "data_bin": "data-bin",
    # config 'datastore.data': the datastore's own text (train split and/or other corpora), BPE and binarisation
    "datastore_text": "data/datastore.tokens",
    "datastore_corpus": "data/datastore.json",
    "datastore_bpe": "bpe/datastore.bpe",
    "datastore_bin": "data-bin-datastore",
    # one base LM
    "checkpoint": "lms/{lm}/checkpoint.pt",
    "model_card": "lms/{lm}/model.json",  # a Hugging Face LM: what identifies it (knnlm.lm.hf.model_card)
    "fairseq_dir": "lms/{lm}/fairseq",
    "lm_training": "lms/{lm}/training.json",  # a trained LM's valid curve and whether it converged
    "keys": "lms/{lm}/datastore/keys_{key}.npy",
    "vals": "lms/{lm}/datastore/vals.npy",
    "datastore_manifest": "lms/{lm}/datastore/manifest.json",
    "targets": "lms/{lm}/queries/{split}/targets.npy",
    "lm_logprobs": "lms/{lm}/queries/{split}/lm_logprobs.npy",
    "queries": "lms/{lm}/queries/{split}/queries_{key}.npy",
    "queries_manifest": "lms/{lm}/queries/{split}/manifest.json",
    # the LM's tokens of a split in the corpus: line and words of every target; documents; the scope
    "token_lines": "lms/{lm}/queries/{split}/token_lines.npz",
    "documents": "lms/{lm}/queries/{split}/documents.npz",
    "scope": "lms/{lm}/queries/{split}/scope.npy",
    # the valid tokens of the stores scored on every token (config 'retrieval.tuning_documents': whole documents)
    "tuning_sample": "lms/{lm}/queries/{split}/tuning_sample.npy",
    # the tokens of the stores scored on every token when config 'retrieval.table3_fraction' < 1: a block sample
    "table3_sample": "lms/{lm}/queries/{split}/table3_sample.npy",
    # features of every scored token of a split (knnlm.scoring.quality: retrieval quality, the LM's entropy)
    "token_features": "lms/{lm}/queries/{split}/token_features.npz",
    # one datastore variant (store) of that LM
    "store_prep": "lms/{lm}/stores/{store}/prep_{key}",
    "index": "lms/{lm}/stores/{store}/index/{key}_{metric}.faiss",
    "index_meta": "lms/{lm}/stores/{store}/index/{key}_{metric}.json",
    "nb_ids": "lms/{lm}/stores/{store}/neighbours/{key}_{metric}_{split}_ids.npy",
    "nb_dists": "lms/{lm}/stores/{store}/neighbours/{key}_{metric}_{split}_dists.npy",
    "nb_meta": "lms/{lm}/stores/{store}/neighbours/{key}_{metric}_{split}.json",
    # each datastore entry's own FAISS neighbours (greedy merging, knnlm.scoring.pruning)
    "dstore_nb_ids": "lms/{lm}/stores/{store}/dstore_neighbours/{key}_{metric}_ids.npy",
    "dstore_nb_dists": "lms/{lm}/stores/{store}/dstore_neighbours/{key}_{metric}_dists.npy",
    "dstore_nb_meta": "lms/{lm}/stores/{store}/dstore_neighbours/{key}_{metric}.json",
    "real_dists": "lms/{lm}/stores/{store}/real_score/{key}_{metric}_{split}_dists.npy",
    "real_meta": "lms/{lm}/stores/{store}/real_score/{key}_{metric}_{split}.json",
    "exact_ids": "lms/{lm}/stores/{store}/exact/{key}_{metric}_{split}_ids.npy",
    "exact_dists": "lms/{lm}/stores/{store}/exact/{key}_{metric}_{split}_dists.npy",
    "exact_meta": "lms/{lm}/stores/{store}/exact/{key}_{metric}_{split}.json",
    # a sharded exact search (config 'retrieval.exact_shards'): the top-k of one shard of the store's keys, and of
    # one shard of the nested scan over the datastore-size subsets (knnlm.datastore.stores.nested_shards)
    "exact_shard_ids": "lms/{lm}/stores/{store}/exact/shards/{key}_{metric}_{split}_{shard}_ids.npy",
    "exact_shard_dists": "lms/{lm}/stores/{store}/exact/shards/{key}_{metric}_{split}_{shard}_dists.npy",
    "exact_shard_meta": "lms/{lm}/stores/{store}/exact/shards/{key}_{metric}_{split}_{shard}.json",
    "nested_shard_ids": "lms/{lm}/nested_scan/{key}_{metric}_{split}_{shard}_ids.npy",
    "nested_shard_dists": "lms/{lm}/nested_scan/{key}_{metric}_{split}_{shard}_dists.npy",
    "nested_shard_meta": "lms/{lm}/nested_scan/{key}_{metric}_{split}_{shard}.json",
    "score": "lms/{lm}/stores/{store}/scores/{key}_{metric}.json",
    "knn_logprobs": "lms/{lm}/stores/{store}/scores/{key}_{metric}_{split}_knn_logprobs.npy",
    "knn_logprobs_tuned": "lms/{lm}/stores/{store}/scores/{key}_{metric}_{split}_knn_logprobs_tuned_tau.npy",
    "settings": "lms/{lm}/stores/{store}/settings/{key}_{metric}.json",
    # FAISS mask + FAISS score alone (no exact search, no real score): the regime map's key and metric variants
    "settings_faiss": "lms/{lm}/stores/{store}/settings/{key}_{metric}_faiss.json",
    # parametric alternatives of that LM
    "word_stats": "lms/{lm}/parametric/word_stats.npz",
    "train_lm_logprobs": "lms/{lm}/parametric/train_lm_logprobs.npy",  # log p_LM(val) of every datastore row, [N] float32
    "parametric_dir": "lms/{lm}/parametric/{variant}_{key}",
    "parametric_result": "lms/{lm}/parametric/{variant}_{key}/result.json",
    "parametric_logprobs": "lms/{lm}/parametric/{variant}_{key}/{split}_logprobs.npy",  # final stage, float32 [T]
    # outputs a reader looks at
    "run_table": "tables/{table}.{ext}",  # tables across the run's base LMs (Table 4)
    "table": "lms/{lm}/tables/{table}.{ext}",
    "figure": "lms/{lm}/figures/{figure}.{ext}",
    "findings": "lms/{lm}/findings.md",
    "findings_rows": "lms/{lm}/findings.json",  # the findings rows, each with its claim's id (claims.yaml)
    "findings_regime": "lms/{lm}/findings_regime.{ext}",  # the findings rows an effect of the regime map follows
    "log": "logs/{job}.log",
    "benchmark": "benchmarks/{job}.tsv",
    # one Snakemake invocation: its targets, budgets and CPU readings at start and end (knnlm.report.budget)
    "invocation": "invocations/{stamp}.invocation.json",
    # the sha256 of an own corpus's raw files (config 'data.sha256' empty), by size, mtime, ctime and inode: read when
    # the DAG is built, so that an edited raw file reruns what rests on it (knnlm.io.sha256_files)
    "raw_checksums": "raw_checksums.json",
    # held by the Snakemake process of an invocation while it runs: one invocation per run folder (knnlm.io.hold_lock)
    "lock": "invocation.lock",
}

# The LMs a config ships (config 'pretrained', knnlm.lm.shipped), relative to that folder (pretrained/<config>/).
PRETRAINED_PATTERNS: dict[str, str] = {
    "checkpoint": "{lm}/checkpoint.pt",  # weights (fp16 when that leaves valid perplexity unchanged), no optimizer
    "lm_training": "{lm}/training.json",  # the training record (knnlm.lm.training.convergence)
    "model_card": "{lm}/model_card.json",
    "model_card_md": "{lm}/README.md",
    "bpe_model": "bpe/spm.model",  # the sentencepiece model and fairseq dictionary the LMs were trained with
    "bpe_vocab": "bpe/spm.vocab",
    "dictionary": "bpe/dict.txt",
}

# A datastore folder outside a run (knnlm.api build_datastore / from_datastore, knnlm.datastore.importer): the run's
# datastore file names, and the indexes beside them.
DATASTORE_PATTERNS: dict[str, str] = {
    "keys": "keys_{key}.npy",
    "vals": "vals.npy",
    "manifest": "manifest.json",
    "index": "index/{key}_{metric}.faiss",
    "index_meta": "index/{key}_{metric}.json",  # an imported index's parameters, read from it (import_index)
}

# Wildcard constraints (regexes) shared by every rule (workflow/rules/common.smk); {store} is constrained to
# the registered store kinds (knnlm.datastore.stores.store_wildcard).
WILDCARDS: dict[str, str] = {
    "lm": r"[A-Za-z0-9_.-]+",
    "key": r"att|ffn",
    "metric": r"l2|ip",
    "split": r"valid|test",
    "shard": r"[0-9]+",
    "variant": r"nv\d+(-sub)?|adaptive-(freq|loss)|mos\d+-(only|embed)|cluster\d+|iloss\d+(-sub)?",
}


class _Keep(dict):
    """format_map helper: wildcards not given stay as '{name}' (Snakemake patterns)."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class Layout:
    """The files of one run, rooted at <results_dir>/<name>.

    pattern(name, **fixed): the path with the given wildcards filled and the others left as '{wildcard}'
    (a Snakemake pattern); path(name, **wildcards): a concrete Path, ValueError if a wildcard is missing.
    Raises KeyError naming the known artifacts for an unknown name.
    """

    def __init__(self, results_dir: str | Path, name: str):
        self.root = Path(results_dir) / name

    @classmethod
    def of(cls, cfg: dict) -> "Layout":
        """The layout of a validated config (keys 'results_dir' and 'name')."""
        return cls(cfg["results_dir"], cfg["name"])

    def _rel(self, name: str) -> str:
        try:
            return PATTERNS[name]
        except KeyError:
            raise KeyError(f"unknown artifact {name!r}; known: {sorted(PATTERNS)}") from None

    def pattern(self, name: str, **fixed) -> str:
        return str(self.root / self._rel(name).format_map(_Keep(fixed)))

    def path(self, name: str, **wildcards) -> Path:
        rel = self._rel(name)
        missing = [f for _, f, _, _ in string.Formatter().parse(rel) if f and f not in wildcards]
        if missing:
            raise ValueError(f"artifact {name!r} ({rel}) needs wildcard(s) {missing}")
        return self.root / rel.format(**wildcards)

    def find(self, name: str, **fixed) -> list[tuple[dict, Path]]:
        """Every existing file of artifact `name` with the wildcards of `fixed` given: [(its wildcards, path)],
        sorted by path; each free wildcard matches its WILDCARDS constraint (a path component part elsewhere)."""
        rel = self._rel(name).format_map(_Keep(fixed))
        parts = re.split(r"\{([^}]*)\}", rel)  # literal, wildcard, literal, ...
        seen: set[str] = set()
        rx = ""
        for i, part in enumerate(parts):
            if i % 2 == 0:
                rx += re.escape(part)
            else:
                rx += f"(?P={part})" if part in seen else f"(?P<{part}>{WILDCARDS.get(part, '[^/]+?')})"
                seen.add(part)
        match = re.compile(rx + "$")
        out = []
        for p in sorted(self.root.glob(re.sub(r"\{[^}]*\}", "*", rel))):
            m = match.match(p.relative_to(self.root).as_posix())
            if m:
                out.append((m.groupdict(), p))
        return out


class PretrainedLayout(Layout):
    """The files of a folder of shipped LMs (PRETRAINED_PATTERNS), rooted at that folder (config 'pretrained')."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _rel(self, name: str) -> str:
        try:
            return PRETRAINED_PATTERNS[name]
        except KeyError:
            raise KeyError(f"unknown file {name!r} of a pretrained folder; known: {sorted(PRETRAINED_PATTERNS)}") from None


class DatastoreLayout(Layout):
    """The files of a datastore folder (DATASTORE_PATTERNS): keys, vals and manifest as in a run's
    lms/{lm}/datastore/, and its IVFPQ indexes under index/."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _rel(self, name: str) -> str:
        try:
            return DATASTORE_PATTERNS[name]
        except KeyError:
            raise KeyError(f"unknown file {name!r} of a datastore folder; known: {sorted(DATASTORE_PATTERNS)}") from None
