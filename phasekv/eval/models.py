"""Models under evaluation: phasekv checkpoints/run dirs and Hugging Face causal LM dirs (local files).

`EvalModel.last_logits(ids)` returns the next-token logits at the last position only: phasekv models
prefill long prompts chunk by chunk through their decode cache (memory grows with the cache, not T^2),
Hugging Face models are asked for the last position's logits only. `score` and `candidate_logprobs` are the
two ways an evaluation reads a model (retrieval's top-1, the flip test's candidates). A model served by an
inference engine (`phasekv.eval.engine.EngineModel`) scores the same prompts through HTTP requests instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from phasekv.errors import ConfigError
from phasekv.eval.prompts import Prompt
from phasekv.eval.tokens import WordTokenizer
from phasekv.model.hf import EVAL_KEY, compression_layout
from phasekv.train.run import open_model

PREFILL_CHUNK = 4096  # phasekv prompts longer than this are prefilled through the cache in chunks


@dataclass
class EvalModel:
    """A model under evaluation with the tokenizer its prompts are placed with: what every evaluation, analysis,
    audit and mitigation takes. `kind` says whose model it is (a PhaseLM or a transformers causal LM, scored
    alike through `last_logits`), `stride` which period to test for, `info` where it came from (written into
    every summary's provenance). Wrappers such as a phase ensemble replace `model` and keep the rest; a served
    model (`phasekv.eval.engine.EngineModel`, kind "engine") scores through its server instead."""

    model: torch.nn.Module
    tok: WordTokenizer
    name: str  # the paper name for phasekv models, the directory / model type for HF
    kind: str  # "phasekv" | "hf" | "engine" | "lm-eval" (scored by lm-eval elsewhere: a record without weights)
    stride: int | None  # compression stride S (None: full attention or unknown)
    info: dict = field(default_factory=dict)  # provenance: path, config; a phasekv run's recall data and train_len

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> logits at position T-1, (B, V), float32."""
        return last_logits(self.model, ids)

    def score(self, prompts, protocol: str, batch_size: int = 32):
        """Rows of scored prompts, a list per batch (`score` on this model)."""
        return score(self.model, self.tok, prompts, protocol, batch_size)

    def candidate_logprobs(self, ids: list[int], cands: list[list[int]]) -> list[float]:
        """log P(candidate | ids) per candidate (`candidate_logprobs` on this model)."""
        return candidate_logprobs(self.model, ids, cands)


@torch.no_grad()
def last_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits at the last position, (B, V), for a PhaseLM or a transformers causal LM."""
    if hasattr(model, "new_cache"):  # PhaseLM
        if ids.shape[1] <= PREFILL_CHUNK:
            return model(ids, last=True).float()  # (B, V): the last layer and LM head at the last position only
        return Continuation(model, ids.shape[0]).feed(ids)
    try:
        out = model(input_ids=ids, logits_to_keep=1)
    except TypeError:  # older transformers / custom code without logits_to_keep
        out = model(input_ids=ids)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, -1].float()


class Continuation:
    """Sequences continued through a model's decode cache: each `feed` runs tokens (B, T) after those fed before and
    returns the next token's logits (B, V) float32. A PhaseLM keeps its `new_cache` (a long feed goes through it in
    chunks of PREFILL_CHUNK tokens), a transformers model its `cache`."""

    def __init__(self, model: torch.nn.Module, batch: int = 1):
        self.model, self.phaselm = model, hasattr(model, "new_cache")
        self.cache = model.new_cache(batch) if self.phaselm else None

    @torch.no_grad()
    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.phaselm:
            for s in range(0, ids.shape[1], PREFILL_CHUNK):
                out = self.model(ids[:, s : s + PREFILL_CHUNK], cache=self.cache)  # (B, chunk, V)
            return out[:, -1].float()
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
        if out.cache is None:
            raise ConfigError(f"{type(self.model).__name__} returns no decode cache to continue")
        self.cache = out.cache
        return out.logits[:, -1].float()


def greedy(model: torch.nn.Module, ids: list[int]) -> Iterator[int]:
    """The greedy continuation of the prompt `ids`, token by token, through the model's decode cache: the prompt
    costs one prefill, every further token the caller asks for one one-token forward."""
    device = next(model.parameters()).device
    run = Continuation(model)
    logits = run.feed(torch.tensor([ids], device=device))  # (1, V)
    while True:
        token = int(logits[0].argmax())
        yield token
        logits = run.feed(torch.tensor([[token]], device=device))


@torch.no_grad()
def all_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position of ids (B, T), (B, T, V) float32, for a PhaseLM or a transformers causal LM."""
    logits = model(ids) if hasattr(model, "new_cache") else model(input_ids=ids).logits
    return logits.float()


def score(model: torch.nn.Module, tok: WordTokenizer, prompts: Iterable[Prompt], protocol: str,
          batch_size: int = 32) -> Iterator[list[dict]]:
    """Full-vocabulary top-1 and the answer's probability at each prompt's query; yields rows per batch.
    Prompts of one run all have the same length (fixed query position), so batches need no padding."""
    device = next(model.parameters()).device
    batch: list[Prompt] = []

    def run(batch: list[Prompt]) -> list[dict]:
        ids = torch.tensor([p.ids for p in batch], dtype=torch.long, device=device)  # (B, T)
        logits = last_logits(model, ids)  # (B, V)
        probs = torch.softmax(logits, dim=-1)
        pred = logits.argmax(-1).tolist()
        answer = torch.tensor([p.answer for p in batch], device=device)
        p_ans = probs.gather(1, answer[:, None])[:, 0].tolist()
        return [
            {"pid": p.pid, "residue": p.residue, "target_pos": p.target_pos, "query_pos": p.query_pos,
             "target_index": p.target_index, "mapping": p.mapping, "answer": p.answer, "answer_word": p.answer_word,
             "pred": pr, "pred_word": tok.decode_id(pr), "correct": pr == p.answer, "prob": pa, "protocol": protocol}
            for p, pr, pa in zip(batch, pred, p_ans, strict=True)
        ]

    for p in prompts:
        batch.append(p)
        if len(batch) == batch_size:
            yield run(batch)
            batch = []
    if batch:
        yield run(batch)


