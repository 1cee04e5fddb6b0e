"""Checkpoint manifests: a truncated or bit-flipped file is found, and loaders fall back to the previous
good checkpoint with a warning naming the bad file."""

import json

import pytest

from phasekv.errors import CheckpointError
from phasekv.model.manifest import MANIFEST_FILE, sha256, verify_manifest
from phasekv.train import load_run, train
from phasekv.train.checkpoint import latest_checkpoint, list_checkpoints

from .helpers import TINY, assert_same_weights, losses, weights


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 3 and 6 (the pristine copy; tests copy it)."""
    out = tmp_path_factory.mktemp("ck") / "run"
    train(out=str(out), steps=6, ckpt_every=3, **TINY)
    return out


@pytest.fixture
def copy(run, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def flip_bit(path, offset=-9):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_every_checkpoint_file_is_listed_with_its_sha256(run):
    for ckpt in list_checkpoints(run):
        manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
        on_disk = {p.name for p in ckpt.iterdir()} - {MANIFEST_FILE}
        assert set(manifest["files"]) == on_disk == {"model.safetensors", "config.json", "optimizer.pt",
                                                      "trainer_state.json"}
        for name, entry in manifest["files"].items():
            assert entry["sha256"] == sha256(ckpt / name)
            assert entry["bytes"] == (ckpt / name).stat().st_size
        assert verify_manifest(ckpt) is True


@pytest.mark.parametrize("damage", ["bitflip", "truncate", "delete"])
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "trainer_state.json", "config.json"])
def test_damaged_latest_falls_back_with_a_warning_naming_the_file(copy, name, damage):
    step6 = list_checkpoints(copy)[-1]
    bad = step6 / name
    if damage == "bitflip":
        flip_bit(bad, offset=len(bad.read_bytes()) // 2)
    elif damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:-7])
    else:
        bad.unlink()
    if damage == "delete" and name == "trainer_state.json":  # no longer a complete checkpoint: silently skipped
        assert latest_checkpoint(copy).name == "step_00000003"
        return
    with pytest.warns(UserWarning, match=rf"{bad}.*(sha256|bytes|missing).*step_00000006"):
        assert latest_checkpoint(copy).name == "step_00000003"
    with pytest.warns(UserWarning, match=str(bad)):
        model, _ = load_run(copy)  # the one loader behind every --model flag
    assert model.config.name == TINY["arch"]


def test_loading_a_damaged_checkpoint_directly_names_the_file(copy):
    step6 = list_checkpoints(copy)[-1]
    flip_bit(step6 / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"step_00000006/model\.safetensors: sha256 does not match"):
        load_run(step6)


def test_resume_falls_back_to_the_previous_good_checkpoint_and_ends_identical(run, copy, tmp_path):
    """A bit flip in the newest checkpoint costs the steps since the previous one, nothing else."""
    ref = tmp_path / "ref"
    train(out=str(ref), steps=9, ckpt_every=3, **TINY)
    flip_bit(list_checkpoints(copy)[-1] / "optimizer.pt")
    with pytest.warns(UserWarning, match="optimizer.pt"):
        train(out=str(copy), resume=True, steps=9, ckpt_every=3, **TINY)
    assert_same_weights(weights(ref), weights(copy))
    assert losses(ref) == losses(copy)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(copy):
    for ckpt in list_checkpoints(copy):
        flip_bit(ckpt / "model.safetensors")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no intact checkpoint"):
        train(out=str(copy), resume=True, steps=9, ckpt_every=3, **TINY)
    assert len(list_checkpoints(copy)) == 2  # nothing deleted or overwritten


@pytest.mark.parametrize("manifest", ["{not json", '{"files": {"../../x": {"sha256": "0", "bytes": 1}}}',
                                      '{"files": [1, 2]}', '{"format": 1}'])
def test_a_bad_manifest_is_itself_a_bad_file(copy, manifest):
    step6 = list_checkpoints(copy)[-1]
    (step6 / MANIFEST_FILE).write_text(manifest)
    with pytest.warns(UserWarning, match=r"manifest"):
        assert latest_checkpoint(copy).name == "step_00000003"


def test_resaving_a_model_into_a_checkpoint_drops_its_stale_manifest(copy):
    step6 = list_checkpoints(copy)[-1]
    model, _ = load_run(step6)
    model.save(step6)
    assert not (step6 / MANIFEST_FILE).exists()
    load_run(step6)
