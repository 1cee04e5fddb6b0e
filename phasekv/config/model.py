"""Model configuration: a Qwen3-shaped backbone plus the compression attributes of the study (docs: Model names)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from phasekv.config.names import format_alias, format_name, parse_name
from phasekv.errors import ConfigError

CONFIG_VERSION = 1
GATES = ("scalar", "vector", "uniform")
COMPRESSORS = ("paper", "v4")  # the compressor variants' names: the one list (attention.compressor keys its classes by it)
COMPRESSION_FIELDS = ("gate", "tied_kv", "gate_bias", "local_window", "post_norm", "stagger", "coverage_reg",
                      "compressor", "attention_sink", "shared_payload", "head_stagger", "grid_jitter",
                      "phase_bands", "layer_bands")  # attributes full attention does not have
FAMILIES = ("nsa", "moba", "beacon")  # the grid family's designs: the one list (attention.family keys its classes by it)
FAMILY_FIELDS = {  # the fields each design uses (all >= 1, except the flag); every other family field stays at its default
    "nsa": ("block", "block_stride", "select_block", "top_k", "sliding_window", "forced_blocks"),
    "moba": ("block", "top_k"),
    "beacon": ("beacon_ratio", "beacon_window"),
}
FAMILY_GRIDS = {  # each design's grid periods: {name in its paper: field}; the strides its periodicity tests use
    "nsa": {"d": "block_stride", "l'": "select_block"},
    "moba": {"B": "block"},
    "beacon": {"r": "beacon_ratio", "w": "beacon_window"},
}

# Backbones. Compression attributes and the KV-head count come from the model name, not the preset.
PRESETS: dict[str, dict] = {
    # tiny and small: untied embeddings and fan-in init (see `init_std`); Qwen3's own 0.02 and tied embeddings
    # leave these widths on a chance-level plateau of associative recall for thousands of steps
    "tiny": dict(n_layers=2, d_model=64, n_heads=4, head_dim=32, d_ff=192, rope_theta=1e4, vocab_size=512,
                 tie_embeddings=False),
    # the study's regime at CPU scale: tiny with 4 layers (one compressed entry per record for W8/S8 · 1 KV, where
    # tiny's 2 layers have half one: all-or-nothing phases) and 8 query heads (the grid's 8-KV-head runs)
    "cpu-study": dict(n_layers=4, d_model=64, n_heads=8, head_dim=32, d_ff=192, rope_theta=1e4, vocab_size=512,
                      tie_embeddings=False),
    # tiny with 8 query heads: the smallest backbone on which every run of the study's grid is valid (8 KV heads
    # need >= 8 query heads); `phasekv study`'s default
    "tiny-8h": dict(n_layers=2, d_model=64, n_heads=8, head_dim=32, d_ff=192, rope_theta=1e4, vocab_size=512,
                    tie_embeddings=False),
    "small": dict(n_layers=4, d_model=256, n_heads=8, head_dim=32, d_ff=768, rope_theta=1e4, vocab_size=8192,
                  tie_embeddings=False),
    "qwen3-0.6b": dict(
        n_layers=28, d_model=1024, n_heads=16, head_dim=128, d_ff=3072, rope_theta=1e6, vocab_size=151936,
        init_std=0.02,
    ),
}


BACKBONE_FIELDS = ("n_layers", "d_model", "n_heads", "head_dim", "d_ff", "rope_theta", "norm_eps", "tie_embeddings",
                   "init_std")  # what `--set` may override in a preset (the vocabulary comes from the tokenizer)


def preset_fields(preset: str) -> dict:
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}")
    return {**PRESETS[preset], "preset": preset}


def entries_per_record(n_layers: int, n_kv_heads: int, stride: int, tokens_per_record: int = 2) -> float:
    """Compressed entries a model can spend on each record of a dense prompt: layers x KV heads x tokens per
    record / S (one entry holds about one record). Below 1 some records cannot have an entry of their own and a
    W = S model keeps some offsets and loses the rest (all-or-nothing phases); the study's W8/S8 · 1 KV has 7."""
    return n_layers * n_kv_heads * tokens_per_record / stride


