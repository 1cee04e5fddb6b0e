"""Atomic file writes: the one place phasekv puts a file or a directory on disk.

Every output is written under a temporary name in its own directory, flushed and fsynced, then renamed
onto its final name (`os.replace`, atomic on POSIX). A crash leaves the old file or none, never half of
one; on any error the temporary file is removed, and a full disk says which file was left as it was.

    write_text(path, text)      write_bytes(path, data)      write_json(path, obj, indent=2)
    write_parquet(path, df)     write_figure(path, fig, dpi=130)
    atomic_write(path, lambda tmp: writer(tmp))          # any writer that takes a file name
    with atomic_dir(path) as tmp: ...                    # a directory as a whole (checkpoints, shard caches)
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_UMASK = os.umask(0)  # read once (os.umask can only be read by setting it): the mode of a plain open()
os.umask(_UMASK)


def _fsync(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _full_disk(exc: OSError, path: Path) -> OSError:
    """The one-line error of a full disk: which file was left as it was."""
    return OSError(errno.ENOSPC, f"no space left on device; {path.name} was left as it was", str(path))


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Call `write(tmp)` on a temp file beside `path`, fsync it, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; the file gets the mode of an ordinary one
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise _full_disk(exc, path) from exc
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_json(path: str | os.PathLike, obj, indent: int | None = 2, default: Callable | None = None,
               sort_keys: bool = False) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, default=default, sort_keys=sort_keys))


def write_parquet(path: str | os.PathLike, df) -> Path:
    """A pandas DataFrame without its index."""
    return atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))


def write_figure(path: str | os.PathLike, fig, **savefig) -> Path:
    """A matplotlib figure; the format comes from `path`'s suffix (the temp file's own suffix is `.tmp`)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, **savefig))


def remove_dir(path: str | os.PathLike) -> None:
    """Delete a directory so that a kill mid-delete leaves no half of it under its name: rename it aside
    (`.tmp-old-NAME`, which readers ignore and the next `atomic_dir` there removes), then delete it."""
    path = Path(path)
    trash = path.with_name(f".tmp-old-{path.name}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | os.PathLike, shared: bool = False) -> Iterator[Path]:
    """Build the directory `path` as a whole: yields an empty temp directory beside it (`.tmp-NAME`); when
    the block ends, every file in it is fsynced and the directory is renamed onto `path`, replacing an
    existing one. With `shared` (a cache other processes may build at once) each process builds in its own
    `.tmp-NAME.PID` and the first to finish wins. An error leaves the temp directory (its name is never
    taken for a complete one), except a full disk: then it is removed, to free the space."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}" + (f".{os.getpid()}" if shared else ""))
    shutil.rmtree(tmp, ignore_errors=True)  # left by a crash of an earlier attempt
    tmp.mkdir(parents=True)
    try:
        yield tmp
        for f in tmp.iterdir():
            if f.is_file():
                _fsync(f)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise _full_disk(exc, path) from exc
    if path.exists() and not shared:
        remove_dir(path)
    try:
        os.replace(tmp, path)
    except OSError:
        if not shared:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: keep theirs


def jsonable(obj):
    """JSON-safe copy: NaN/inf -> null, numpy scalars and arrays -> Python (summaries, the report's figure data)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj
