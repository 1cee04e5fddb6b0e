"""Core commands: `phasekv info` (what a name builds) and `phasekv smoke` (forward + cached decode)."""

from __future__ import annotations

import time

import torch
import typer
from rich.console import Console
from rich.table import Table

from phasekv import kernels
from phasekv.attention.compressor import layer_grid
from phasekv.config import BACKBONE_FIELDS, PRESETS, ModelConfig, parse_overrides
from phasekv.errors import ConfigError
from phasekv.model.transformer import PhaseLM

console = Console()

ARCH_HELP = "Model name as in the paper ('W8/S8 · 1 KV · no RoPE', 'Full attention · 8 KV') or its alias (w8s8-1kv-norope)."
PRESET_HELP = f"Backbone preset: {', '.join(PRESETS)}."
SET_HELP = f"Overrides of the preset's backbone, e.g. 'n_layers=4,d_model=96' (fields: {', '.join(BACKBONE_FIELDS)})."


def cache_bytes(config: ModelConfig, context: int, batch_size: int = 1) -> int:
    """Bytes a decode cache of this config holds after `context` tokens, computed without running the model."""
    per_token = 2 * batch_size * config.n_kv_heads * config.head_dim * 4  # fp32 K and V of one token, one layer
    if config.family is not None:
        return config.n_layers * family_layer_cache_bytes(config, context, per_token)
    if not config.compressed:
        return config.n_layers * context * per_token
    total = 0
    tied = 1 if config.tied_kv else 2
    G = config.head_dim if config.gate == "vector" else 1
    for layer in range(config.n_layers):
        grid = layer_grid(config, layer)
        entries = grid.n_complete(context)
        in_flight = grid.n_started(context) - entries
        exact = min(context, grid.exact_keep)
        branch_entry = batch_size * config.n_kv_heads * config.head_dim * 4
        partial = batch_size * config.n_kv_heads * (2 * G + config.head_dim) * 4
        total += tied * (entries * branch_entry + in_flight * partial) + exact * per_token * tied // 2
        total += batch_size * max(map(config.head_delay, range(config.n_kv_heads))) * config.d_model * 4  # history
    return total


def family_layer_cache_bytes(config: ModelConfig, context: int, per_token: int) -> int:
    """One layer's decode-cache bytes of a family design after `context` tokens (per_token: one token's K and V).
    MoBA: every token and a mean key per complete block; NSA: every token, the compressed blocks and the
    un-rotated tokens of the block in progress (with its l - d padding); Activation Beacon: w / r beacons per
    complete window, the current window's raw tokens and beacons, and each kept slot's position (int64)."""
    if config.family == "moba":
        return context * per_token + (context // config.block) * per_token // 2
    if config.family == "nsa":
        d = config.block_stride
        return (context + context // d + config.block - d + context % d) * per_token
    r, w = config.beacon_ratio, config.beacon_window
    inside = context % w
    slots = (context // w) * (w // r) + inside + inside // r
    return slots * (per_token + 8)


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        arch: str = typer.Argument(..., help=ARCH_HELP),
        preset: str = typer.Option("tiny", help=PRESET_HELP),
        overrides: str = typer.Option(None, "--set", help=SET_HELP),
        vocab_size: int = typer.Option(None, help="Vocabulary size (default: the preset's)."),
        context: int = typer.Option(32768, help="Context length for the cache-size column."),
    ) -> None:
        """Print a model's canonical name, alias, config, parameter count and decode-cache size."""
        if context < 1:
            raise ConfigError(f"--context {context} must be >= 1")
        cfg = ModelConfig.from_name(arch, preset=preset, vocab_size=vocab_size, **parse_overrides(overrides))
        full = cfg.full_attention()
        table = Table(title=f"{cfg.name}  ({cfg.alias}) · backbone {cfg.backbone}")
        table.add_column("field")
        table.add_column("value")
        for k, v in cfg.to_dict().items():
            table.add_row(k, str(v))
        with torch.device("meta"):
            n_params = PhaseLM(cfg).n_params
        table.add_row("parameters", f"{n_params:,}")
        ours, theirs = cache_bytes(cfg, context), cache_bytes(full, context)
        table.add_row(f"cache bytes @ {context}", f"{ours:,} ({ours / theirs:.4f} of full attention's {theirs:,} "
                                                  f"with {cfg.n_kv_heads} KV heads)")
        if cfg.n_kv_heads > 1:  # against the smallest full-attention cache of the backbone: the one a design replaces
            one = cache_bytes(full.replace(n_kv_heads=1), context)
            table.add_row(f"cache vs 1 KV @ {context}", f"{ours / one:.4f} of {full.replace(n_kv_heads=1).name}'s "
                                                        f"{one:,}")
        console.print(table)

    @app.command()
    def smoke(
        arch: str = typer.Option("W8/S8 · 1 KV", help=ARCH_HELP),
        preset: str = typer.Option("tiny", help=PRESET_HELP),
        tokens: int = typer.Option(256, help="Prompt length."),
        decode: int = typer.Option(64, help="Tokens to decode with the compressed cache."),
        seed: int = typer.Option(0, help="Random seed for weights and tokens."),
    ) -> None:
        """Build a model from a paper name, run a forward pass and a cached decode, and check they agree."""
        if tokens < 1 or decode < 1:
            raise ConfigError(f"--tokens {tokens} and --decode {decode} must be >= 1")
        torch.manual_seed(seed)
        cfg = ModelConfig.from_name(arch, preset=preset)
        model = PhaseLM(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (2, tokens + decode))
        console.print(f"[bold]{cfg.name}[/] ({cfg.alias}) · preset {preset} · {model.n_params:,} parameters")
        t = time.perf_counter()
        fused = kernels.extension() is not None  # a first build, or waiting on another process's, is not the forward's
        console.print(f"fused CPU kernels: {'ready' if fused else 'off (references)'} after "
                      f"{time.perf_counter() - t:.1f} s (load, build or lock wait)")
        with torch.no_grad():
            t = time.perf_counter()
            logits = model(ids)
            fwd = time.perf_counter() - t
            cache = model.new_cache(2)
            model(ids[:, :tokens], cache=cache)
            t = time.perf_counter()
            steps = [model(ids[:, i : i + 1], cache=cache) for i in range(tokens, tokens + decode)]
            dec = time.perf_counter() - t
        diff = (torch.cat(steps, 1) - logits[:, tokens:]).abs().max().item()
        full = cache_bytes(cfg.full_attention(), tokens + decode, 2)
        console.print(f"forward {tokens + decode} tokens: {fwd * 1e3:.1f} ms; decode {decode} steps: "
                      f"{dec / decode * 1e3:.2f} ms/step; max |decode - parallel| = {diff:.2e}")
        console.print(f"cache: {cache.nbytes:,} bytes ({cache.nbytes / full:.3f} of a full-attention cache)")
        if diff > 1e-4:
            raise typer.Exit(1)

