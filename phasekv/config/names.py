"""Paper-style model names (`W8/S8 · 1 KV · no RoPE`) and ASCII aliases (`w8s8-1kv-norope`).

The one place that maps names to config fields and back. Every config prints its name, and
`parse_name(format_name(cfg))` and `parse_name(format_alias(cfg))` give back the same fields. `cfg` is a
`ModelConfig` (or anything with its fields): `phasekv.config.model` imports this module, not the reverse.
"""

from __future__ import annotations

import re
from decimal import Decimal

from phasekv.errors import ConfigError, ModelNameError

SEP = " · "
DEEPSEEK = dict(window=8, stride=4, n_kv_heads=1, gate="vector", tied_kv=True, rope_dims=16, compressor="paper")
V4 = {"compressor": "v4", "gate": "vector", "tied_kv": True, "post_norm": True}  # what "V4 compressor" sets

# attribute: (paper words, ascii token, fields it sets). Order here is the order names print in.
ATTRIBUTES: list[tuple[str, str, dict]] = [
    ("forced blocks", "forced", {"forced_blocks": True}),  # NSA: initial + 2 local selection blocks always selected
    ("V4 compressor", "v4", V4),
    ("no slot bias", "noslotbias", {"gate_bias": False}),  # the V4 compressor's name for no gate bias
    ("vector gates", "vector", {"gate": "vector"}),
    ("uniform averaging", "uniform", {"gate": "uniform"}),
    ("tied K/V", "tied", {"tied_kv": True}),
    ("post-norm", "postnorm", {"post_norm": True}),
    ("no gate bias", "nobias", {"gate_bias": False}),
    ("no Q/K norm", "noqknorm", {"qk_norm": False}),
    ("no RoPE", "norope", {"rope_dims": 0}),
    ("uncompressed tail", "tail", {"local_window": None}),
    ("staggered windows", "stagger", {"stagger": True}),
    ("attention sink", "sink", {"attention_sink": True}),
    ("shared payload", "sharedpayload", {"shared_payload": True}),
    ("staggered heads", "hstagger", {"head_stagger": True}),
    ("grid jitter", "jitter", {"grid_jitter": True}),
    ("phase bands", "bands", {"phase_bands": True}),
    ("layer bands", "lbands", {"layer_bands": True}),
]
# parameterised attributes: paper regex, ascii regex, field
NUMBERED: list[tuple[str, str, str, str, str]] = [
    # (paper format, paper regex, ascii format, ascii regex, field)
    ("RoPE on {} dims", r"rope on (\d+) dims", "rope{}", r"rope(\d+)", "rope_dims"),
    ("local window {}", r"local window (\d+)", "local{}", r"local(\d+)", "local_window"),
    ("seed {}", r"seed (\d+)", "seed{}", r"seed(\d+)", "seed"),
    ("coverage reg {}", r"coverage reg (\d+(?:\.\d+)?)", "cov{}", r"cov(\d+(?:\.\d+)?)", "coverage_reg"),
]
# The grid family's heads: per design, its paper-name parts and alias parts; `{field}` stands for a number. The one
# table both directions read (a part matches its template with each field a run of digits).
FAMILY_HEADS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nsa": (("NSA l{block}/d{block_stride}", "select {select_block} top {top_k}", "window {sliding_window}"),
            ("nsa", "l{block}d{block_stride}", "sel{select_block}k{top_k}", "win{sliding_window}")),
    "moba": (("MoBA B{block} top {top_k}",), ("moba", "b{block}k{top_k}")),
    "beacon": (("Beacon r{beacon_ratio}", "window {beacon_window}"), ("beacon", "r{beacon_ratio}w{beacon_window}")),
}
BIAS_WORDS = {"no gate bias": False, "no slot bias": True}  # which one a name uses: by whether it has a V4 compressor
DEFAULTS = {"gate": "scalar", "tied_kv": False, "post_norm": False, "gate_bias": True, "qk_norm": True,
            "rope_dims": None, "local_window": 16, "stagger": False, "seed": 42,
            "coverage_reg": 0.0}


