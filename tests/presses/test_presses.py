"""phasekv's --press path against kvpress applied by hand, on a tiny random Qwen3 (no download): the same kept
positions per layer and KV head and the same next-token logits for every press kind; answers independent of
batch-mates (ChunkKVPress's are not when batched: caught); a context too short for a press's window and an
unknown press are one-line errors.

Runs in kvpress's own environment (it pins transformers < 5.3): `make test-kvpress`.
"""

import json
import sys

import pytest
import torch

kvpress = pytest.importorskip("kvpress")
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from phasekv.data.tokenizer import build_word_tokenizer, to_hf  # noqa: E402
from phasekv.errors import ConfigError  # noqa: E402
from phasekv.eval.models import EvalModel  # noqa: E402
from phasekv.eval.press import Pressed, kept_positions, parse_press, with_press  # noqa: E402
from phasekv.eval.prompts import RetrievalPrompts, lookup_config, needle_config  # noqa: E402
from phasekv.eval.run import run_retrieval  # noqa: E402
from phasekv.eval.tokens import WordTokenizer  # noqa: E402

pytestmark = pytest.mark.kvpress

TOK = build_word_tokenizer()
WT = WordTokenizer(TOK, "word")
# the demo's lookup layout (16 records, 4 demonstrations, 48 filler: 81 context tokens + a 9-token question)
CFG = lookup_config(records=16, demos=4, filler=48, modulus=8, per_group=8, keep_n=True, mappings=4)
BY_HAND = {  # each spec and the kvpress press it must equal, built by hand (windows as scaled for 81 tokens)
    "snapkv:0.5": lambda: kvpress.SnapKVPress(compression_ratio=0.5, window_size=8, kernel_size=5),
    "streaming:0.5": lambda: kvpress.StreamingLLMPress(compression_ratio=0.5, n_sink=4),
    "knorm:0.75": lambda: kvpress.KnormPress(compression_ratio=0.75),
    "keydiff:0.5": lambda: kvpress.KeyDiffPress(compression_ratio=0.5),
    "chunkkv(snapkv,8):0.5": lambda: kvpress.ChunkKVPress(kvpress.SnapKVPress(compression_ratio=0.5, window_size=8,
                                                                              kernel_size=5), chunk_length=8),
    "chunkkv(keydiff,9):0.75": lambda: kvpress.ChunkKVPress(kvpress.KeyDiffPress(compression_ratio=0.75),
                                                            chunk_length=9),
    "chunk(knorm,8):0.75": lambda: kvpress.ChunkPress(kvpress.KnormPress(compression_ratio=0.75), chunk_length=8),
    "chunk(streaming(sink=2),27):0.5": lambda: kvpress.ChunkPress(
        kvpress.StreamingLLMPress(compression_ratio=0.5, n_sink=2), chunk_length=27),
}


@pytest.fixture(scope="module")
def qwen3():
    """A tiny random Qwen3 (2 layers, 4 query heads, 2 KV heads) over the word tokenizer, as an EvalModel."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=TOK.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper random attention, so presses keep different positions per head and prompt
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return EvalModel(model, WT, "qwen3:tiny", "hf", None, {"path": "memory"})


def prompts(n: int = 8):
    ps = RetrievalPrompts(CFG, WT)
    return [ps.prompt(i * (len(ps) // n)) for i in range(n)]


def by_hand(model, press, ids: torch.Tensor, question: int):
    """kvpress's pipeline by hand: the context prefilled under the press (the model without its head), the
    question after it with position ids from the context length; the cache and the question's last logits."""
    n = ids.shape[1] - question
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=ids[:, :n], past_key_values=cache)
    kept = [layer.keys.clone() for layer in cache.layers]
    with torch.no_grad():
        out = model(input_ids=ids[:, n:], past_key_values=cache, position_ids=torch.arange(n, ids.shape[1])[None])
    return kept, out.logits[:, -1].float()


