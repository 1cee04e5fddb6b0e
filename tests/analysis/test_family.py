"""The family analysis against a stand-in for each design: a lookup solver whose knockout hooks fail it at planted
positions, so every number the analysis reports is known in advance."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from phasekv.analysis.family import (
    LEARNED,
    analyze_family,
    applied,
    conditions,
    masking,
    plan_grid,
    reading,
)
from phasekv.config import ModelConfig
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import ConfigError
from phasekv.eval.models import EvalModel
from phasekv.eval.prompts import PromptConfig
from phasekv.eval.tokens import WordTokenizer


class Attn(nn.Module):
    """Holds a design's knockout hook and NSA's gate projection (one logit per head and branch)."""

    def __init__(self, hook: str, heads: int = 2):
        super().__init__()
        setattr(self, hook, None)
        self.gate = nn.Linear(8, 3 * heads)


class Layer(nn.Module):
    def __init__(self, hook: str):
        super().__init__()
        self.attn = Attn(hook)


class Solver(nn.Module):
    """Answers the name after the first occurrence of the query key, wrong where `fails(t, q, attn)` says."""

    def __init__(self, vocab: int, family: str, hook: str, grids: dict, fails):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.layers = nn.ModuleList([Layer(hook), Layer(hook)])
        self.config = SimpleNamespace(family=family, grids=grids, max_seq_len=256)
        self.fails, self.vocab = fails, vocab

    def new_cache(self, batch: int):  # a PhaseLM's interface: scored through forward(ids, last=True)
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, last: bool = False) -> torch.Tensor:
        h = self.emb(ids)  # (B, T, 8)
        for layer in self.layers:
            layer.attn.gate(h)
        t = (ids[:, :-1] == ids[:, -1:]).float().argmax(1)  # (B,) the target key's position
        rows = torch.arange(ids.shape[0])
        answer = ids[rows, t + 1]
        fail = torch.tensor([self.fails(int(ti), ids.shape[1] - 1, self.layers[0].attn, b)
                             for b, ti in enumerate(t)])
        return 10.0 * F.one_hot(torch.where(fail, (answer + 1) % self.vocab, answer), self.vocab).float()


@pytest.fixture(scope="module")
def tok():
    return WordTokenizer(build_word_tokenizer())


def _em(tok, family, hook, grids, fails):
    return EvalModel(Solver(tok.vocab_size, family, hook, grids, fails), tok, f"fake {family}", "phasekv", None, {})


CFG = PromptConfig(records=12, demos=2, filler=50, modulus=24, per_group=16, keep_n=True, mappings=16)  # 80 tokens


def nsa_fails(t, q, attn, b):  # compressed-only fails at phase 3 of d = 4; as trained, flat
    return attn.branch_gates == "cmp" and t % 4 == 3


def moba_fails(t, q, attn, b):  # phases 12-15 of each block fail unless the target's block is forced in
    return t % 16 >= 12 and (attn.oracle_blocks is None or int(attn.oracle_blocks[b]) != t // 16)


def beacon_fails(t, q, attn, b):  # a target in a completed window fails when its beacon is knocked out
    return t // 32 < q // 32 and (t % 32) // 8 in (attn.beacon_knockout or set())


DESIGNS = {"nsa": ("branch_gates", {"d": 4, "l'": 8}, nsa_fails), "moba": ("oracle_blocks", {"B": 16}, moba_fails),
           "beacon": ("beacon_knockout", {"r": 8, "w": 32}, beacon_fails)}


@pytest.fixture(scope="module")
def study(tok, tmp_path_factory):
    """A study directory with the three stand-ins' family analyses: {design: (out dir, summary, model)}."""
    root = tmp_path_factory.mktemp("family")
    out = {}
    for design, (hook, grids, fails) in DESIGNS.items():
        em = _em(tok, design, hook, grids, fails)
        d = root / "analysis" / "family" / f"fake-{design}"
        out[design] = (d, analyze_family(em, CFG, d, ko_per_group=16, n_boot=200, progress=False), em)
    return root, out