def _known() -> str:
    words = [a[0] for a in ATTRIBUTES] + [n[0].format("N") for n in NUMBERED] + ["scalar gates", "N KV"]
    return ", ".join(words)


def _err(name: str, part: str) -> ModelNameError:
    return ModelNameError(
        f"cannot parse model name {name!r}: unknown part {part!r}. Names look like 'W8/S8 · 1 KV · no RoPE', "
        f"'Full attention · 8 KV', 'DeepSeek-style kernel', {', '.join(_family_examples())} "
        f"or aliases like 'w8s8-1kv-norope'; "
        f"known attributes: {_known()}"
    )


def _family_examples() -> list[str]:
    example = {"block": 8, "block_stride": 4, "select_block": 8, "top_k": 2, "sliding_window": 16, "beacon_ratio": 8,
               "beacon_window": 32}
    return [repr(SEP.join(p.format(**example) for p in paper) + " · 1 KV") for paper, _ in FAMILY_HEADS.values()]


def _template_re(template: str) -> str:
    """A head template as a regex: each `{field}` a named group of digits, the rest literal (any case)."""
    return re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", re.escape(template.lower()))


def _family_of(parts: list[str], ascii_: bool) -> str | None:
    """The design a name's first part names (`NSA l8/d4`, `moba`), or None."""
    first = parts[0].lower()
    word = first if ascii_ else first.split(" ")[0]
    return next((f for f, (paper, _) in FAMILY_HEADS.items() if paper[0].split(" ")[0].lower() == word), None)


def _parse_family_head(name: str, family: str, parts: list[str], ascii_: bool) -> tuple[dict, list[str]]:
    """The fields a design's head parts name, and the parts after them."""
    paper, alias = FAMILY_HEADS[family]
    templates = alias[1:] if ascii_ else paper
    head = parts[1 : 1 + len(templates)] if ascii_ else parts[: len(templates)]
    fields: dict = {"family": family}
    for i, template in enumerate(templates):
        part = head[i] if i < len(head) else ""
        m = re.fullmatch(_template_re(template), part.strip().lower())
        if not m:
            want = "-".join(alias) if ascii_ else SEP.join(paper)
            raise ModelNameError(f"model name {name!r}: expected {template!r} (a {family} name reads {want!r} "
                                 f"with numbers for the fields), got {part!r}")
        fields.update({k: int(v) for k, v in m.groupdict().items()})
    return fields, parts[(1 if ascii_ else 0) + len(templates):]


def parse_name(name: str) -> dict:
    """Config fields named by a paper name or an ASCII alias."""
    if not isinstance(name, str) or not name.strip():
        raise ModelNameError(f"empty model name {name!r}")
    text = name.strip()
    signed = re.match(r"w(-?\d+)\s*/?\s*s(-?\d+)(?:$|[-\s·])", text.lower())  # a minus would split an alias
    if signed:
        _check_grid(name, int(signed.group(1)), int(signed.group(2)))
    if "·" in text or " " in text or "/" in text:
        parts = [p.strip() for p in re.split(r"\s*·\s*", text)]
        return _parse_parts(name, parts, ascii_=False)
    return _parse_parts(name, text.lower().split("-"), ascii_=True)


def _check_grid(name: str, window: int, stride: int) -> None:
    """A named window and stride are >= 1: full attention has its own name."""
    for field, value in (("window", window), ("stride", stride)):
        if value < 1:
            raise ModelNameError(f"model name {name!r}: {field}={value} must be >= 1; full attention is named "
                                 f"'Full attention · N KV' (alias full-Nkv)")


