"""Inference-time KV-cache compression: a Hugging Face model evaluated under a press of NVIDIA's kvpress.

A press spec names a kvpress press, its arguments and the compression ratio (the share of the context's KV
pairs it drops):

    snapkv:0.5                 SnapKVPress: attention of the last `window` context queries, pooled (`kernel`)
    snapkv(window=16,kernel=5):0.5
    streaming:0.5              StreamingLLMPress: `sink` first tokens (4) and the most recent ones
    knorm:0.75                 KnormPress: keeps the keys of smallest norm
    keydiff:0.5                KeyDiffPress: keeps the keys least like the mean key
    chunk(knorm,8):0.75        ChunkPress: the inner press applied to each chunk [i, i+8) of the cache on its own
    chunkkv(snapkv,8):0.5      ChunkKVPress: chunk score = mean score of its tokens; whole top chunks kept

Every prompt is run as kvpress's own pipeline runs a context and a question: the context (the prompt up to
its question) is prefilled under the press and compressed, then the question is processed after it,
uncompressed, with position ids continuing from the context's original length. The question is the
demonstrations and the target key for the lookup and the needle test (with the marker, if any); the last
token (the query) for the filler sweep. kvpress does the compressing (`with press(model): ...`); this module
parses specs, sizes windows to the context, checks that a context is long enough, and keeps prompts apart:
a press whose choice depends on its batch-mates (ChunkKVPress keeps the chunks the first prompt of a batch
picks, for every prompt in it) runs one prompt per forward pass; the others are proven batch-independent by
the tests (`make test-kvpress`).

kvpress pins transformers < 5.3 while phasekv pins 5.24 (DeepSeek-V4), so the presses run in their own
environment (`make kvpress-venv`); the spec parser needs no kvpress and runs anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from types import SimpleNamespace

import torch

from phasekv.errors import ConfigError
from phasekv.eval.models import EvalModel, score

DEFAULT_WINDOW = 64  # kvpress's SnapKV window (queries), sized for contexts of thousands of tokens
WINDOW_SHARE = 8  # a scaled window is at most 1/8 of the span the press scores
WINDOW_RULE = (f"SnapKV's window: kvpress's {DEFAULT_WINDOW} queries, or the largest power of two at most 1/"
               f"{WINDOW_SHARE} of the span it scores where that is smaller (scaled_window)")


@dataclass(frozen=True)
class PressKind:
    """One kvpress press a spec can name."""

    cls: str  # the kvpress class
    options: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # spec keyword -> (kvpress field,
    #   default; None: scaled to the context, `scaled_window`)
    wrapper: bool = False  # takes a scoring press and a chunk length: name(press, chunk)
    batch_independent: bool = True  # each prompt's kept positions depend on that prompt only
    needs: str | None = None  # the option a scored span must be longer than (the press asserts it)


KINDS = {
    "snapkv": PressKind("SnapKVPress", {"window": ("window_size", None), "kernel": ("kernel_size", 5)},
                        needs="window"),
    "streaming": PressKind("StreamingLLMPress", {"sink": ("n_sink", 4)}, needs="sink"),
    "knorm": PressKind("KnormPress"),
    "keydiff": PressKind("KeyDiffPress"),
    "chunk": PressKind("ChunkPress", wrapper=True),
    "chunkkv": PressKind("ChunkKVPress", wrapper=True, batch_independent=False),  # its chunks: the batch's first
}
SPEC_HELP = ("kvpress press and compression ratio: snapkv:0.5, streaming:0.5, knorm:0.5, keydiff:0.5, "
             "chunk(knorm,8):0.75, chunkkv(snapkv,8):0.5; options: snapkv(window=8,kernel=5), streaming(sink=4)")


@dataclass(frozen=True)
class PressSpec:
    """A parsed press spec. The outer press carries the ratio; a wrapper's inner press carries none."""

    name: str  # a key of KINDS
    options: tuple[tuple[str, int], ...] = ()  # given options (spec keyword, value), as written
    inner: PressSpec | None = None  # a wrapper's scoring press
    chunk: int | None = None  # a wrapper's chunk length (the grid it lays from cache index 0)
    ratio: float | None = None  # compression ratio in [0, 1): share of the context's KV pairs dropped

    @property
    def kind(self) -> PressKind:
        return KINDS[self.name]

    @property
    def batch_independent(self) -> bool:
        return self.kind.batch_independent and (self.inner is None or self.inner.batch_independent)

    def text(self) -> str:
        """The canonical spec: chunkkv(snapkv,8):0.5."""
        args = ([self.inner.text()] if self.inner else []) + ([str(self.chunk)] if self.chunk else []) + [
            f"{k}={v}" for k, v in self.options]
        head = self.name + (f"({','.join(args)})" if args else "")
        return head if self.ratio is None else f"{head}:{self.ratio:g}"

    def arguments(self, span: int) -> dict:
        """The kvpress class and arguments this spec builds for a context of `span` tokens (JSON): options not
        given take kvpress's defaults, windows scaled to the span the press scores (a wrapper's chunk for
        ChunkPress). Raises ConfigError where a scored span is not longer than a window or the sink."""
        if self.kind.wrapper:  # the ratio is the inner press's (the wrapper reads and sets it there)
            inner = replace(self.inner, ratio=self.ratio).arguments(self.chunk if self.name == "chunk" else span)
            return {"class": self.kind.cls, "chunk_length": self.chunk, "press": inner}
        given = dict(self.options)
        args = {"class": self.kind.cls}
        for key, (name, default) in self.kind.options.items():
            args[name] = given.get(key, scaled_window(span) if default is None else default)
        if self.ratio is not None:
            args["compression_ratio"] = self.ratio
        return args

    def check_span(self, context: int) -> None:
        """ConfigError in one line unless every span the press scores in a context of `context` tokens is
        longer than its window or sink (kvpress asserts it mid-forward)."""
        spans = [context]
        if self.name == "chunk":  # each chunk scored alone: the full ones and the remainder
            spans = sorted({min(self.chunk, context), context % self.chunk} - {0})
        press = self.inner if self.kind.wrapper else self
        need = press.kind.needs
        if need is None:
            return
        field_name = press.kind.options[need][0]
        for span in spans:
            value = press.arguments(span)[field_name]
            if span <= value:
                tokens = f"{span} token{'s' * (span != 1)}"
                where = f"a chunk of {tokens}" if span != context else f"a context of {tokens}"
                raise ConfigError(f"press {self.text()}: {where} is not longer than {press.kind.cls}'s {need} "
                                  f"({field_name}={value}); choose a smaller {need} or a longer context")


