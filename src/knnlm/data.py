"""WikiText splits, word counts and sentencepiece BPE.

Word count convention (WikiText, as in Merity et al. 2016 and the kNN-LM papers): the number of
whitespace-separated tokens of a split plus one <eos> per line (blank lines included). Per-word
perplexity = exp(sum of token NLL over the split / word count); per-token perplexity divides by the
number of BPE tokens plus one <eos> per line, which is exactly the number of targets fairseq scores.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import tarfile
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Iterator

import numpy as np
from tqdm import tqdm

from .config import SPLITS, ConfigError, split_files
from .io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)


def count_words(path: str | Path) -> dict[str, int]:
    """{'lines': L, 'words': whitespace tokens + L} for a WikiText-layout file (one <eos> per line)."""
    lines = words = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            lines += 1
            words += len(line.split())
    return {"lines": lines, "words": words + lines}


def _checked_counts(path: Path, src: str, split: str, max_lines: int | None, key: str = "data.dir") -> dict[str, int]:
    """count_words of a prepared split; ConfigError naming config key `key` and the source if it is not UTF-8 or
    has no words."""
    try:
        counts = count_words(path)
    except UnicodeDecodeError as e:
        with open(path, "rb") as f:
            line = f.read(e.start).count(b"\n") + 1 if e.start < 10**8 else "?"
        raise ConfigError(f"config key '{key}': split file {src} is not valid UTF-8 (line {line}, byte "
                          f"{e.object[e.start:e.start + 4]!r}: {e.reason}); expected UTF-8 text") from None
    if counts["words"] == counts["lines"]:  # every line blank (or none at all)
        scope = f" in its first {max_lines} lines (data.max_lines.{split})" if max_lines else ""
        raise ConfigError(f"config key '{key}': split file {src} ({split}) has no words{scope}; expected text, "
                          f"found {counts['lines']} blank line(s)")
    return counts


@contextlib.contextmanager
def open_split(cfg: dict, split: str) -> Iterator[tuple[IO[bytes], str]]:
    """The raw split `split` (train/valid/test) as a binary stream, and a label naming its source for errors.

    From the file of config key 'data.dir', or from the member of config key 'data.archive' (.tar.xz, .tar.gz,
    .tar or .zip) whose file name is the split's (split_files; any folder inside the archive). Raises ConfigError
    naming the key if the file or member is missing, or the archive is of another format.
    """
    src = split_files(cfg)[split]
    name = src.name
    archive = cfg["data"].get("archive")
    if not archive:
        if not src.is_file():
            raise ConfigError(f"config key 'data.dir': split file {src} does not exist")
        with open(src, "rb") as f:
            yield f, str(src)
        return
    archive = Path(archive)
    if not archive.is_file():
        raise ConfigError(f"config key 'data.archive': archive {archive} does not exist")
    label = f"{archive}:{name}"
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.namelist() if PurePosixPath(m).name == name]
            if not members:
                raise ConfigError(f"config key 'data.archive': {archive} has no member named {name!r} (split {split})")
            with z.open(members[0]) as f:
                yield f, label
        return
    try:
        t = tarfile.open(archive, "r:*")
    except tarfile.TarError as e:
        raise ConfigError(f"config key 'data.archive': {archive} is not a tar (.tar.xz, .tar.gz, .tar) or zip "
                          f"archive ({e})") from None
    with t:
        member = next((m for m in t if m.isfile() and PurePosixPath(m.name).name == name), None)
        if member is None:
            raise ConfigError(f"config key 'data.archive': {archive} has no file named {name!r} (split {split})")
        with t.extractfile(member) as f:
            yield f, label


def prepare_splits(cfg: dict, out: dict[str, str | Path], wordcounts: str | Path) -> dict:
    """Copy (or slice, per config key 'data.max_lines') the raw splits to out[split] (WikiText layout).

    The raw splits come from 'data.dir' or 'data.archive' (open_split); each whole split is checked against
    'data.sha256.<file name>' when given, before anything is written under its final name.
    Returns {split: {'lines', 'words', 'sha256', 'source'}} and writes it to `wordcounts`.
    Raises ConfigError naming the config key and the file if a split is missing, differs from its sha256, is not
    UTF-8, or has no words.
    """
    max_lines = cfg["data"].get("max_lines") or {}
    want = cfg["data"].get("sha256") or {}
    stats = {}
    for split in SPLITS:
        name = split_files(cfg)[split].name
        dst = Path(out[split])
        n = max_lines.get(split)
        with open_split(cfg, split) as (fi, src), atomic_path(dst) as tmp:
            digest = hashlib.sha256()
            with open(tmp, "wb") as fo:
                lines = 0
                for line in fi:  # binary lines: a bad byte is reported by _checked_counts with its line
                    digest.update(line)
                    if n is None or lines < n:
                        fo.write(line)
                    lines += 1
            if name in want and digest.hexdigest() != want[name]:
                raise ConfigError(f"config key 'data.sha256.{name}': expected {want[name]}, {src} has "
                                  f"{digest.hexdigest()}")
            key = "data.archive" if cfg["data"].get("archive") else "data.dir"
            counts = _checked_counts(tmp, src, split, n, key)  # before the rename: a bad split is never an artifact
        stats[split] = {**counts, "sha256": sha256_file(dst), "source": src}
        log.info("%s: %d lines, %d words (incl. <eos>) from %s", split, stats[split]["lines"], stats[split]["words"], src)
    write_json(wordcounts, stats)
    return stats


def train_bpe(train_file: str | Path, model_prefix: str | Path, vocab_size: int, character_coverage: float = 1.0,
              seed: int = 1, threads: int = 2) -> Path:
    """Train a sentencepiece BPE model on the training split only; returns the .model path.

    WikiText's literal `<unk>` is kept as one piece (user-defined symbol), so that fairseq maps it to
    its own <unk>; sentencepiece's internal unknown piece is renamed to avoid the clash.
    """
    import sentencepiece as spm

    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp_prefix = model_prefix.with_name(model_prefix.name + ".tmp")
    _spm_train(spm, train_file, tmp_prefix, vocab_size, character_coverage, seed, threads)
    for ext in (".model", ".vocab"):
        Path(str(tmp_prefix) + ext).replace(str(model_prefix) + ext)
    return Path(str(model_prefix) + ".model")


def _spm_train(spm, train_file, prefix, vocab_size, coverage, seed, threads):
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(train_file), model_prefix=str(prefix), model_type="bpe", vocab_size=vocab_size,
        character_coverage=coverage, user_defined_symbols=["<unk>"], unk_piece="<spm_unk>",
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, input_sentence_size=2_000_000, shuffle_input_sentence=True,
        num_threads=threads, minloglevel=2, max_sentence_length=1 << 16,
    )


def encode_bpe(model_file: str | Path, in_file: str | Path, out_file: str | Path) -> dict:
    """Encode a WikiText file line by line into space-separated BPE pieces (one output line per input line).

    Returns {'lines', 'tokens'} where tokens counts pieces + one <eos> per line (fairseq's targets).
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    lines = pieces = 0
    with atomic_path(out_file) as tmp, open(in_file, encoding="utf-8") as fi, open(tmp, "w", encoding="utf-8") as fo:
        for line in tqdm(fi, desc=f"bpe {Path(in_file).name}", unit=" lines", mininterval=5):
            p = sp.encode(line.strip(), out_type=str) if line.strip() else []
            fo.write(" ".join(p) + "\n")
            lines += 1
            pieces += len(p)
    return {"lines": lines, "tokens": pieces + lines}


def encode_words(in_file: str | Path, out_file: str | Path) -> dict:
    """A WikiText file as its own whitespace tokens, one output line per input line (config 'bpe.type: none', a
    word-level LM). Returns {'lines', 'tokens'} as encode_bpe (tokens: words + one <eos> per line)."""
    lines = words = 0
    with atomic_path(out_file) as tmp, open(in_file, encoding="utf-8") as fi, open(tmp, "w", encoding="utf-8") as fo:
        for line in fi:
            w = line.split()
            fo.write(" ".join(w) + "\n")
            lines += 1
            words += len(w)
    return {"lines": lines, "tokens": words + lines}


def download_hf_dataset(cfg: dict) -> None:
    """Write the splits of config key 'data.hf_dataset' (a Hugging Face dataset) to the split files of 'data.dir':
    the rows of its text field, one line each (a row without a final newline gets one). Needs internet and the
    `datasets` package (imported here only); tests call it with a stand-in for datasets.load_dataset."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("config key 'data.hf_dataset': needs the `datasets` package (pip install datasets)") from None
    spec = cfg["data"]["hf_dataset"]
    names = {"train": "train", "valid": "validation", "test": "test", **(spec.get("splits") or {})}
    field = spec.get("text_field") or "text"
    for split, path in split_files(cfg).items():
        ds = datasets.load_dataset(spec["name"], spec.get("config"), split=names[split])
        if field not in ds.column_names:
            raise ConfigError(f"config key 'data.hf_dataset.text_field': {spec['name']} split {names[split]!r} has no "
                              f"column {field!r} (columns: {ds.column_names})")
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for row in ds[field]:
                f.write(row if row.endswith("\n") else row + "\n")
        log.info("%s: %d rows of %s (%s) -> %s", split, len(ds), spec["name"], names[split], path)


def download(cfg: dict) -> None:
    """Fetch config key 'data.url' (a WikiText zip) and extract wiki.*.tokens into 'data.dir', or write the splits
    of 'data.hf_dataset' (download_hf_dataset).

    Checks each file against 'data.sha256' when given. Needs internet; never called by tests.
    """
    if cfg["data"].get("hf_dataset"):
        download_hf_dataset(cfg)
        return
    url = cfg["data"].get("url")
    if not url:
        raise ConfigError("config key 'data.url': needed to download the data, found none")
    dest = Path(cfg["data"]["dir"])
    dest.mkdir(parents=True, exist_ok=True)
    zpath = dest / "download.zip"
    with atomic_path(zpath) as tmp:
        log.info("downloading %s", url)
        urllib.request.urlretrieve(url, tmp)
    with zipfile.ZipFile(zpath) as z:
        for member in z.namelist():
            name = Path(member).name
            if name in {p.name for p in split_files(cfg).values()}:
                with atomic_path(dest / name) as tmp, z.open(member) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    zpath.unlink()
    want = cfg["data"].get("sha256") or {}
    for name, digest in want.items():
        got = sha256_file(dest / name)
        if got != digest:
            raise ConfigError(f"config key 'data.sha256.{name}': expected {digest}, downloaded file has {got}")
    if not want:
        log.warning("config key 'data.sha256' is empty: downloaded files were not checked")


def bpe_token_lines(bpe_path: str | Path) -> dict[str, np.ndarray]:
    """The targets fairseq scores for a split of space-separated sentencepiece pieces (one line per line): every
    piece and one <eos> per line. Returns {'line' [T] int32 line of each target, 'words' [T] int16 words it
    starts: 1 for <eos> and for pieces beginning with '▁' (pieces never cross whitespace, so these add up to
    the WikiText word count)}."""
    line, words = [], []
    with open(bpe_path, encoding="utf-8") as f:
        for i, text in enumerate(f):
            pieces = text.split()
            line.append(np.full(len(pieces) + 1, i, dtype=np.int32))
            words.append(np.array([p.startswith("\u2581") for p in pieces] + [True], dtype=np.int16))
    if not line:
        return {"line": np.zeros(0, np.int32), "words": np.zeros(0, np.int16)}
    return {"line": np.concatenate(line), "words": np.concatenate(words)}


def save_token_lines(path: str | Path, tl: dict[str, np.ndarray]) -> None:
    """Write the 'line' and 'words' of an LM's targets (bpe_token_lines, knnlm.lm.hf.tokenize_split) as one .npz,
    atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, line=tl["line"], words=tl["words"])