def _parse_parts(name: str, parts: list[str], ascii_: bool) -> dict:
    if not parts or not parts[0]:
        raise _err(name, "")
    head, rest = parts[0].lower(), parts[1:]
    fields: dict = {}
    family = _family_of(parts, ascii_)
    if family is not None:
        fields, rest = _parse_family_head(name, family, parts, ascii_)
    elif head in ("full attention", "full"):
        fields["window"], fields["stride"] = 0, 0
    elif head in ("deepseek-style kernel", "deepseek"):
        fields.update(DEEPSEEK)
    else:
        m = re.fullmatch(r"w(\d+)\s*/?\s*s(\d+)", head)
        if not m:
            raise _err(name, parts[0])
        fields["window"], fields["stride"] = int(m.group(1)), int(m.group(2))
        _check_grid(name, fields["window"], fields["stride"])
    seen: set[str] = set()
    for part in rest:
        key = part.strip().lower()
        if not key:
            raise _err(name, part)
        if key in seen:
            raise ModelNameError(f"model name {name!r} repeats {part!r}")
        seen.add(key)
        fields.update(_parse_attribute(name, key, part, ascii_))
    if seen & {"no slot bias", "noslotbias"} and fields.get("compressor") != "v4":
        raise ModelNameError(f"model name {name!r}: 'no slot bias' needs the V4 compressor ('· V4 compressor')")
    return fields


def _parse_attribute(name: str, key: str, part: str, ascii_: bool) -> dict:
    m = re.fullmatch(r"(\d+)\s*kv", key)
    if m:
        return {"n_kv_heads": int(m.group(1))}
    if key in (("scalar",) if ascii_ else ("scalar gates",)):
        return {"gate": "scalar"}
    for paper, token, fields in ATTRIBUTES:
        if key == (token if ascii_ else paper.lower()):
            return dict(fields)
    for _pf, paper_re, _af, ascii_re, field in NUMBERED:
        m = re.fullmatch(ascii_re if ascii_ else paper_re, key)
        if m:
            return {field: float(m.group(1)) if "." in m.group(1) else int(m.group(1))}
    raise _err(name, part)


def _attributes(cfg, ascii_: bool) -> list[str]:
    """The non-default attributes of `cfg`, in print order; those its head or the V4 compressor imply are left out."""
    out = []
    deepseek, v4 = _is_deepseek(cfg), cfg.compressor == "v4"
    implied = DEEPSEEK if deepseek else {k: v for k, v in V4.items() if k != "compressor"} if v4 else {}
    if deepseek and cfg.gate == "scalar":
        out.append("scalar" if ascii_ else "scalar gates")
    for paper, token, fields in ATTRIBUTES:
        if fields.items() <= implied.items() or (paper in BIAS_WORDS and BIAS_WORDS[paper] != v4):
            continue
        if all(getattr(cfg, k) == v for k, v in fields.items()):
            out.append(token if ascii_ else paper)
    for paper_fmt, _pr, ascii_fmt, _ar, field in NUMBERED:
        value = getattr(cfg, field)
        skip = value in (None, DEFAULTS[field]) or (field == "rope_dims" and (value == 0 or deepseek))
        if not skip:
            out.append((ascii_fmt if ascii_ else paper_fmt).format(_number(value)))
    return out


def _number(v) -> str:
    """Integers as they are; other numbers in fixed point without trailing zeros (no exponent, no '-')."""
    return str(int(v)) if float(v).is_integer() else format(Decimal(repr(float(v))), "f")


def _is_deepseek(cfg) -> bool:
    shape = dict(DEEPSEEK, gate=cfg.gate if cfg.gate in ("vector", "scalar") else None)
    return all(getattr(cfg, k) == v for k, v in shape.items())


def _head(cfg, ascii_: bool) -> list[str]:
    if _is_deepseek(cfg):
        return ["deepseek"] if ascii_ else ["DeepSeek-style kernel"]
    kv = f"{cfg.n_kv_heads}kv" if ascii_ else f"{cfg.n_kv_heads} KV"
    if cfg.family is not None:
        paper, alias = FAMILY_HEADS[cfg.family]
        return [p.format(**{f: getattr(cfg, f) for f in re.findall(r"\{(\w+)\}", p)}) for p in
                (alias if ascii_ else paper)] + [kv]
    if not cfg.compressed:
        return ["full" if ascii_ else "Full attention", kv]
    return [f"w{cfg.window}s{cfg.stride}" if ascii_ else f"W{cfg.window}/S{cfg.stride}", kv]