def test_plan_grid_moduli():
    cfg = PromptConfig(records=16, demos=4, filler=48, modulus=24, per_group=576)
    assert cfg.target_positions == 79
    d = plan_grid("d", 4, cfg)
    assert (d.modulus, d.per_group, d.test) == (24, None, "period")
    b = plan_grid("B", 16, cfg)  # 32 needs 94 positions: only the gap at 16, N = 3 x 16^2 (12,288 prompts)
    assert (b.modulus, b.per_group, b.keep_n, b.test) == (16, 768, False, "gap")
    w = plan_grid("w", 32, cfg)
    assert w.modulus is None and w.test is None and "not determinable" in w.note
    z = plan_grid("z", 5, cfg)  # a multiple of 5 that fits, N exact and at most the lookup's prompts
    assert z.modulus == 10 and z.per_group % 100 == 0 and 10 * z.per_group <= 24 * 576
    quick = plan_grid("B", 16, PromptConfig(records=16, demos=4, filler=48, modulus=24, per_group=24, keep_n=True))
    assert (quick.modulus, quick.per_group, quick.keep_n) == (16, 36, True)
    with pytest.raises(ConfigError, match="grid x=0"):
        plan_grid("x", 0, cfg)


def test_nsa_compressed_branch_masked(study):
    """Compressed-only fails at phase 3 of d = 4; the model as trained is flat: the analysis says it masks."""
    out, s, _ = study[1]["nsa"]
    assert [(p["modulus"], p["test"]) for p in s["plans"]] == [(24, "period"), (24, "period")]
    assert s["lookup"]["prefix"]["mean"] == 100 and s["lookup"]["in-sequence"]["gap"] == 0
    by = {c["condition"]: c for c in s["knockouts"]["runs"][0]["conditions"]}
    assert list(by) == [LEARNED, "cmp", "sel", "win", "cmp+sel+win"]
    cmp_d = by["cmp"]["grids"][0]
    assert cmp_d["grid"] == "d" and cmp_d["weakest_phase"] == 3 and cmp_d["phase_profile"][3] == 0
    assert cmp_d["p_value"] < 0.01 and cmp_d["weak_spot"] and by["cmp"]["mean"] == pytest.approx(75)
    assert by[LEARNED]["grids"][0]["weak_spot"] is False and by["sel"]["mean"] == 100
    assert s["knockouts"]["masking"]["masks"] is True
    assert "mask the compressed branch: compressed-only is periodic at d" in reading(s)
    gates = pd.read_parquet(out / "gates.parquet")
    values = gates[["cmp", "sel", "win"]].to_numpy()
    assert set(gates.grid) == {"d", "l'"} and ((values > 0) & (values < 1)).all()
    assert len(gates[gates.grid == "d"]) == 4 * 2  # phases x layers
    effect = pd.read_parquet(out / "results.parquet")
    ph = effect[(effect.unit == "cmp") & (effect.grid == "d")].set_index("group")["change"]
    assert ph[3] == -100 and ph[0] == 0


def test_moba_oracle_block_and_hook_restored(study):
    """Phases 12-15 of each block fail unless the target's block is forced in: the oracle repairs them."""
    out, s, em = study[1]["moba"]
    (plan,) = s["plans"]
    assert (plan["modulus"], plan["test"]) == (16, "gap")  # 32 would need 94 positions, these prompts have 73
    assert s["lookup"]["prefix"]["grids"][0]["modulus"] == 16
    assert (out / "lookup-prefix-m16" / "summary.json").is_file()
    run = s["knockouts"]["runs"][0]
    by = {c["condition"]: c for c in run["conditions"]}
    assert run["modulus"] == 16 and by[LEARNED]["worst"] == 0 and by["oracle (key's block)"]["mean"] == 100
    assert by["oracle (name's block)"]["groups"][15] == 0  # the name of a key at 15 sits in the next block
    assert all(m.attn.oracle_blocks is None for m in em.model.layers)
    assert "accuracy depends on t mod 16" in reading(s)


def test_beacon_knockouts_by_offset(study):
    out, s, _ = study[1]["beacon"]
    assert [p["test"] for p in s["plans"]] == ["period", None]  # r at M = 24; w = 32 does not fit
    assert "w not determinable" in reading(s)
    beacons = pd.read_parquet(out / "beacons.parquet").set_index(["condition", "group"])["change"]
    assert beacons["beacon 1 out", "1"] == -100 and beacons["beacon 1 out", "2"] == 0
    assert beacons["beacon 1 out", "raw"] == 0


