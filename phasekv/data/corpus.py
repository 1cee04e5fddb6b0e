"""Real text corpora: read `.txt` / `.jsonl` (a `text` field) / `.parquet` (a `text` column) files, directories
or globs, tokenize them once into memory-mapped token shards, and stream fixed-length windows.

Shards live in a cache directory keyed by the files (path, size, mtime) and the tokenizer, so every run
and every rank reuses them: `<cache>/<key>/shard_00000.bin` (uint16 or uint32 tokens, documents joined by
the end-of-text token) plus `meta.json`, written last (a directory without it is incomplete and rebuilt).
Every problem (no match, empty file, unreadable file, non-UTF-8 bytes, bad JSON line, missing field)
raises `DataError` naming the file and the line or row.

`python-docs` names a corpus every machine with Python has, nothing to download: the reference documentation
that CPython ships for `help()` (`pydoc_data.topics`, 79 topics, ~0.46 MB of English prose and grammar under
the PSF licence; its text follows the Python version).
"""

from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing as mp
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from phasekv.data.stream import IGNORE, Example, rng_for
from phasekv.data.tokenizer import special_ids, tokenizer_hash
from phasekv.errors import DataError
from phasekv.io import atomic_dir, atomic_write
from phasekv.progress import Progress

SUFFIXES = (".txt", ".jsonl", ".parquet")
PYTHON_DOCS = "python-docs"  # the corpus name of Python's own documentation (module doc)
DEFAULT_CACHE = Path(os.environ.get("PHASEKV_CACHE", Path.home() / ".cache" / "phasekv")) / "shards"


def resolve_files(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files, directories (recursively, supported suffixes) and globs; comma-separated strings too."""
    specs = [s for part in ([spec] if isinstance(spec, str | os.PathLike) else spec)
             for s in str(part).split(",") if s.strip()]
    files: list[Path] = []
    for s in specs:
        s = os.path.expanduser(s.strip())
        if s == PYTHON_DOCS:
            files.append(python_docs_file())
            continue
        if glob.has_magic(s):
            hits = sorted(Path(p) for p in glob.glob(s, recursive=True) if Path(p).is_file())
            if not hits:
                raise DataError(f"no files match {s}")
        elif Path(s).is_dir():
            hits = sorted(p for p in Path(s).rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not hits:
                raise DataError(f"{s}: directory holds no {'/'.join(SUFFIXES)} files")
        elif Path(s).exists():
            hits = [Path(s)]
        else:
            raise DataError(f"data file not found: {s}")
        for p in hits:
            if p.suffix not in SUFFIXES:
                raise DataError(f"{p}: unsupported file type {p.suffix!r} (use {', '.join(SUFFIXES)})")
        files += hits
    return list(dict.fromkeys(files))


def python_docs_file() -> Path:
    """The module file holding Python's documentation topics (it keys the shard cache like any corpus file)."""
    import pydoc_data.topics  # imported when used: 0.5 MB of strings

    return Path(pydoc_data.topics.__file__)


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def iter_documents(path: str | os.PathLike) -> Iterator[str]:
    """The documents of one file: a whole `.txt` file, each `.jsonl` line's `text`, each `.parquet` row's `text`,
    each topic of Python's documentation (`python-docs`)."""
    path = Path(path)
    n = 0
    if path == python_docs_file():
        from pydoc_data.topics import topics

        for name in sorted(topics):
            n += 1
            yield topics[name]
    elif path.suffix == ".txt":
        text = _decode(_read_bytes(path), path)
        if text.strip():
            n += 1
            yield text
    elif path.suffix == ".jsonl":
        raw = _read_bytes(path)
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(_decode(line, path))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            except DataError:
                raise DataError(f"{path}:{lineno}: not valid UTF-8") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise DataError(f"{path}:{lineno}: expected an object with a string 'text' field")
            if rec["text"].strip():
                n += 1
                yield rec["text"]
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq  # imported when used: ~0.2 s

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:
            raise DataError(f"{path}: cannot read parquet ({exc})") from None
        if "text" not in pf.schema_arrow.names:
            raise DataError(f"{path}: parquet file has no 'text' column (columns: {', '.join(pf.schema_arrow.names)})")
        row = 0
        for rb in pf.iter_batches(columns=["text"], batch_size=4096):
            for t in rb.column(0).to_pylist():
                row += 1
                if t is not None and not isinstance(t, str):
                    raise DataError(f"{path}: row {row}: 'text' is not a string")
                if t and t.strip():
                    n += 1
                    yield t
    else:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}")
    if n == 0:
        raise DataError(f"{path}: empty (no non-blank text)")


def iter_corpus(spec) -> Iterator[str]:
    """Documents of every file of a corpus spec, file by file."""
    for f in resolve_files(spec):
        yield from iter_documents(f)


# ---- tokenization into shards ----------------------------------------------------------------

_TOK: Tokenizer | None = None


