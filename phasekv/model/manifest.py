"""Checksummed directories: `manifest.json` lists every file's sha256 and size; loaders verify it.

A training checkpoint is written with a manifest (see `phasekv.train.checkpoint`), so a file truncated or
bit-flipped on disk is found before its bytes are used, and the run falls back to its previous checkpoint.
A directory without a manifest (e.g. one written by `PhaseLM.save`) is accepted unverified.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from phasekv.errors import CheckpointError

MANIFEST_FILE = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 20
_verified: dict[tuple, None] = {}  # (dir, file stats) of manifests already verified in this process


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike, names: list[str]) -> Path:
    """Hash the files `names` of `directory` as they are on disk and write `manifest.json` beside them."""
    d = Path(directory)
    files = {n: {"sha256": sha256(d / n), "bytes": (d / n).stat().st_size} for n in sorted(names)}
    path = d / MANIFEST_FILE
    path.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
    return path


def _stats(d: Path) -> tuple:
    return tuple((p.name, st.st_size, st.st_mtime_ns) for p in sorted(d.iterdir()) if p.is_file()
                 for st in [p.stat()])


def verify_manifest(directory: str | os.PathLike) -> bool:
    """Check every file listed in `directory/manifest.json`; True when verified, False when there is no
    manifest. Raises CheckpointError naming the first missing, truncated or corrupt file."""
    d = Path(directory)
    path = d / MANIFEST_FILE
    if not path.is_file():
        return False
    key = (str(d.resolve()), _stats(d))
    if key in _verified:
        return True
    try:
        files = json.loads(path.read_text())["files"]
        entries = [(str(n), str(e["sha256"]), int(e["bytes"])) for n, e in files.items()]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({type(exc).__name__}: {exc})") from None
    for name, digest, size in entries:
        f = d / name
        if Path(name).name != name or name in (".", ".."):  # a manifest names files of its own directory only
            raise CheckpointError(f"{path}: file name {name!r} points outside the checkpoint directory")
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (listed in {MANIFEST_FILE})")
        if f.stat().st_size != size:
            raise CheckpointError(f"{f}: {f.stat().st_size} bytes, the manifest says {size} (truncated or overwritten)")
        if sha256(f) != digest:
            raise CheckpointError(f"{f}: sha256 does not match the manifest (corrupt on disk)")
    _verified[key] = None
    return True