def test_report_section(study):
    """The report's tables and sentences from the study directory alone (no model)."""
    from phasekv.report import family
    from phasekv.report.load import load_study

    beacon_dir = study[1]["beacon"][0]  # the stand-in has no Beacon layers: plant its attention table
    pd.DataFrame([{"layer": 0, "target": t, "n": 5, "beacon 0": 0.1, "beacon 1": 0.2, "own window": 0.7}
                  for t in ("0", "1", "raw")]).to_parquet(beacon_dir / "beacon_attention.parquet")
    loaded = load_study(study[0])
    titles = [t.title for t in family.tables(loaded)]
    assert "fake beacon: the query's attention on its beacons by offset" in titles
    assert titles[0] == "Lookup by design and padding" and len(family.tables(loaded)[0].rows) == 3 * 2
    assert any("branch knockouts" in t for t in titles) and any("beacon that holds the target" in t for t in titles)
    md = family.family_markdown(loaded)
    assert md.startswith("## The family") and "compressed only" in md and "| fake nsa | prefix | 100.0" in md
    said = family.sentences(loaded)  # one per design, both paddings folded into it
    assert len(said) == 3 and all("prefix:" in s and "in-sequence:" in s for s in said)


def test_conditions_and_masking_rules():
    nsa = SimpleNamespace(layers=[Layer("branch_gates")])
    assert [c.name for c in conditions(nsa, {"d": 4, "l'": 8})] == [LEARNED, "cmp", "sel", "win", "cmp+sel+win"]
    model = nn.Module()
    model.layers = nn.ModuleList([Layer("beacon_knockout")])
    model.p = nn.Parameter(torch.zeros(1))
    cond = conditions(model, {"r": 8, "w": 32})[2]
    with applied(model, cond, []):
        assert model.layers[0].attn.beacon_knockout == {1}
    assert model.layers[0].attn.beacon_knockout is None

    def cond_row(name, weak, retrieves=True):
        return {"condition": name, "retrieves": retrieves, "grids": [{"grid": "d", "weak_spot": weak}]}

    assert masking([cond_row(LEARNED, False), cond_row("cmp", True)])["masks"] is True
    assert masking([cond_row(LEARNED, True), cond_row("cmp", True)])["masks"] is False
    assert masking([cond_row(LEARNED, False), cond_row("cmp", True, retrieves=False)])["masks"] is None
    assert masking([cond_row(LEARNED, False), cond_row("oracle", True)]) is None


def test_beacon_attention_reproduces_the_layer():
    """`beacon_probs` are the probabilities the layer's forward used: they and its values give its output z at the
    query; the summed mass per beacon index sums to 1 and a knocked-out beacon gets none."""
    from phasekv import PhaseLM
    from phasekv.analysis.family import beacon_attention, beacon_probs
    from phasekv.attention.beacon import is_beacon

    torch.manual_seed(0)
    model = PhaseLM(ModelConfig.from_name("Beacon r2 · window 8 · 1 KV", preset="tiny", vocab_size=64)).eval()
    attn, seen = model.layers[1].attn, {}
    attn.register_forward_pre_hook(lambda m, args: seen.update(h=args[0], pos=args[1]))
    attn.z_hook.register_forward_hook(lambda m, args, z: seen.update(z=z))
    for knockout in (None, {1}):
        attn.beacon_knockout = knockout
        with torch.no_grad():
            model(torch.randint(0, 64, (3, 21)))
            probs = beacon_probs(attn, seen["h"], seen["pos"])  # (B, H, T_s)
            v = attn._project(seen["h"], is_beacon(seen["pos"], 2), attn.v_proj, attn.beacon_v, 1)  # (B, 1, T_s, D)
            z = probs @ v[:, 0]  # (B, H, D)
            mass = beacon_attention(attn, seen["h"], seen["pos"])  # (B, 4 + 1)
        torch.testing.assert_close(z, seen["z"][:, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mass.sum(1), torch.ones(3))
        assert mass.shape == (3, 5) and (knockout is None or (mass[:, 1] == 0).all())