def _init_worker(tok_json: str):
    global _TOK
    _TOK = Tokenizer.from_str(tok_json)


def _tokenize_file(args: tuple[str, str, int, str]) -> int:
    """Worker: one file -> one shard (written atomically); returns the token count."""
    path, out, eos, dtype = args
    ids: list[int] = []
    docs = list(iter_documents(path))
    for i in range(0, len(docs), 256):
        for enc in _TOK.encode_batch(docs[i : i + 256], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
    arr = np.asarray(ids, dtype=dtype)
    atomic_write(out, arr.tofile)
    return len(arr)


def shard_key(files: Sequence[Path], tok: Tokenizer) -> str:
    h = hashlib.sha256(tokenizer_hash(tok).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def build_shards(spec, tok: Tokenizer, cache_dir: str | os.PathLike | None = None, workers: int | None = None,
                 progress: bool = True) -> Path:
    """Tokenize a corpus once (one shard per file, `workers` processes) and return its shard directory."""
    files = resolve_files(spec)
    root = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    out = root / shard_key(files, tok)
    if (out / "meta.json").is_file():
        return out
    eos = special_ids(tok)["eos"]
    if eos is None:
        raise DataError("tokenizer has no end-of-text token (<eos>, <|endoftext|> or </s>) to join documents")
    dtype = "uint16" if tok.get_vocab_size() <= 65535 else "uint32"
    shutil.rmtree(out, ignore_errors=True)
    with atomic_dir(out, shared=True) as tmp:  # every rank and run may build the same cache at once
        jobs = [(str(f), str(tmp / f"shard_{i:05d}.bin"), eos, dtype) for i, f in enumerate(files)]
        workers = max(1, min(workers or os.cpu_count() or 1, len(files)))
        counts = _run_jobs(jobs, tok, workers, progress)
        meta = {"files": [str(f) for f in files], "tokens": counts, "dtype": dtype, "eos": eos,
                "tokenizer_hash": tokenizer_hash(tok), "vocab_size": tok.get_vocab_size()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


def _run_jobs(jobs, tok: Tokenizer, workers: int, progress: bool) -> list[int]:
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("tokenizing", total=len(jobs))
        if workers == 1:
            _init_worker(tok.to_str())
            counts = []
            for j in jobs:
                counts.append(_tokenize_file(j))
                bar.advance(task)
            return counts
        # fork: workers start at once (no re-import of torch); they only run the Rust tokenizer
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
        with ctx.Pool(workers, _init_worker, (tok.to_str(),)) as pool:
            counts = []
            for c in pool.imap(_tokenize_file, jobs):  # ordered; a worker's DataError re-raises here
                counts.append(c)
                bar.advance(task)
            return counts


class TextStream:
    """Fixed-length windows of `seq_len + 1` tokens at random offsets of the shards (memory-mapped).

    The last `val_fraction` of every shard is held out: `split="val"` draws windows only there,
    `split="train"` only before it.
    """

    def __init__(self, shard_dir: str | os.PathLike, seq_len: int, seed: int = 0, split: str = "train",
                 val_fraction: float = 0.01):
        self.dir, self.seq_len, self.seed, self.split = Path(shard_dir), seq_len, seed, split
        meta_path = self.dir / "meta.json"
        if not meta_path.is_file():
            raise DataError(f"{self.dir}: not a token shard directory (no meta.json)")
        self.meta = json.loads(meta_path.read_text())
        self.shards = [np.memmap(self.dir / f"shard_{i:05d}.bin", dtype=self.meta["dtype"], mode="r")
                       for i in range(len(self.meta["files"]))]
        lo, hi = [], []
        for s in self.shards:
            cut = max(0, len(s) - max(int(len(s) * val_fraction), seq_len + 1))
            a, b = (0, cut) if split == "train" else (cut, len(s))
            lo.append(a)
            hi.append(b - (seq_len + 1))  # last valid window start
        self.lo, self.hi = np.array(lo), np.array(hi)
        span = np.maximum(self.hi - self.lo + 1, 0)
        if span.sum() <= 0:
            raise DataError(f"corpus {self.dir} is too small for seq_len={seq_len} "
                            f"({sum(len(s) for s in self.shards)} tokens)")
        self.p = span / span.sum()

    @property
    def n_tokens(self) -> int:
        return int(sum(len(s) for s in self.shards))

    def example(self, index: int) -> Example:
        rng = rng_for(self.seed, self.split, index, salt=1)
        k = rng.choice(len(self.shards), p=self.p)
        o = int(rng.integers(self.lo[k], self.hi[k] + 1))
        w = np.asarray(self.shards[k][o : o + self.seq_len + 1], dtype=np.int64)
        return Example(w[:-1].copy(), w[1:].copy())


__all__ = ["IGNORE", "TextStream", "build_shards", "iter_corpus", "iter_documents", "resolve_files"]