def parse_overrides(value: str | dict | None, source: str = "--set") -> dict:
    """Backbone overrides of a preset, from `'n_layers=4,d_model=96'` (command line) or a mapping (sweep file,
    run config): {field: value}, each a backbone field with a value of its type (`none` for init_std)."""
    if not value:
        return {}
    if isinstance(value, str):
        pairs = [p.strip().partition("=") for p in value.split(",") if p.strip()]
        bad = next((k + s + v for k, s, v in pairs if not s or not k.strip() or not v.strip()), None)
        if bad is not None:
            raise ConfigError(f"{source}: expected field=value pairs like 'n_layers=4,d_model=96', got {bad!r}")
        value = {k.strip(): v.strip() for k, _, v in pairs}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: expected field=value pairs or a table, got {value!r}")
    out = {}
    for key, raw in value.items():
        if key not in BACKBONE_FIELDS:
            raise ConfigError(f"{source}: {key!r} is not a backbone field (known: {', '.join(BACKBONE_FIELDS)}; "
                              "compression attributes, KV heads and seed come from the model name)")
        out[key] = _typed(key, raw, source)
    return out


def format_overrides(overrides: dict) -> str:
    """{field: value} as `parse_overrides` reads it back: 'n_layers=4,d_model=96'."""
    return ",".join(f"{k}={v}" for k, v in overrides.items())


def _typed(key: str, raw, source: str):
    """`raw` (a string from the command line, or a TOML/JSON value) as the type of ModelConfig field `key`."""
    kind = ModelConfig.__dataclass_fields__[key].type  # "int", "float", "bool" or "float | None"
    text = str(raw).strip().lower()
    if kind == "bool":
        if isinstance(raw, bool) or text in ("true", "false"):
            return raw if isinstance(raw, bool) else text == "true"
    elif kind.endswith("| None") and (raw is None or text == "none"):
        return None
    elif not isinstance(raw, bool):
        try:
            return (float if kind.startswith("float") else int)(str(raw).strip())  # "4.0" is not an int
        except ValueError:
            pass
    raise ConfigError(f"{source}: {key}={raw!r} is not a valid {kind.removesuffix(' | None')}")


def _family_fields() -> tuple[str, ...]:
    """Every design's fields, once each, in declaration order."""
    return tuple(dict.fromkeys(f for fields in FAMILY_FIELDS.values() for f in fields))