def scaled_window(span: int) -> int:
    """SnapKV's observation window for a scored span: kvpress's 64 queries where the span has 512 tokens or
    more, else the largest power of two at most span / 8 (8 for the demo's 81-token lookup context), at
    least 1."""
    w = 1
    while w * 2 <= min(DEFAULT_WINDOW, span // WINDOW_SHARE):
        w *= 2
    return w


# ---------------------------------------------------------------- parsing

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?|\.\d+)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<sym>[(),=:]))")


def parse_press(spec: str) -> PressSpec:
    """A press spec (`SPEC_HELP`) as a PressSpec; ConfigError in one line naming what is wrong."""
    tokens, pos = [], 0
    text = spec.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ConfigError(f"press {spec!r}: unexpected {text[pos:]!r} ({SPEC_HELP})")
        tokens.append(m.group("num") or m.group("name") or m.group("sym"))
        pos = m.end()
    parser = _Parser(spec, tokens)
    press = parser.press()
    parser.expect(":", "a ratio after ':' (snapkv:0.5)")
    ratio = parser.number("the compression ratio")
    if parser.tokens:
        raise ConfigError(f"press {spec!r}: unexpected {' '.join(parser.tokens)!r} after the ratio")
    if not 0 <= ratio < 1:
        raise ConfigError(f"press {spec!r}: the compression ratio must be in [0, 1), got {ratio:g}")
    return replace(press, ratio=ratio)


class _Parser:
    """Recursive descent over tokens: press := NAME ['(' arg {',' arg} ')']; arg := press | INT | KEY '=' INT."""

    def __init__(self, spec: str, tokens: list[str]):
        self.spec, self.tokens = spec, tokens

    def fail(self, what: str):
        raise ConfigError(f"press {self.spec!r}: {what} ({SPEC_HELP})")

    def peek(self) -> str | None:
        return self.tokens[0] if self.tokens else None

    def take(self) -> str:
        if not self.tokens:
            self.fail("the spec ends too early")
        return self.tokens.pop(0)

    def expect(self, sym: str, what: str) -> None:
        if self.take() != sym:
            self.fail(f"expected {what}")

    def number(self, what: str) -> float:
        tok = self.take()
        try:
            return float(tok)
        except ValueError:
            self.fail(f"{what} must be a number, got {tok!r}")

    def integer(self, what: str) -> int:
        tok = self.take()
        if not tok.isdigit() or int(tok) < 1:
            self.fail(f"{what} must be a whole number >= 1, got {tok!r}")
        return int(tok)

    def press(self) -> PressSpec:
        name = self.take().lower()
        if name not in KINDS:
            self.fail(f"unknown press {name!r} (known: {', '.join(KINDS)})")
        kind = KINDS[name]
        args: list = []
        options: list[tuple[str, int]] = []
        if self.peek() == "(":
            self.take()
            while True:
                if (self.peek() or "").lower() in KINDS:
                    args.append(self.press())
                elif len(self.tokens) > 1 and self.tokens[1] == "=":
                    key = self.take().lower()
                    self.take()
                    if key not in kind.options:
                        known = ", ".join(kind.options) or "none"
                        self.fail(f"{name} has no option {key!r} (its options: {known})")
                    options.append((key, self.integer(f"{name}'s {key}")))
                elif self.peek() and self.peek().isdigit():
                    args.append(self.integer(f"{name}'s chunk length"))
                else:
                    self.fail(f"unexpected {self.peek()!r} in {name}(...)")
                sep = self.take()
                if sep == ")":
                    break
                if sep != ",":
                    self.fail(f"expected ',' or ')' in {name}(...), got {sep!r}")
        if not kind.wrapper:
            if args:
                self.fail(f"{name} takes only key=value options, got {args[0]!r}")
            return PressSpec(name, tuple(options))
        if len(args) != 2 or not isinstance(args[0], PressSpec) or not isinstance(args[1], int):
            self.fail(f"{name} takes a scoring press and a chunk length: {name}(knorm,8)")
        inner = args[0]
        if inner.kind.wrapper:
            self.fail(f"{name} wraps a scoring press ({', '.join(k for k, v in KINDS.items() if not v.wrapper)}), "
                      f"not {inner.name}")
        return PressSpec(name, (), inner=inner, chunk=args[1])