@pytest.mark.parametrize("spec", list(BY_HAND))
def test_press_path_equals_kvpress_by_hand(qwen3, spec):
    em = with_press(qwen3, spec)
    batch = prompts()
    q = batch[0].question
    assert q == CFG.demos * 2 + 1  # demonstrations and the target key
    pressed = Pressed(qwen3.model, em.spec, q, len(batch[0].ids) - q)
    spans = set()
    for p in batch:
        ids = torch.tensor([p.ids])  # (1, T)
        ctx = ids[:, :-q]
        ours = pressed.compress(ctx)
        keys, logits = by_hand(qwen3.model, BY_HAND[spec](), ids, q)
        hand = DynamicCache()
        for i, k in enumerate(keys):
            hand.update(k, k, i)
        for a, b in zip(kept_positions(qwen3.model, ctx, ours), kept_positions(qwen3.model, ctx, hand), strict=True):
            assert torch.equal(a, b)  # (1, n_kv, kept): the same positions per layer and KV head
            spans.add(tuple(a[0, 0].tolist()))
        assert torch.allclose(pressed(ids).logits[:, -1], logits, atol=1e-5)
    assert len(spans) > 1 or "streaming" in spec  # positions kept differ between prompts (StreamingLLM's cannot)
    rows = [r for chunk in em.score(batch, "prefix", batch_size=4) for r in chunk]
    for p, r in zip(batch, rows, strict=True):
        _, logits = by_hand(qwen3.model, BY_HAND[spec](), torch.tensor([p.ids]), q)
        assert r["pred"] == int(logits.argmax()) and r["prob"] == pytest.approx(
            float(torch.softmax(logits, -1)[0, p.answer]), abs=1e-5)


def _rows(em, batch, size):
    return [(r["pid"], r["pred"], round(r["prob"], 4)) for c in em.score(batch, "prefix", batch_size=size) for r in c]


@pytest.mark.parametrize("spec", list(BY_HAND))
def test_answers_do_not_depend_on_batch_mates(qwen3, spec):
    em = with_press(qwen3, spec)
    batch = prompts()
    batched = _rows(em, batch, 8)
    assert em.info["press"]["batch_size"] == (8 if em.spec.batch_independent else 1)
    assert batched == _rows(em, batch, 1)


def test_chunkkv_batched_picks_the_first_prompts_chunks(qwen3):
    """The trap the one-prompt rule avoids: ChunkKVPress run on a batch keeps the first prompt's chunks for all."""
    spec = parse_press("chunkkv(snapkv,8):0.5")
    assert not spec.batch_independent
    batch = prompts()
    q = batch[0].question
    ids = torch.tensor([p.ids for p in batch])  # (8, T)
    pressed = Pressed(qwen3.model, spec, q, ids.shape[1] - q)
    together = kept_positions(qwen3.model, ids[:, :-q], pressed.compress(ids[:, :-q]))[0]  # (8, n_kv, kept)
    alone = [kept_positions(qwen3.model, ids[i:i + 1, :-q], pressed.compress(ids[i:i + 1, :-q]))[0][0]
             for i in range(len(batch))]
    assert all(torch.equal(together[i], together[0]) for i in range(len(batch)))
    assert any(not torch.equal(together[i], alone[i]) for i in range(len(batch)))


def test_summary_records_the_press_and_its_cache(qwen3, tmp_path):
    em = with_press(qwen3, "chunkkv(snapkv,8):0.5")
    assert em.stride == 8 and em.name == "qwen3:tiny · chunkkv(snapkv,8):0.5"
    s = run_retrieval("lookup", em, CFG, tmp_path, batch_size=8, progress=False)
    press = json.loads((tmp_path / "summary.json").read_text())["provenance"]["model_info"]["press"]
    assert s["stride"] == 8 and press["spec"] == "chunkkv(snapkv,8):0.5" and press["batch_size"] == 1
    assert press["arguments"] == {"class": "ChunkKVPress", "chunk_length": 8, "press": {
        "class": "SnapKVPress", "window_size": 8, "kernel_size": 5, "compression_ratio": 0.5}}
    # 81 context tokens = 10 chunks of 8 + 1: int(11 * 0.5) = 5 chunks kept, 40 tokens or 33 with the last
    assert press["cache"]["context"] == 81 and press["cache"]["question"] == 9
    assert all(33 <= lo <= hi <= 40 for lo, hi in press["cache"]["kept_per_layer"])
    assert [r["ratio"] for r in s["ratios"]] == [8]


def test_caches_of_different_lengths_per_layer_are_one_error(qwen3):
    """ChunkKV keeps a partial last chunk in some layers only (81 tokens = 20 chunks of 4 + 1): transformers
    masks every layer by the first one's length, so the question cannot run; a ConfigError says why."""
    em = with_press(qwen3, "chunkkv(knorm,4):0.75")
    with pytest.raises(ConfigError, match="kept 17 and 20 context tokens in different layers"):
        for _ in em.score(prompts(), "prefix", batch_size=8):
            pass


