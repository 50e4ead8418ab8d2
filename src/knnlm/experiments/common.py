"""Opening a job's inputs by their rule names (the names every rule of workflow/rules uses).

Datastore: 'manifest' (datastore manifest.json), 'vals', 'key_file'. Queries, one file per split or a list in
the order of SPLITS: 'targets', 'lm_logprobs', 'queries', 'queries_manifest'. Corpus: 'wordcounts'.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..job import Job
from ..io import read_checked_json, read_json
from ..statistics.documents import scheme_label

SPLITS = ("valid", "test")


def by_split(job: Job, name: str) -> dict[str, Path]:
    """{split: path} of a per-split input list given in the order of SPLITS."""
    paths = job.paths(name)
    if len(paths) != len(SPLITS):
        raise ValueError(f"rule {job.rule}: input {name!r} must list one file per split {SPLITS}, found {len(paths)}")
    return dict(zip(SPLITS, paths))


def open_datastore(job: Job, with_keys: bool = True):
    """(keys [N, D] float16 memmap or None, vals [N] int32 memmap, manifest) of the job's datastore inputs."""
    from ..datastore.dump import open_datastore as open_ds

    return open_ds(job.path("manifest"), job.path("vals"), job.path("key_file") if with_keys else None,
                   job.wildcards.get("key"))


def open_split(job: Job, split: str | None = None, with_queries: bool = False, checkpoint_sha256: str | None = None):
    """The dumped queries of one split (knnlm.datastore.dump.open_queries) from per-split input lists (split given) or
    single files (split None)."""
    from ..datastore.dump import open_queries

    def one(name):
        return by_split(job, name)[split] if split else job.path(name)

    return open_queries(one("queries_manifest"), one("targets"), one("lm_logprobs"),
                        one("queries") if with_queries else None, checkpoint_sha256)


def words_per_split(job: Job) -> dict[str, int]:
    """{split: word count} of whole valid and test (WikiText convention) from input 'wordcounts'."""
    counts = read_json(job.path("wordcounts"))
    return {s: counts[s]["words"] for s in SPLITS}


def lm_log_probs(job: Job) -> dict[str, np.ndarray]:
    """{split: [T] float64 log p_LM(target)} of whole valid and test from input list 'lm_logprobs'."""
    return {s: np.load(p).astype(np.float64) for s, p in by_split(job, "lm_logprobs").items()}


def split_documents(job: Job, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(doc [T] int document id of every target of the whole split, doc_words [D] int64 words per document) from
    the per-split input list 'documents' (knnlm.experiments.spine.documents: the LM's own tokens)."""
    d = np.load(by_split(job, "documents")[split])
    doc = d["doc"]
    return doc, np.bincount(doc, weights=d["words"], minlength=int(doc.max()) + 1).astype(np.int64)


def scoped_documents(doc: np.ndarray, words: np.ndarray, sc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents of the scored tokens sc [t] (int indices into a split whose per-token document ids are doc [T]
    and words words [T], a 'documents' file's arrays): (doc of each scored token [t], renumbered 0..d−1 in the order
    of the split's ids; doc_words [d] int64 words per document over the scored tokens; ids [d] the split's document
    ids of those documents)."""
    ids, d = np.unique(doc[sc], return_inverse=True)
    return d, np.bincount(d, weights=words[sc].astype(np.int64), minlength=len(ids)).astype(np.int64), ids


def documents_scheme(job: Job) -> dict:
    """{'scheme' (the test split's, whose documents the verdicts rest on), 'schemes': {split: its scheme ('auto' may
    resolve differently per split)}, 'block_tokens': {split: tokens per block (0 unless blocks)}, 'split_documents':
    {split: documents of the whole split}} of the job's per-split input list 'documents'
    (knnlm.experiments.spine.documents; a file written before schemes were recorded counts as config
    'stats.documents')."""
    files = {s: np.load(p) for s, p in by_split(job, "documents").items()}
    schemes = {s: str(f["scheme"]) if "scheme" in f else job.cfg["stats"]["documents"] for s, f in files.items()}
    return {"scheme": schemes.get("test", schemes[SPLITS[0]]), "schemes": schemes,
            "block_tokens": {s: int(f["block_tokens"]) if "block_tokens" in f else 0 for s, f in files.items()},
            "split_documents": {s: len(f["tokens"]) for s, f in files.items()}}


def stats_options(job: Job) -> dict:
    """Config section 'stats' with its defaults (knnlm.statistics.intervals.options) and 'scheme': the documents scheme
    of the job's per-split input list 'documents' (documents_scheme), which names the unit in every verdict
    ('inconclusive (9 articles, n_eff 7.3)')."""
    from ..statistics.intervals import options

    st = options(job.cfg.get("stats"))
    if job.input.get("documents"):
        st["scheme"] = documents_scheme(job)["scheme"]
    return st


def documents_label(job: Job) -> str:
    """The documents a job's intervals rest on, for captions: 'WikiText articles: 60 valid, 62 test' (the whole
    splits of the per-split input list 'documents')."""
    sch = documents_scheme(job)
    return scheme_label(sch, sch["split_documents"])


def lm_training_label(job: Job) -> str:
    """The caption sentence on the base LM's convergence (knnlm.lm.training.convergence_label) from the job's input
    'lm_training' (the training.json of each trained LM; empty for an LM this run did not train). Several LMs
    (Table 4) get one sentence each, named by LM. Xu et al. 2023 compare kNN-LMs over a converged base LM."""
    from ..lm.training import convergence_label

    files = job.paths("lm_training") if job.input.get("lm_training") else []
    if not files:
        return convergence_label(None)
    if len(files) == 1:
        return convergence_label(read_checked_json(files[0], "lm_training"))
    return " ".join(convergence_label(read_checked_json(p, "lm_training"), who=f"LM {p.parent.name}") for p in files)


def lm_backend(job: Job):
    """(the backend module of the base LM whose files the job's named inputs hold, those inputs {name: path} less the
    empty ones): knnlm.lm.backend_of. Raises ArtifactError naming the rule when no input is an LM's."""
    from ..io import ArtifactError
    from ..lm import backend_of

    files = {k: v for k, v in job.input.items() if v}
    try:
        return backend_of(files).impl(), files
    except ValueError as err:
        raise ArtifactError(f"rule {job.rule}: {err}") from None


def token_strings(job: Job, vocab: int) -> tuple[list[str], np.ndarray]:
    """(strings [V], special [V] bool) of the base LM's token ids 0 … V−1 (V ≥ vocab), without the word-start marks
    of SentencePiece ('▁') and byte-level BPE ('Ġ'): from the fairseq dictionary (input 'data_bin', dict.txt; ids
    0-3 are <s>, <pad>, </s>, <unk>) or a Hugging Face LM's tokenizer (input 'model_card'). Raises ArtifactError
    when neither input is given or dict.txt is missing."""
    impl, files = lm_backend(job)
    pieces, special = impl.token_strings(files, vocab)
    pieces = [p or "" for p in pieces] + [""] * (max(vocab, len(pieces)) - len(pieces))
    special = np.r_[special, np.zeros(len(pieces) - len(special), dtype=bool)]
    return [p.lstrip("▁Ġ") for p in pieces], special