# ---------------------------------------------------------------- running a press (the kvpress environment)


def build_press(args: dict):
    """The kvpress press of `PressSpec.arguments`."""
    try:
        import kvpress
    except ImportError:
        raise ConfigError("--press needs NVIDIA's kvpress, which pins transformers < 5.3: run it in its own "
                          "environment (make kvpress-venv; then .kvpress-venv/bin/phasekv ...)") from None
    args = dict(args)
    cls = getattr(kvpress, args.pop("class"))
    if "press" in args:
        args["press"] = build_press(args["press"])
    return cls(**args)


def prefill(model: torch.nn.Module, press, context: torch.Tensor):
    """The context (B, T) prefilled under the press (None: uncompressed), as kvpress's pipeline does it (the
    model without its LM head); returns the compressed cache."""
    from contextlib import nullcontext

    from transformers import DynamicCache

    cache = DynamicCache()
    with press(model) if press is not None else nullcontext():
        model.model(input_ids=context, past_key_values=cache)
    return cache


def question_logits(model: torch.nn.Module, cache, question: torch.Tensor, context_len: int,
                    logits_to_keep: int = 1) -> torch.Tensor:
    """Logits (B, logits_to_keep or q, V) of the question (B, q) after a (compressed) cache, its position ids
    continuing from the original context length; the cache is cut back to its length before the call."""
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    if len(set(lengths)) > 1:  # transformers masks every layer by the first layer's cache length
        raise ConfigError(f"the press kept {min(lengths)} and {max(lengths)} context tokens in different layers, "
                          "which transformers cannot attend over (ChunkKV keeps a partial last chunk in some layers "
                          "only): choose a chunk length that divides the context")
    pos = torch.arange(context_len, context_len + question.shape[1], device=question.device)  # (q,)
    out = model(input_ids=question, past_key_values=cache, position_ids=pos.expand(question.shape[0], -1),
                logits_to_keep=logits_to_keep)
    for layer, n in zip(cache.layers, lengths, strict=True):
        layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]
    return out.logits.float()


def kept_positions(model: torch.nn.Module, context: torch.Tensor, cache) -> list[torch.Tensor]:
    """Per layer, the context positions a compressed cache kept, (B, n_kv, kept) sorted: each kept key found
    among the uncompressed prefill's keys (a press copies the keys it keeps, and compressing a layer's cache
    after its attention leaves the next layers' inputs unchanged)."""
    full = prefill(model, None, context)
    out = []
    for layer, ref in zip(cache.layers, full.layers, strict=True):
        kept, keys = layer.keys, ref.keys  # (B, n_kv, kept, d), (B, n_kv, T, d)
        same = (kept[:, :, :, None, :] == keys[:, :, None, :, :]).all(-1)  # (B, n_kv, kept, T)
        if not bool((same.sum(-1) == 1).all()):
            raise ConfigError("a kept key matches no single context position")
        out.append(same.float().argmax(-1).sort(-1).values)  # (B, n_kv, kept)
    return out