@torch.no_grad()
def candidate_logprobs(model: torch.nn.Module, ids: list[int], cands: list[list[int]]) -> list[float]:
    """log P(candidate | ids) for each candidate (teacher forcing beyond its first token)."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    first = torch.log_softmax(last_logits(model, x), -1)[0]  # (V,)
    out = []
    for c in cands:
        lp = float(first[c[0]])
        if len(c) > 1:
            y = torch.tensor([ids + c[:-1]], device=device)
            lps = torch.log_softmax(all_logits(model, y)[0, len(ids):], -1)  # (len(c)-1, V)
            lp += float(lps.gather(1, torch.tensor(c[1:], device=device)[:, None]).sum())
        out.append(lp)
    return out


def resolve_device(spec: str | torch.device) -> str | torch.device:
    """"auto": cuda when available, else cpu; anything else as given."""
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def load(path: str | Path, device: str | torch.device = "cpu", trust_remote_code: bool = False,
         tokenizer: str | Path | None = None) -> EvalModel:
    """The EvalModel of a phasekv run dir (latest checkpoint), a `PhaseLM.save` dir or a Hugging Face causal LM
    dir, opened by the one loader (`phasekv.train.run.open_model`) as the directory holds it; device "auto"
    picks cuda when available."""
    path = Path(path)
    opened = open_model(path, device=resolve_device(device), trust_remote_code=trust_remote_code,
                        tokenizer=tokenizer)
    tok, cfg = WordTokenizer(opened.tokenizer, str(tokenizer or path)), opened.model.config
    if opened.kind == "hf":
        info = {"path": str(path), "config": {k: v for k, v in cfg.to_dict().items()
                                              if isinstance(v, (int, float, str, bool))},
                **{k: v for k, v in evaluation_info(path).items() if v is not None}}  # an export's run metadata
        info["ratios"] = hf_ratios(cfg.to_dict())  # every compression ratio and its layer types (V4: CSA, HCA)
        return EvalModel(opened.model, tok, f"{cfg.model_type}:{path.name}", "hf", hf_stride(cfg.to_dict()), info)
    info = {"path": str(path), "weights": str(opened.weights), "config": cfg.to_dict(),
            "tokenizer": str(tokenizer or "run"), **evaluation_info(path)}
    if cfg.family is not None:  # a grid-family design: every grid period is a ratio to test (NSA: d and l')
        info["ratios"] = family_ratios(cfg)
    grids = cfg.grids
    return EvalModel(opened.model, tok, cfg.name, "phasekv", min(grids.values()) if grids else None, info)


def family_ratios(cfg) -> list[dict]:
    """A family design's grid periods as ratio rows, {"ratio": period, "layer_types": ["MoBA block B (every
    layer)", ...]}, one row per distinct period (NSA's d and l' may coincide); its stride is the smallest."""
    design = cfg.name.split(" ")[0]  # the design's word in its name: NSA, MoBA, Beacon
    rows: dict[int, list[str]] = {}
    for name, period in cfg.grids.items():
        rows.setdefault(period, []).append(f"{design} grid {name} = {period} (every layer)")
    return [{"ratio": r, "layer_types": t} for r, t in sorted(rows.items())]


def evaluation_info(path: str | Path) -> dict:
    """What a run's prompts follow, {"recall": its recall layout and words or None, "train_len": its training
    length or None, "needle": its needle layout when it trained on the needle's task}: from a phasekv run's
    config.json ("train") or an export's (EVAL_KEY, `phasekv export`)."""
    config = config_json(path)
    if isinstance(config.get(EVAL_KEY), dict):
        return {"recall": config[EVAL_KEY].get("recall"), "train_len": config[EVAL_KEY].get("train_len")}
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    data = train.get("data")
    mixed = isinstance(data, dict) and (data.get("data") == "recall" or bool(data.get("recall_mix")))
    recall = data.get("recall") if mixed else None  # recall alone or mixed into text: the words it was trained on
    needle = data.get("needle") if isinstance(data, dict) and data.get("data") == "needle" else None
    return {"recall": recall, "train_len": train.get("seq_len"), **({"needle": needle} if needle else {})}


def config_json(directory: str | Path) -> dict:
    """A directory's config.json as a dict ({} when it is missing, unreadable or not an object)."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def hf_stride(config: dict) -> int | None:
    """The smallest compression ratio a Hugging Face config declares (`compression_layout`: DeepSeek-V4's
    layer_types + compress_rates, the older compress_ratios list, a scalar compress_ratio), if any."""
    ratios = compression_layout(config).distinct()
    return min(ratios) if ratios else None


def hf_ratios(config: dict) -> list[dict]:
    """Every compression ratio of a Hugging Face config with the layer types it belongs to (JSON rows)."""
    return [{"ratio": r, "layer_types": t} for r, t in compression_layout(config).distinct().items()]


def model_ratios(em: EvalModel) -> dict[int, list[str]]:
    """{ratio: layer types} an evaluation tests: every ratio of a Hugging Face config, a phasekv model's stride
    (all its layers), or {} without compression."""
    if em.info.get("ratios"):
        return {int(r["ratio"]): list(r["layer_types"]) for r in em.info["ratios"]}
    return {em.stride: ["compressed attention (every layer)"]} if em.stride else {}