@dataclass
class ModelConfig:
    """Everything that builds a `PhaseLM`: a Qwen3-shaped backbone (from a preset), the compression attributes
    its name states and the seed. Build it from a name, `ModelConfig.from_name("W8/S8 · 1 KV · no RoPE",
    preset="tiny")`, rather than field by field; `name` and `alias` print it back, `to_dict`/`from_dict` are the
    run directory's `config.json`. A field left at its default is not part of the name (docs: Model names).
    """

    # --- backbone (Qwen3 shape) ---
    vocab_size: int = 512  # token ids 0..vocab_size-1 (commands set it from the tokenizer)
    n_layers: int = 2  # transformer blocks
    d_model: int = 64  # residual width
    n_heads: int = 4  # query heads
    n_kv_heads: int = 1  # KV heads; must divide n_heads (GQA)
    head_dim: int = 32  # independent of d_model, as in Qwen3
    d_ff: int = 192  # SwiGLU hidden width
    rope_theta: float = 1e4  # RoPE base frequency (Qwen3-0.6B: 1e6)
    norm_eps: float = 1e-6  # RMSNorm epsilon
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix (tiny, cpu-study, tiny-8h, small: False)
    init_std: float | None = None  # std of every weight matrix at init; None: torch's nn.Linear variance 1/(3 fan_in),
    #                                token embeddings N(0, 1) (untied) or N(0, 1/d_model) (tied); 0.02 = Qwen3's
    max_seq_len: int = 131072  # longest sequence the model is used at (prompts beyond it are an error)
    preset: str = "custom"  # the backbone preset the fields came from (tiny, cpu-study, ...); "custom" when none
    # --- compression (window = 0 means full attention) ---
    window: int = 0  # W: tokens per compressed entry
    stride: int = 0  # S: distance between window starts, 1 <= S <= W
    gate: str = "scalar"  # scalar | vector (one score per channel) | uniform (alpha = 1/W, no gate parameters)
    tied_kv: bool = False  # values reuse the normalised, rotated keys (no value branch, no v_proj)
    gate_bias: bool = True  # per-offset gate bias b_i
    qk_norm: bool = True  # per-head RMSNorm on queries and keys (before RoPE)
    rope_dims: int | None = None  # None: RoPE on all head dims; 0: no RoPE; r: the first r dims
    local_window: int | None = 16  # exact recent tokens; None: uncompressed tail (current incomplete window only)
    post_norm: bool = False  # RMSNorm on each compressed entry after the payload projection
    stagger: bool = False  # staggered windows: each layer starts its window grid at a different phase
    coverage_reg: float = 0.0  # coverage regulariser weight (training only, like the seed; phasekv.train.coverage)
    compressor: str = "paper"  # paper: own Z_i, b_i, C_i per offset | v4: DeepSeek-V4's (shared projections, slot bias)
    attention_sink: bool = False  # a learned per-head logit in the joint softmax (DeepSeek-V4's sink)
    shared_payload: bool = False  # one payload C for every window offset (paper compressor; gates stay per offset)
    head_stagger: bool = False  # staggered heads: KV head h's windows start (h S) // n_kv tokens earlier than the
    #                             layer's grid (entries still become visible on the layer's schedule)
    grid_jitter: bool = False  # training only: every sequence's windows start a random 0..S-1 tokens earlier
    phase_bands: bool = False  # KV head h's key gate reads only the offsets i whose phase (i mod S) is in its band,
    #                            (i mod S) n_kv // S = h: the heads' key phases are disjoint and cover every phase
    layer_bands: bool = False  # phase bands over every (layer, KV head) of the model: slot l n_kv + h of L n_kv owns
    #                            the phases with (i mod S) L n_kv // S = l n_kv + h (each slot about S / (L n_kv))
    # --- the grid family beyond the study (family = None: full attention or the study's compressors) ---
    family: str | None = None  # None | nsa (Native Sparse Attention) | moba (Mixture of Block Attention) | beacon
    block: int = 0  # NSA: compressed block l; MoBA: block B (tokens per block, from position 0)
    block_stride: int = 0  # NSA: compression stride d (a compressed block every d tokens; d divides l)
    select_block: int = 0  # NSA: selection block l'
    top_k: int = 0  # NSA: selected blocks n; MoBA: blocks each query attends to (its own block counted)
    sliding_window: int = 0  # NSA: exact recent tokens w of the sliding branch
    forced_blocks: bool = False  # NSA: the initial and two local selection blocks always selected (counted in n)
    beacon_ratio: int = 0  # Activation Beacon: r, one beacon token after every r raw tokens
    beacon_window: int = 0  # Activation Beacon: w, raw tokens per window (their KV leaves the cache when it completes)
    seed: int = 42  # part of the model's name (the study's seeds 42-45)

    def __post_init__(self) -> None:
        self.validate()

    def __str__(self) -> str:
        return self.name

    # ---- derived ----
    @property
    def compressed(self) -> bool:
        return self.window > 0

    @property
    def grids(self) -> dict[str, int]:
        """The grid periods a periodicity test checks: {"S": stride} for a compressor, a family design's own
        ({"B": 16} for MoBA B16), {} for full attention."""
        if self.family is not None:
            return {name: getattr(self, f) for name, f in FAMILY_GRIDS[self.family].items()}
        return {"S": self.stride} if self.compressed else {}

    @property
    def rope_rotary_dims(self) -> int:
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def name(self) -> str:
        return format_name(self)

    @property
    def alias(self) -> str:
        return format_alias(self)

    @property
    def entries_per_record(self) -> float | None:
        """`entries_per_record` of this model on records of 2 tokens (key, name); None for full attention."""
        return entries_per_record(self.n_layers, self.n_kv_heads, self.stride) if self.compressed else None

    @property
    def backbone(self) -> str:
        """The preset and the backbone fields that differ from it: 'tiny', 'tiny · n_layers=4,d_model=96'."""
        if self.preset not in PRESETS:
            return self.preset
        base = {f: ModelConfig.__dataclass_fields__[f].default for f in BACKBONE_FIELDS} | PRESETS[self.preset]
        changed = {k: getattr(self, k) for k in BACKBONE_FIELDS if getattr(self, k) != base[k]}
        return self.preset + (f" · {format_overrides(changed)}" if changed else "")

    def grid_offset(self, layer: int) -> int:
        """Phase at which `layer` starts its window grid (0 unless staggered windows)."""
        if not (self.compressed and self.stagger):
            return 0
        return (layer * self.stride) // self.n_layers

    def head_delay(self, head: int) -> int:
        """Tokens by which KV head `head`'s windows start before its layer's grid (0 unless staggered heads)."""
        if not (self.compressed and self.head_stagger):
            return 0
        return (head * self.stride) // self.n_kv_heads

    # ---- construction ----
    @classmethod
    def from_name(cls, name: str, preset: str = "tiny", vocab_size: int | None = None, **overrides) -> ModelConfig:
        """Config from a paper name (`W8/S8 · 1 KV · no RoPE`) or ASCII alias (`w8s8-1kv-norope`)."""
        fields = preset_fields(preset)
        fields.update(parse_name(name))
        if vocab_size is not None:
            fields["vocab_size"] = vocab_size
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def full_attention(self) -> ModelConfig:
        """Full attention on the same backbone, KV heads and seed (every compression and family attribute at its
        default)."""
        defaults = ModelConfig.__dataclass_fields__
        fields = COMPRESSION_FIELDS + ("family",) + _family_fields()
        return self.replace(window=0, stride=0, **{f: defaults[f].default for f in fields})

    def to_dict(self) -> dict:
        return {"config_version": CONFIG_VERSION, "name": self.name, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> ModelConfig:
        d = dict(d)
        version = d.pop("config_version", None)
        if version != CONFIG_VERSION:
            raise ConfigError(f"{source}: config_version {version!r} is not supported (expected {CONFIG_VERSION})")
        d.pop("name", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown config field(s) {', '.join(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    # ---- validation: every error names the field and the value ----
    def validate(self) -> None:
        def bad(field: str, why: str) -> None:
            raise ConfigError(f"invalid config: {field}={getattr(self, field)!r}: {why}")

        for f in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f, "must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            bad("n_kv_heads", f"must divide n_heads={self.n_heads}")
        if not self.rope_theta > 0:
            bad("rope_theta", "must be positive")
        if not self.norm_eps > 0:
            bad("norm_eps", "must be positive")
        if self.init_std is not None and not self.init_std > 0:
            bad("init_std", "must be positive (or None for fan-in scaling)")
        if self.rope_dims is not None:
            if not isinstance(self.rope_dims, int) or self.rope_dims < 0 or self.rope_dims > self.head_dim:
                bad("rope_dims", f"must be in [0, head_dim={self.head_dim}]")
            if self.rope_dims % 2:
                bad("rope_dims", "must be even (RoPE rotates pairs of dims)")
        elif self.head_dim % 2:
            bad("head_dim", "must be even for RoPE on all dims")
        if self.window < 0:
            bad("window", "must be >= 0 (0 = full attention)")
        self._validate_family(bad)
        if not self.compressed:
            if self.stride:
                bad("stride", "must be 0 for full attention (window=0)")
            defaults = ModelConfig.__dataclass_fields__
            for f in COMPRESSION_FIELDS:
                if getattr(self, f) != defaults[f].default:
                    bad(f, "is a compression attribute; full attention (window=0) has none")
            return
        if not 1 <= self.stride <= self.window:
            bad("stride", f"must satisfy 1 <= S <= W={self.window}")
        if self.gate not in GATES:
            bad("gate", f"must be one of {', '.join(GATES)}")
        if self.gate == "uniform" and not self.gate_bias:
            bad("gate_bias", "uniform averaging has no gate parameters, so 'no gate bias' does not apply")
        if self.local_window is not None and (not isinstance(self.local_window, int) or self.local_window < 1):
            bad("local_window", "must be >= 1 (or None for the uncompressed tail)")
        if not (isinstance(self.coverage_reg, int | float) and 0 <= self.coverage_reg < float("inf")):
            bad("coverage_reg", "must be a finite number >= 0")
        if self.coverage_reg and self.gate == "uniform":
            bad("coverage_reg", "uniform averaging has no gate preferences to spread")
        if self.compressor not in COMPRESSORS:
            bad("compressor", f"must be one of {', '.join(COMPRESSORS)}")
        if self.compressor == "v4":
            self._validate_v4(bad)
        if self.shared_payload and self.compressor != "paper":
            bad("shared_payload", "the V4 compressor shares its payload projection already")
        if self.head_stagger and self.n_kv_heads < 2:
            bad("head_stagger", "staggered heads need 2 or more KV heads")
        if self.head_stagger and self.local_window is None:
            bad("head_stagger", "a staggered head's entry is visible up to S - 1 tokens after its window ends: "
                "it needs a local window to cover them")
        if self.phase_bands and not 2 <= self.n_kv_heads <= self.stride:
            bad("phase_bands", f"phase bands split the S={self.stride} phases among the KV heads: they need 2..S KV "
                f"heads, got {self.n_kv_heads}")
        if self.layer_bands and (self.phase_bands or self.n_layers * self.n_kv_heads > self.stride):
            bad("layer_bands", f"layer bands split the S={self.stride} phases among the {self.n_layers} x "
                f"{self.n_kv_heads} (layer, KV head) slots: at most S of them, and not with phase bands")
        for f in ("phase_bands", "layer_bands"):
            if getattr(self, f) and (self.gate == "uniform" or self.compressor != "paper"):
                bad(f, "phase bands mask the paper compressor's learned gates (not uniform averaging or V4)")
        if self.grid_jitter and self.local_window is None:
            bad("grid_jitter", "a jittered window's entry is visible up to S - 1 tokens after it ends: "
                "it needs a local window to cover them")

    def _validate_family(self, bad) -> None:
        """A family design uses its own fields (each >= 1) and none of the study's compression attributes."""
        if self.family is not None and self.family not in FAMILIES:
            bad("family", f"must be one of {', '.join(FAMILIES)} (or None)")
        own = FAMILY_FIELDS.get(self.family, ())
        defaults = ModelConfig.__dataclass_fields__
        for f in _family_fields():
            v = getattr(self, f)
            if f not in own:
                if v != defaults[f].default:
                    bad(f, f"is not an attribute of {self.family or 'a model outside the family'}")
            elif not isinstance(v, bool) and (not isinstance(v, int) or v < 1):
                bad(f, "must be a positive integer")
        if self.family is None:
            return
        if self.window:
            bad("window", f"a {self.family} model has no study compressor: window must be 0")
        for f in COMPRESSION_FIELDS:
            if getattr(self, f) != defaults[f].default:
                bad(f, f"is a study compression attribute; a {self.family} model has none")
        if self.family == "nsa":
            if self.block_stride > self.block or self.block % self.block_stride:
                bad("block_stride", f"must divide the compressed block l={self.block}")
            if self.select_block % self.block_stride:
                bad("select_block", f"must be a multiple of the compression stride d={self.block_stride}")
            if self.forced_blocks and self.top_k < 3:
                bad("top_k", "forced blocks (initial + 2 local) count in the top n: it must be >= 3")
        if self.family == "beacon" and self.beacon_window % self.beacon_ratio:
            bad("beacon_window", f"must be a multiple of the beacon ratio r={self.beacon_ratio}")

    def _validate_v4(self, bad) -> None:
        """DeepSeek-V4's compressor: W = S (HCA) or W = 2S (CSA); per-channel gates, K = V, kv_norm are its own."""
        if self.window not in (self.stride, 2 * self.stride):
            bad("window", f"the V4 compressor needs W = S (HCA) or W = 2S (CSA), got S={self.stride}")
        for f, v in (("gate", "vector"), ("tied_kv", True), ("post_norm", True)):
            if getattr(self, f) != v:
                bad(f, f"the V4 compressor implies {f}={v!r}")
