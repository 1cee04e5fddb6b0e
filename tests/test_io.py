"""phasekv.io: a write either replaces the file as a whole or leaves it (and no temp file) as it was."""

import errno
import json
import stat

import pandas as pd
import pytest

from phasekv.io import atomic_dir, atomic_write, write_bytes, write_json, write_parquet, write_text


def test_success_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_text(path, "old")
    assert write_json(path, {"x": 1}) == path
    assert json.loads(path.read_text()) == {"x": 1}
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]
    assert stat.S_IMODE(path.stat().st_mode) & 0o044  # an ordinary file's mode, not mkstemp's 0600
    write_bytes(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    write_parquet(tmp_path / "t.parquet", pd.DataFrame({"a": [1, 2]}))
    assert pd.read_parquet(tmp_path / "t.parquet")["a"].tolist() == [1, 2]


def test_a_failing_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "a.txt"

    def half_then_fail(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        atomic_write(path, half_then_fail)
    assert list(tmp_path.iterdir()) == []  # no file, no temp
    write_text(path, "old")
    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_full_disk_names_the_file_left_as_it_was(tmp_path):
    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"no space left on device; a\.txt was left as it was") as exc:
        atomic_write(tmp_path / "a.txt", full)
    assert exc.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "step_1"
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
        raise RuntimeError("crash")
    assert not final.exists()  # the temp directory stays under a name no reader takes for complete
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("2")
    with atomic_dir(final) as tmp:  # written again: replaced as a whole
        (tmp / "b").write_text("3")
    assert [p.name for p in final.iterdir()] == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["step_1"]
    with atomic_dir(final, shared=True) as tmp:  # a shared cache: the first complete one wins
        (tmp / "c").write_text("4")
    assert [p.name for p in final.iterdir()] == ["b"] and [p.name for p in tmp_path.iterdir()] == ["step_1"]