def format_name(cfg) -> str:
    """A config's paper name: 'W8/S4 · 1 KV · no RoPE'."""
    return SEP.join(_head(cfg, False) + _attributes(cfg, False))


def format_alias(cfg) -> str:
    """A config's ASCII alias: 'w8s4-1kv-norope'."""
    return "-".join(_head(cfg, True) + _attributes(cfg, True))


# The study's grid (the paper's Figure 2; docs: The study and its claims): 3 full-attention baselines and 23 compressed runs.
PAPER_GRID: list[str] = [
    "Full attention · 1 KV", "Full attention · 4 KV", "Full attention · 8 KV",
    "W8/S8 · 1 KV", "W8/S8 · 1 KV · seed 43", "W8/S8 · 1 KV · seed 44", "W8/S8 · 1 KV · seed 45",
    "W4/S4 · 1 KV", "W8/S4 · 1 KV", "W8/S6 · 1 KV", "W12/S12 · 1 KV",
    "W8/S8 · 2 KV", "W8/S8 · 4 KV", "W8/S8 · 8 KV",
    "W8/S8 · 1 KV · tied K/V", "W8/S8 · 1 KV · uniform averaging",
    "W8/S8 · 1 KV · uniform averaging · tied K/V · post-norm", "W8/S8 · 1 KV · vector gates",
    "W8/S8 · 1 KV · no Q/K norm", "W8/S8 · 1 KV · no gate bias", "W8/S8 · 1 KV · no RoPE",
    "W8/S8 · 1 KV · RoPE on 16 dims", "W8/S8 · 1 KV · uncompressed tail", "W8/S8 · 8 KV · uncompressed tail",
    "DeepSeek-style kernel", "DeepSeek-style kernel · scalar gates",
]



# --- seeds: a model trained at several seeds is one design; its paper name carries `· seed N` (none at the default)
_SEED = next(i for i, n in enumerate(NUMBERED) if n[4] == "seed")
_AFTER_SEED = [re.compile(n[1], re.IGNORECASE) for n in NUMBERED[_SEED + 1:]]  # attributes printed after the seed


def _is_seed(part: str) -> bool:
    return re.fullmatch(NUMBERED[_SEED][1], part.strip(), re.IGNORECASE) is not None


def seed_of(name: str) -> int:
    """The seed a paper name or alias states (the default, 42, when it states none)."""
    return parse_name(name).get("seed", DEFAULTS["seed"])


def unseeded(name: str) -> str:
    """A paper name without its seed part: the design its seeds are replicates of."""
    return SEP.join(p for p in name.split(SEP) if not _is_seed(p))


def at_seed(name: str, seed: int) -> str:
    """The paper name `name` at `seed`, its seed part where `format_name` prints it (none at the default)."""
    parts = unseeded(name).split(SEP)
    if seed == DEFAULTS["seed"]:
        return SEP.join(parts)
    at = next((i for i, p in enumerate(parts) if i and any(r.fullmatch(p.strip()) for r in _AFTER_SEED)), len(parts))
    return SEP.join([*parts[:at], f"seed {seed}", *parts[at:]])


def check_seeds(seeds: list[int]) -> list[int]:
    """`seeds` when they are one or more distinct integers >= 0, else a one-line error."""
    if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ConfigError(f"seeds {', '.join(map(str, seeds)) or '(none)'}: give one or more distinct seeds >= 0")
    return seeds


def at_seeds(models: list[str], seeds: list[int]) -> list[str]:
    """Every design of `models` (paper names; each design once, in order) at each of `seeds`, seed by seed."""
    check_seeds(seeds)
    designs = list(dict.fromkeys(unseeded(m) for m in models))
    return [at_seed(m, s) for s in seeds for m in designs]
