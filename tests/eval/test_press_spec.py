"""Press specs (`phasekv.eval.press`): parsing, the kvpress arguments they build, windows scaled to the context,
contexts too short for a window, one-line errors. No kvpress needed (the presses run in tests/presses)."""

import pytest

from phasekv.errors import ConfigError
from phasekv.eval.models import EvalModel
from phasekv.eval.press import parse_press, scaled_window, with_press
from phasekv.eval.presses import alias, check_presses


@pytest.mark.parametrize("text, canonical", [
    ("snapkv:0.5", "snapkv:0.5"),
    (" SnapKV ( window = 16 , kernel=3 ) : 0.50 ", "snapkv(window=16,kernel=3):0.5"),
    ("streaming(sink=2):0.75", "streaming(sink=2):0.75"),
    ("chunkkv(snapkv,8):0.5", "chunkkv(snapkv,8):0.5"),
    ("chunk(knorm,32):0.75", "chunk(knorm,32):0.75"),
    ("chunk(snapkv(window=4),16):.5", "chunk(snapkv(window=4),16):0.5"),
    ("keydiff:0", "keydiff:0"),
])
def test_specs_parse_to_their_canonical_text(text, canonical):
    spec = parse_press(text)
    assert spec.text() == canonical and parse_press(canonical) == spec


def test_arguments_are_kvpress_fields_with_windows_scaled_to_the_scored_span():
    assert scaled_window(81) == 8 and scaled_window(16) == 2 and scaled_window(7) == 1
    assert scaled_window(512) == 64 and scaled_window(100_000) == 64  # kvpress's own window on long contexts
    assert parse_press("snapkv:0.5").arguments(81) == {"class": "SnapKVPress", "window_size": 8, "kernel_size": 5,
                                                       "compression_ratio": 0.5}
    assert parse_press("snapkv(window=64):0.5").arguments(81)["window_size"] == 64
    assert parse_press("streaming:0.5").arguments(81) == {"class": "StreamingLLMPress", "n_sink": 4,
                                                          "compression_ratio": 0.5}
    # a wrapper's ratio is its scoring press's; ChunkPress scores each chunk alone (window scaled to the chunk)
    assert parse_press("chunkkv(snapkv,8):0.75").arguments(81) == {
        "class": "ChunkKVPress", "chunk_length": 8,
        "press": {"class": "SnapKVPress", "window_size": 8, "kernel_size": 5, "compression_ratio": 0.75}}
    assert parse_press("chunk(snapkv,32):0.5").arguments(96)["press"]["window_size"] == 4
    assert parse_press("chunk(knorm,8):0.5").arguments(81)["press"] == {"class": "KnormPress",
                                                                        "compression_ratio": 0.5}


def test_only_chunkkv_reads_its_batch_mates():
    assert [parse_press(s).batch_independent for s in ("snapkv:0.5", "knorm:0.5", "streaming:0.5", "keydiff:0.5",
                                                       "chunk(knorm,8):0.5", "chunkkv(knorm,8):0.5")] == [
        True, True, True, True, True, False]


@pytest.mark.parametrize("spec, context, says", [
    ("snapkv(window=64):0.5", 41, "a context of 41 tokens is not longer than SnapKVPress's window (window_size=64)"),
    ("snapkv(window=64):0.5", 64, "a context of 64 tokens is not longer"),
    ("streaming(sink=8):0.5", 8, "a context of 8 tokens is not longer than StreamingLLMPress's sink (n_sink=8)"),
    ("chunk(snapkv(window=8),8):0.5", 80, "a chunk of 8 tokens is not longer than SnapKVPress's window"),
    ("chunk(streaming,27):0.5", 82, "a chunk of 1 token is not longer than StreamingLLMPress's sink"),
])
def test_a_context_too_short_for_the_window_is_one_error(spec, context, says):
    with pytest.raises(ConfigError) as exc:
        parse_press(spec).check_span(context)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_long_enough_contexts_pass():
    for spec, context in (("snapkv(window=64):0.5", 65), ("chunk(streaming,27):0.5", 81), ("knorm:0.5", 1),
                          ("chunkkv(snapkv,8):0.5", 81)):
        parse_press(spec).check_span(context)


@pytest.mark.parametrize("spec, says", [
    ("h2o:0.5", "unknown press 'h2o' (known: snapkv, streaming, knorm, keydiff, chunk, chunkkv)"),
    ("snapkv", "the spec ends too early"),
    ("snapkv:1", "the compression ratio must be in [0, 1), got 1"),
    ("snapkv:half", "the compression ratio must be a number, got 'half'"),
    ("snapkv(sink=4):0.5", "snapkv has no option 'sink' (its options: window, kernel)"),
    ("knorm(window=4):0.5", "knorm has no option 'window' (its options: none)"),
    ("snapkv(window=0):0.5", "snapkv's window must be a whole number >= 1, got '0'"),
    ("snapkv(8):0.5", "snapkv takes only key=value options"),
    ("chunkkv(snapkv):0.5", "chunkkv takes a scoring press and a chunk length: chunkkv(knorm,8)"),
    ("chunkkv(8,snapkv):0.5", "chunkkv takes a scoring press and a chunk length"),
    ("chunk(chunkkv(knorm,4),8):0.5", "chunk wraps a scoring press (snapkv, streaming, knorm, keydiff), not chunkkv"),
    ("snapkv:0.5 extra", "unexpected 'extra' after the ratio"),
    ("snap$kv:0.5", "unexpected '$kv:0.5'"),
])
def test_bad_specs_are_one_line_errors(spec, says):
    with pytest.raises(ConfigError) as exc:
        parse_press(spec)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_only_hugging_face_models_take_a_press():
    em = EvalModel(None, None, "W8/S8 · 1 KV", "phasekv", 8, {})
    with pytest.raises(ConfigError, match="needs a Hugging Face model in process"):
        with_press(em, "snapkv:0.5")
    pm = with_press(EvalModel(None, None, "qwen3:full", "hf", None, {"path": "x"}), "chunk(knorm,8):0.75")
    assert pm.name == "qwen3:full · chunk(knorm,8):0.75" and pm.stride == 8  # the press's grid: the default stride
    assert pm.info["ratios"] == [{"ratio": 8, "layer_types": ["chunk(knorm,8):0.75 chunks (every layer)"]}]
    assert with_press(EvalModel(None, None, "qwen3:full", "hf", None, {}), "knorm:0.5").stride is None


def test_sweep_names_and_press_lists():
    assert alias("chunkkv(snapkv,8):0.5") == "chunkkv-snapkv-8-0.5" and alias(None) == "none"
    assert check_presses(["snapkv", "chunk(knorm,8)"]) == ("snapkv", "chunk(knorm,8)")
    with pytest.raises(ConfigError, match="without its ratio"):
        check_presses(["snapkv:0.5"])