class Pressed(torch.nn.Module):
    """A causal LM whose forward runs each prompt as context under the press + question: what `score`
    (`phasekv.eval.models.score`) calls. Records the cache sizes it achieved."""

    def __init__(self, lm: torch.nn.Module, spec: PressSpec, question: int, context: int):
        super().__init__()
        spec.check_span(context)
        self.lm, self.spec, self.question, self.context = lm, spec, question, context
        self.arguments = spec.arguments(context)
        self.press = build_press(self.arguments)
        self.kept: dict[int, list[int]] = {}  # layer -> kept tokens per prompt seen

    @property
    def config(self):
        return self.lm.config

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 1):
        """input_ids (B, T): the context T - question, then the question; returns .logits (B, keep, V)."""
        n = self.context
        if input_ids.shape[1] != n + self.question:
            raise ConfigError(f"prompts of {input_ids.shape[1]} tokens, expected {n + self.question}")
        cache = self.compress(input_ids[:, :n])
        return SimpleNamespace(logits=question_logits(self.lm, cache, input_ids[:, n:], n, logits_to_keep))

    @torch.no_grad()
    def compress(self, context: torch.Tensor):
        """The context (B, T) prefilled under the press: the compressed cache (its sizes recorded)."""
        cache = prefill(self.lm, self.press, context)
        for i, layer in enumerate(cache.layers):
            self.kept.setdefault(i, []).extend([layer.keys.shape[2]] * context.shape[0])
        return cache

    def cache_size(self) -> dict:
        """The cache the press achieved: context tokens, kept tokens per layer (min, max over prompts) and the
        achieved ratio (share of context KV pairs dropped, over all layers and prompts)."""
        kept = {i: (min(v), max(v)) for i, v in self.kept.items() if v}
        total = sum(sum(v) for v in self.kept.values())
        count = sum(len(v) for v in self.kept.values())
        return {"context": self.context, "question": self.question,
                "kept_per_layer": [list(kept[i]) for i in sorted(kept)],
                "achieved_ratio": round(1 - total / (count * self.context), 4) if count else None}


@dataclass
class PressModel(EvalModel):
    """A Hugging Face model under a kvpress press as an EvalModel (`with_press`): every evaluation, the audit
    and the sweep take it like any model; its name names the press beside the model, its stride is the
    press's chunk length (the grid the periodicity tests look for), and `info["press"]` (in every summary)
    holds the spec, the kvpress arguments and the cache it achieved."""

    spec: PressSpec | None = None

    def _pressed(self, question: int, context: int) -> Pressed:
        pressed = Pressed(self.model, self.spec, question, context)
        self.info["press"] = {**self.info["press"], "arguments": pressed.arguments}
        return pressed

    def score(self, prompts: Iterable, protocol: str, batch_size: int = 32) -> Iterator[list[dict]]:
        """Rows of scored prompts (`phasekv.eval.models.score` through `Pressed`), one prompt per forward for a
        press that reads its batch-mates."""
        it = iter(prompts)
        first = next(it, None)
        if first is None:
            return
        pressed = self._pressed(first.question, len(first.ids) - first.question)
        batch = batch_size if self.spec.batch_independent else 1
        self.info["press"]["batch_size"] = batch
        yield from score(pressed, self.tok, chain([first], it), protocol, batch)
        self.info["press"]["cache"] = pressed.cache_size()

    @torch.no_grad()
    def candidate_logprobs(self, ids: list[int], cands: list[list[int]]) -> list[float]:
        """log P(candidate | ids): ids but its last token prefilled under the press, then the last token and
        each candidate (teacher-forced beyond its first token) uncompressed after it."""
        pressed = self._pressed(1, len(ids) - 1)
        x = torch.tensor([ids], device=self.device)  # (1, T)
        cache = prefill(self.model, pressed.press, x[:, :-1])
        out = []
        for c in cands:
            q = torch.tensor([ids[-1:] + c[:-1]], device=self.device)  # (1, len(c))
            lps = torch.log_softmax(question_logits(self.model, cache, q, len(ids) - 1, 0)[0], -1)  # (len(c), V)
            out.append(float(lps.gather(1, torch.tensor(c, device=self.device)[:, None]).sum()))
        self.info["press"]["cache"] = {"context": len(ids) - 1, "question": 1,
                                       "kept_per_layer": [[layer.keys.shape[2]] * 2 for layer in cache.layers]}
        return out


def with_press(em: EvalModel, spec: str | PressSpec) -> PressModel:
    """`em` (a Hugging Face causal LM in process) evaluated under the press `spec` (`parse_press`)."""
    spec = parse_press(spec) if isinstance(spec, str) else spec
    if em.kind != "hf":
        raise ConfigError(f"--press needs a Hugging Face model in process (kvpress hooks transformers' attention), "
                          f"not a {em.kind} model: export a phasekv run with `phasekv export`")
    text = spec.text()
    info = {**em.info, "press": {"spec": text, "class": spec.kind.cls, "batch_independent": spec.batch_independent,
                                 "window_rule": WINDOW_RULE}}
    if spec.chunk:
        info["ratios"] = [{"ratio": spec.chunk, "layer_types": [f"{text} chunks (every layer)"]}]
    return PressModel(em.model, em.tok, f"{em.name} · {text}", em.kind, spec.chunk or em.stride, info, spec=spec)
