"""`--init-from` across designs: full attention's weights continued as a compressed design, NSA, MoBA or
Activation Beacon (`phasekv.train.build.change_design`, the one rule)."""

import json

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.errors import ConfigError
from phasekv.train import train
from phasekv.train.build import change_design

from .helpers import FAST


@pytest.fixture(scope="module")
def full():
    torch.manual_seed(0)
    return PhaseLM(ModelConfig.from_name("Full attention · 1 KV", preset="tiny")).eval()


def test_moba_from_full_attention_has_its_weights_and_with_every_block_its_logits(full):
    moba, record = change_design(full, "MoBA B16 top 4 · 1 KV")  # 64 tokens: 4 blocks of 16, all selected
    moba.eval()
    ref = full.state_dict()
    assert moba.state_dict().keys() == ref.keys() and record["own"] == []
    assert all(torch.equal(w, ref[k]) for k, w in moba.state_dict().items())
    ids = torch.randint(0, 500, (2, 64))
    with torch.no_grad():
        assert torch.allclose(moba(ids), full(ids), atol=1e-5)
    assert record["design_change"] == "Full attention · 1 KV -> MoBA B16 top 4 · 1 KV"


def test_beacon_projections_start_as_the_layers_and_nsa_modules_fresh_at_the_seed(full):
    beacon, record = change_design(full, "Beacon r8 · window 32 · 1 KV")
    for mine, layer in zip(beacon.layers, full.layers, strict=True):
        for b, raw in (("beacon_q", "q_proj"), ("beacon_k", "k_proj"), ("beacon_v", "v_proj")):
            assert torch.equal(getattr(mine.attn, b).weight, getattr(layer.attn, raw).weight)
    assert "beacon_embed.weight" in record["own"] and "layers.0.attn.beacon_q.weight" in record["own"]
    nsa_a, rec = change_design(full, "NSA l8/d4 · select 8 top 2 · window 16 · 1 KV")
    nsa_b, _ = change_design(full, "NSA l8/d4 · select 8 top 2 · window 16 · 1 KV")
    nsa_c, _ = change_design(full, "NSA l8/d4 · select 8 top 2 · window 16 · 1 KV", seed=7)
    gate = "layers.0.attn.gate.weight"
    assert gate in rec["own"] and not any(k in rec["own"] for k in full.state_dict())
    assert torch.equal(nsa_a.state_dict()[gate], nsa_b.state_dict()[gate])  # the run seed decides
    assert not torch.equal(nsa_a.state_dict()[gate], nsa_c.state_dict()[gate]) and nsa_c.config.seed == 7


def test_a_compressed_design_keeps_every_tensor_and_starts_its_compressor_at_the_seed(full):
    uniform, record = change_design(full, "W8/S8 · 1 KV · uniform averaging")
    ref = full.state_dict()
    assert all(torch.equal(uniform.state_dict()[k], w) for k, w in ref.items())
    assert record["own"] == [f"layers.{i}.attn.compressor.{b}.payload" for i in (0, 1) for b in ("key", "value")]
    again, _ = change_design(full, "W8/S8 · 1 KV · uniform averaging")
    assert all(torch.equal(w, again.state_dict()[k]) for k, w in uniform.state_dict().items())  # the run seed decides
    gated, rec = change_design(full, "W8/S4 · 1 KV")
    assert "layers.1.attn.compressor.key.gate_weight" in rec["own"] and gated.config.compressed


@pytest.mark.parametrize("arch, says", [
    ("MoBA B16 top 3 · 2 KV", "in the backbone: n_kv_heads=2 against 1"),
    ("MoBA B16 top 3 · 1 KV · no Q/K norm", "in the backbone: qk_norm=False against True"),
    ("W8/S4 · 2 KV", "in the backbone: n_kv_heads=2 against 1"),
])
def test_unreachable_or_mismatched_designs_are_one_line_errors(full, arch, says):
    with pytest.raises(ConfigError, match="differs from --init-from's 'Full attention · 1 KV'") as exc:
        change_design(full, arch)
    assert says in str(exc.value) and "\n" not in str(exc.value)
    for other in ("MoBA B16 top 3 · 1 KV", "W8/S8 · 1 KV"):
        source, _ = change_design(full, other)
        with pytest.raises(ConfigError, match=f"'{other}', and a design change goes from full attention or to it"):
            change_design(source, "Beacon r8 · window 32 · 1 KV")
    assert change_design(full, "full-1kv") == (full, None)  # its own name: no change


def test_a_design_continues_as_full_attention(full):
    """The other way: a compressed model's shared tensors as full attention, its own tensors dropped."""
    w8s8, _ = change_design(full, "W8/S8 · 1 KV")
    back, rec = change_design(w8s8, "Full attention · 1 KV")
    assert not back.config.compressed and back.config == full.config and rec["own"] == []
    assert rec["dropped"] and all("compressor" in k for k in rec["dropped"])
    assert rec["loaded"] == len(full.state_dict()) and rec["design_change"] == "W8/S8 · 1 KV -> Full attention · 1 KV"
    assert all(torch.equal(w, back.state_dict()[k]) for k, w in w8s8.state_dict().items() if k in back.state_dict())


def test_cli_continues_full_attention_as_beacon_and_records_it(tmp_path, monkeypatch, capsys):
    from phasekv.cli import main

    src = tmp_path / "full"
    train(out=str(src), **dict(FAST, arch="full-1kv", steps=1, val_every=0, gate_steps="none"))

    def cli(*args: str) -> tuple[int, str]:
        monkeypatch.setattr("sys.argv", ["phasekv", "train", "--init-from", str(src), "--steps", "1",
                                         "--batch-size", "4", "--seq-len", "64", "--val-sequences", "8",
                                         "--gate-steps", "none", "--threads", "1", "--no-progress", *args])
        with pytest.raises(SystemExit) as exc:
            main()
        return exc.value.code, capsys.readouterr().err

    assert cli("--arch", "Beacon r8 · window 32 · 1 KV", "--out", str(tmp_path / "beacon"))[0] in (0, None)
    saved = json.loads((tmp_path / "beacon" / "config.json").read_text())
    assert saved["name"] == "Beacon r8 · window 32 · 1 KV" and saved["train"]["init_from"] == str(src)
    assert saved["init"]["from"] == str(src) and saved["init"]["from_name"] == "Full attention · 1 KV"
    train(out=str(tmp_path / "beacon"), resume=True, steps=2, progress=False)  # a resumed run keeps the record
    assert json.loads((tmp_path / "beacon" / "config.json").read_text())["init"] == saved["init"]
    assert cli("--out", str(tmp_path / "same"))[0] in (0, None)  # no --arch: the source's own model, continued
    same = json.loads((tmp_path / "same" / "config.json").read_text())
    assert same["name"] == "Full attention · 1 KV" and "init" not in same
    code, err = cli("--arch", "MoBA B16 top 3 · 2 KV", "--out", str(tmp_path / "bad"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "n_kv_heads=2 against 1" in err
