"""Which evaluations `phasekv compare` compares: their summaries, phasekv configs, training runs, the
reference and baseline models, and what distinguishes each model from the baseline (its mitigations)."""

from __future__ import annotations

import json
from pathlib import Path

from phasekv.config import ModelConfig
from phasekv.errors import ConfigError, DataError
from phasekv.eval.protocols import is_retrieval, retrieval_protocols


def find_summary(path: Path, protocol: str | None) -> Path:
    """DIR/summary.json of a retrieval evaluation, or the one retrieval evaluation (of `protocol`) under DIR."""
    path = Path(path)
    if (path / "summary.json").is_file() and _is_eval(path / "summary.json", None):
        return path / "summary.json"
    found = sorted(p for p in path.rglob("summary.json") if _is_eval(p, protocol))
    if not found:
        names = "/".join(p.name for p in retrieval_protocols())
        raise DataError(f"{path}: no {names} evaluation (summary.json from `phasekv eval`)"
                        + (f" with {protocol} padding" if protocol else ""))
    if len(found) > 1:
        raise DataError(f"{path}: {len(found)} evaluations found ({', '.join(str(p.parent) for p in found[:4])}); "
                        "pass the evaluation directory itself")
    return found[0]


def _is_eval(p: Path, protocol: str | None) -> bool:
    try:
        s = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(s, dict) and is_retrieval(s) and (protocol is None or s.get("protocol") == protocol)


def model_config(s: dict) -> ModelConfig | None:
    cfg = s.get("provenance", {}).get("model_info", {}).get("config")
    if not isinstance(cfg, dict) or "config_version" not in cfg:
        return None  # a Hugging Face model: no phasekv config
    return ModelConfig.from_dict(cfg, source="evaluation summary")


def run_info(s: dict) -> tuple[str | None, float | None]:
    """(training run dir, its training tokens/s from done.json) when the model came from `phasekv train`."""
    path = s.get("provenance", {}).get("model_info", {}).get("path")
    if not path:
        return None, None
    done = Path(path) / "done.json"
    if not done.is_file():
        return path, None
    d = json.loads(done.read_text())
    tps = d["tokens"] / d["elapsed_s"] if d.get("elapsed_s") else None
    return path, tps


def mitigations(cfg: ModelConfig | None, k: int, baseline: ModelConfig | None) -> list[str]:
    """Paper words for what distinguishes a model from the baseline's compression."""
    out = []
    if cfg is not None and cfg.compressed:
        if cfg.stagger:
            out.append("staggered windows")
        if cfg.coverage_reg:
            out.append(f"coverage reg {cfg.coverage_reg:g}")
        if cfg.stride < cfg.window:
            out.append("overlapping windows")
        if baseline is not None and cfg.n_kv_heads > baseline.n_kv_heads:
            out.append("more KV heads")
    if k > 1:
        out.append(f"phase ensemble {k}")
    return out


def twin_label(model: str, directory: str) -> str:
    """The label of a model whose name an earlier evaluation already has (one name trained two ways)."""
    return f"{model} ({directory})"


def is_twin(label: str, model: str) -> bool:
    """Whether `label` is `twin_label(model, some directory)`."""
    return label.startswith(f"{model} (") and label.endswith(")")


def pick(name: str | None, flag: str, cfgs: dict, auto, default_name: str | None = None) -> str | None:
    if name is not None:
        matches = [m for m in cfgs if m == name or (cfgs[m] is not None and _same_name(cfgs[m], name)
                                                    and m == cfgs[m].name)]
        if not matches:
            raise ConfigError(f"{flag} {name!r} is not among the compared models: {', '.join(cfgs)}")
        twins = [m for m in cfgs if is_twin(m, matches[0])]
        if twins:
            raise ConfigError(f"{flag} {name!r} names {len(twins) + 1} models: {', '.join([matches[0], *twins])}; "
                              f"name one with its directory in parentheses, as listed")
        return matches[0]
    if default_name is not None:
        return default_name if default_name in cfgs else None
    cands = [m for m, c in cfgs.items() if auto(c)]
    return min(cands, key=lambda m: cfgs[m].n_kv_heads) if cands else None


def _same_name(cfg: ModelConfig, name: str) -> bool:
    try:
        return ModelConfig.from_name(name, preset=cfg.preset, vocab_size=cfg.vocab_size).name == cfg.name
    except Exception:  # noqa: BLE001 - any unparsable name simply does not match
        return False