def test_flip_candidates_under_a_press_equal_kvpress_by_hand(qwen3):
    """The filler sweep's question is the last token: the rest prefilled under the press, then the last token and
    each candidate (teacher-forced beyond its first token) uncompressed."""
    em = with_press(qwen3, "snapkv:0.5")
    ids = prompts(1)[0].ids
    cands = [[5], [7, 9, 11]]
    ours = em.candidate_logprobs(ids, cands)
    for c, lp in zip(cands, ours, strict=True):
        n = len(ids) - 1
        cache = DynamicCache()
        with torch.no_grad(), BY_HAND["snapkv:0.5"]()(qwen3.model):
            qwen3.model.model(input_ids=torch.tensor([ids[:n]]), past_key_values=cache)
        q = torch.tensor([ids[n:] + c[:-1]])
        with torch.no_grad():
            logits = qwen3.model(input_ids=q, past_key_values=cache, position_ids=torch.arange(n, n + q.shape[1])[None])
        hand = torch.log_softmax(logits.logits[0].float(), -1).gather(1, torch.tensor(c)[:, None]).sum()
        assert lp == pytest.approx(float(hand), abs=1e-4)


def test_needle_under_a_press(qwen3, tmp_path):
    """The needle test's question: the two demonstration records (4 tokens each) and the two-word target key."""
    cfg = needle_config(context=192, per_group=8, keep_n=True, mappings=2)
    em = with_press(qwen3, "chunk(knorm,16):0.5")
    run_retrieval("needle", em, cfg, tmp_path, batch_size=8, progress=False)
    cache = json.loads((tmp_path / "summary.json").read_text())["provenance"]["model_info"]["press"]["cache"]
    assert cache["question"] == 2 * 4 + 2 and cache["context"] + cache["question"] == RetrievalPrompts(cfg, WT).length


def _main(args, monkeypatch, capsys) -> tuple[int, str]:
    import phasekv.cli as cli

    monkeypatch.setattr(sys, "argv", ["phasekv", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def qwen3_dir(qwen3, tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    qwen3.model.save_pretrained(d)
    to_hf(TOK).save_pretrained(d)  # as `phasekv export` writes it
    return d


@pytest.mark.parametrize("spec, filler, says", [
    ("snapkv(window=64):0.5", 8, "a context of 41 tokens is not longer than SnapKVPress's window (window_size=64)"),
    ("chunk(snapkv(window=8),8):0.5", 48, "is not longer than SnapKVPress's window (window_size=8)"),
    ("h2o:0.5", 48, "unknown press 'h2o'"),
    ("snapkv(sink=4):0.5", 48, "snapkv has no option 'sink'"),
    ("snapkv:1.5", 48, "the compression ratio must be in [0, 1)"),
])
def test_cli_bad_press_is_one_line(qwen3_dir, tmp_path, monkeypatch, capsys, spec, filler, says):
    code, err = _main(["eval", "lookup", "--model", str(qwen3_dir), "--out", str(tmp_path / "x"), "--records", "16",
                       "--demos", "4", "--filler", str(filler), "--modulus", "8", "--per-group", "8", "--keep-n",
                       "--press", spec], monkeypatch, capsys)
    last = err.strip().splitlines()[-1]  # (transformers 5.2 draws its weight-loading bar on stderr first)
    assert code == 2 and last.startswith("error: ") and says in last and err.count("error") == 1, err
    assert not (tmp_path / "x" / "summary.json").exists()


def test_cli_lookup_and_audit_under_a_press(qwen3_dir, tmp_path, monkeypatch, capsys):
    args = ["--model", str(qwen3_dir), "--records", "16", "--demos", "4", "--filler", "48", "--modulus", "8",
            "--per-group", "8", "--press", "chunk(knorm,4):0.5"]
    code, err = _main(["eval", "lookup", "--out", str(tmp_path / "e"), "--keep-n", *args], monkeypatch, capsys)
    assert code in (0, None), err
    s = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert s["stride"] == 4 and s["model"].endswith("· chunk(knorm,4):0.5") and s["provenance"]["model_info"]["press"]["cache"]["context"] == 81
    code, err = _main(["audit", "--out", str(tmp_path / "a"), *args], monkeypatch, capsys)
    v = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert code == v["exit_code"] == 4 and v["model"].endswith("· chunk(knorm,4):0.5") and v["stride"] == 4
