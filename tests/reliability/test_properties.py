"""Property tests: the model-name parser, the prompt builders and the moment-matching sampler."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig
from phasekv.config.names import parse_name
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import ConfigError, DataError, ModelNameError
from phasekv.eval.design import make_design, round_up
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts
from phasekv.eval.tokens import WordTokenizer

WT = WordTokenizer(build_word_tokenizer(), "word")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- the name parser ------------------------------------------------------------------------------

@st.composite
def configs(draw) -> ModelConfig:
    base = ModelConfig.from_name("w8s8-1kv", preset="tiny")
    kv = draw(st.sampled_from([1, 2, 4]))
    seed = draw(st.integers(0, 10_000))
    rope = draw(st.sampled_from([None, 0, 2, 8, 16, 32]))
    if draw(st.booleans()):  # full attention: no compression attributes
        return base.replace(window=0, stride=0, n_kv_heads=kv, seed=seed, rope_dims=rope, local_window=16,
                            qk_norm=draw(st.booleans()))
    w = draw(st.integers(1, 24))
    gate = draw(st.sampled_from(["scalar", "vector", "uniform"]))
    return base.replace(
        window=w, stride=draw(st.integers(1, w)), n_kv_heads=kv, gate=gate, tied_kv=draw(st.booleans()),
        post_norm=draw(st.booleans()), gate_bias=True if gate == "uniform" else draw(st.booleans()),
        qk_norm=draw(st.booleans()), rope_dims=rope, local_window=draw(st.sampled_from([None, 1, 4, 16, 33])),
        stagger=draw(st.booleans()), seed=seed)


@SETTINGS
@given(cfg=configs())
def test_every_config_survives_its_name_and_its_alias(cfg):
    for text in (cfg.name, cfg.alias, f"  {cfg.name}  ", cfg.alias.upper()):
        assert ModelConfig.from_name(text, preset="tiny") == cfg, text
    assert ModelConfig.from_name(cfg.name).name == cfg.name  # canonical: printing is a fixed point


@SETTINGS
@given(text=st.text(st.characters(codec="utf-8"), max_size=40) | st.lists(
    st.sampled_from(["W8/S8", "w8s8", "Full attention", "1 KV", "3kv", "no RoPE", "norope", "·", "-", " ", "seed 4",
                     "RoPE on 7 dims", "local window 0", "tied K/V", "deepseek", "vector gates", "x", "/"]),
    max_size=6).map(" · ".join))
def test_any_text_parses_or_fails_with_a_config_error_naming_it(text):
    try:
        fields = parse_name(text)
    except ModelNameError as exc:
        assert "\n" not in str(exc) and (repr(text.strip())[1:-1][:10] in str(exc) or "empty" in str(exc)
                                         or "repeats" in str(exc) or "unknown part" in str(exc))
        return
    assert isinstance(fields, dict) and {"window", "stride"} <= set(fields)
    try:
        cfg = ModelConfig.from_name(text)
    except ConfigError as exc:  # parsed, but impossible (e.g. S > W): the field is named
        assert "invalid config: " in str(exc) and "=" in str(exc)
        return
    assert ModelConfig.from_name(cfg.name) == cfg


# ---- the moment-matching sampler ------------------------------------------------------------------

def _moments(group: np.ndarray) -> tuple[Fraction, Fraction]:
    n = len(group)
    s, s2 = int(group.sum()), int((group.astype(object) ** 2).sum())
    return Fraction(s, n), Fraction(s2, n) - Fraction(s, n) ** 2


@SETTINGS
@given(m=st.integers(1, 12), n=st.integers(1, 400), center=st.floats(50, 5000), keep_n=st.booleans(),
       seed=st.integers(0, 100))
def test_design_puts_each_group_on_its_residue_with_equal_moments(m, n, center, keep_n, seed):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = make_design(m, n, center, keep_n=keep_n, rng=np.random.default_rng(seed))
    exact_n = n % (m * m) == 0
    assert d.modulus == m and len(d.positions) == m and d.requested == n
    assert d.n_per_group == (n if keep_n or exact_n else round_up(n, m))
    assert (d.notice is None) == exact_n
    for r, group in enumerate(d.positions):
        assert len(group) == d.n_per_group and np.all(group % m == r)
        assert d.lo <= group.min() and group.max() <= d.hi
    moments = [_moments(g) for g in d.positions]
    if d.exact:
        assert len(set(moments)) == 1  # identical mean AND variance, exactly (rational arithmetic)
        assert abs(float(moments[0][0]) - center) <= 1
    else:  # kept N: sampled from the exact design; the achieved spread is what the notice reports
        spread = max(float(mu) for mu, _ in moments) - min(float(mu) for mu, _ in moments)
        assert f"mean {spread:.3f}" in d.notice


# ---- the prompt builders --------------------------------------------------------------------------

@st.composite
def prompt_configs(draw) -> PromptConfig:
    key_tokens = draw(st.sampled_from([1, 2]))
    records = draw(st.integers(2, 24))
    modulus = draw(st.integers(1, 6))
    sep = ";" if key_tokens == 2 and draw(st.booleans()) else None
    record_len = key_tokens + 1 + (sep is not None)
    return PromptConfig(
        records=records, demos=draw(st.integers(0, records - 1)), key_tokens=key_tokens, separator=sep,
        padding=draw(st.sampled_from(["prefix", "in-sequence"])),
        filler=draw(st.integers(record_len - 1, 40)), modulus=modulus,
        per_group=draw(st.sampled_from([modulus * modulus, 2 * modulus * modulus, 5])), keep_n=draw(st.booleans()),
        mappings=draw(st.integers(1, 5)), seed=draw(st.integers(0, 1000)),
        balance=draw(st.sampled_from([None, 0.05])))


@pytest.mark.filterwarnings("ignore:per-group N")  # rounding N up is announced; the property still holds
@SETTINGS
@given(cfg=prompt_configs(), data=st.data())
def test_prompts_place_the_target_token_exactly(cfg, data):
    try:
        prompts = RetrievalPrompts(cfg, WT)
    except (ConfigError, DataError) as exc:  # a design that cannot fit these records and filler: said so
        assert "\n" not in str(exc)
        assume(False)
    again = RetrievalPrompts(cfg, WT)
    L = cfg.record_len
    for pid in data.draw(st.lists(st.integers(0, len(prompts) - 1), min_size=1, max_size=4, unique=True)):
        p = prompts.prompt(pid)
        assert p.ids == again.prompt(pid).ids  # deterministic
        assert len(p.ids) == prompts.length and p.query_pos == prompts.length - 1
        assert p.residue == p.target_pos % cfg.modulus == pid // prompts.design.n_per_group
        t, k = p.target_pos, cfg.key_tokens
        assert p.ids[t:t + k] == p.ids[p.query_pos - k + 1:]  # the query repeats the target key
        assert p.ids[t + k] == p.answer == WT.word_id(p.answer_word)
        # the target key appears once among the records: the answer is determined
        words = p.words[: len(p.words) - cfg.demos * L - k]
        keys = [tuple(words[i:i + k]) for i in range(len(words) - k + 1)]
        record_keys = [tuple(p.words[t - len(WT.prefix) + j] for j in range(k))]
        assert keys.count(record_keys[0]) == 1
    assert prompts.metadata()["n_prompts"] == len(prompts) == cfg.modulus * prompts.design.n_per_group


@pytest.mark.parametrize("bad", [dict(records=1, demos=1), dict(padding="suffix"), dict(key_tokens=0),
                                 dict(filler=0, key_tokens=2, separator=";"), dict(mappings=0)])
def test_impossible_prompt_configs_are_config_errors(bad):
    with pytest.raises(ConfigError):
        PromptConfig(**bad)
