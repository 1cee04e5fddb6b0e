"""Running retrieval evaluations: score prompts (reusable with hooks active), resume, shard, write results.

Python use (the mechanism analyses call this with hooks on the model):

    from phasekv.eval.prompts import lookup_config
    from phasekv.eval.run import evaluate
    rows = evaluate(model, tokenizer, lookup_config(records=16, per_group=576))  # pandas DataFrame

A run directory holds `results.parquet` (one row per prompt), `summary.json`, `accuracy.png`; while a
run is in flight its rows are flushed to `OUT/.partial/` so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.errors import ConfigError
from phasekv.eval.design import group_moments
from phasekv.eval.figure import to_png
from phasekv.eval.models import EvalModel, model_ratios, score
from phasekv.eval.prompts import Prompt, PromptConfig, RetrievalPrompts
from phasekv.eval.protocols import protocol
from phasekv.eval.ratios import ratio_tests
from phasekv.eval.stats import summarize
from phasekv.eval.tokens import WordTokenizer
from phasekv.io import write_json, write_parquet
from phasekv.progress import progress_bar

COLUMNS = ["pid", "residue", "target_pos", "query_pos", "target_index", "mapping", "answer", "answer_word",
           "pred", "pred_word", "correct", "prob", "protocol"]
PARTIAL = ".partial"
FLUSH_ROWS = 256  # rows per partial file


def evaluate(model, tokenizer, cfg: PromptConfig, pids: Iterable[int] | None = None, batch_size: int = 32,
             progress: bool = False) -> pd.DataFrame:
    """Per-prompt rows (columns COLUMNS) of a lookup/needle evaluation of `model` (a PhaseLM, a transformers
    causal LM or an EvalModel) with `tokenizer` (tokenizers / transformers / WordTokenizer; ignored for an
    EvalModel). Hooks registered on the model stay active."""
    model, tok = _unwrap(model, tokenizer)
    prompts = RetrievalPrompts(cfg, tok)
    _check_fits(model, prompts, batch_size)
    pids = list(range(len(prompts))) if pids is None else list(pids)
    rows: list[dict] = []
    with progress_bar(progress, len(pids), "evaluating") as advance:
        for chunk in score(model, tok, prefetch(prompts.prompt, pids, 2 * batch_size), cfg.padding, batch_size):
            rows.extend(chunk)
            advance(len(chunk))
    return pd.DataFrame(rows, columns=COLUMNS)


def _check_fits(model, prompts: RetrievalPrompts, batch_size: int) -> None:
    """Fail before any work: a batch size below 1, or prompts longer than a phasekv model's max_seq_len."""
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    limit = getattr(model.config, "max_seq_len", None) if hasattr(model, "new_cache") else None
    if limit is not None and prompts.length > limit:
        raise ConfigError(f"prompts of {prompts.length} tokens exceed the model's max_seq_len={limit}; "
                          "lower records, filler or context")


def prefetch(build, pids: Iterable[int], depth: int = 64, workers: int = 2) -> Iterator[Prompt]:
    """build(pid) for each pid in order, computed up to `depth` ahead in threads (tokenisers release the
    GIL, so long prompts are built while the model runs), or in turn when torch runs one thread: there the
    process has one core, and a builder thread holding the GIL delays every op's return (measured: the demo's
    lookup 1.17x the CPU time of building in turn)."""
    if torch.get_num_threads() == 1:
        yield from map(build, pids)
        return
    it = iter(pids)
    with ThreadPoolExecutor(max_workers=workers) as ex:
        queue = deque(ex.submit(build, p) for p in islice(it, depth))
        while queue:
            done = queue.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                queue.append(ex.submit(build, nxt))
            yield done


def _unwrap(model, tokenizer) -> tuple[torch.nn.Module, WordTokenizer]:
    if isinstance(model, EvalModel):
        return model.model, model.tok
    if tokenizer is None:
        raise ConfigError("evaluate() needs a tokenizer unless the model is an EvalModel")
    return model, tokenizer if isinstance(tokenizer, WordTokenizer) else WordTokenizer(tokenizer)


# ---------------------------------------------------------------- run directories, resume, sharding


def run_retrieval(task: str, em: EvalModel, cfg: PromptConfig, out: str | Path, batch_size: int = 32,
                  interval: str = "bootstrap", stride: int | None = None, resume: bool = True,
                  progress: bool = True, extra: dict | None = None) -> dict | None:
    """Evaluate every prompt (sharded over torchrun ranks), write results/summary/figure; returns the summary
    on rank 0 (None on other ranks)."""
    out = Path(out)
    rank, world = _dist_init(em.device)
    t0 = time.time()
    prompts = RetrievalPrompts(cfg, em.tok)
    _check_fits(em.model, prompts, batch_size)
    stride = stride if stride is not None else em.stride
    fingerprint = {"task": task, "model": em.info.get("weights", em.info.get("path")), "prompts": prompts.metadata(),
                   **({"ensemble": em.info["ensemble"]} if "ensemble" in em.info else {})}
    part = out / PARTIAL
    done = _load_partial(part, fingerprint) if resume else pd.DataFrame(columns=COLUMNS)
    if rank == 0:
        if not resume and part.exists():
            shutil.rmtree(part)
        part.mkdir(parents=True, exist_ok=True)
        write_json(part / "fingerprint.json", fingerprint, indent=None, default=str, sort_keys=True)
    _barrier(world)
    todo = sorted(set(range(len(prompts))) - set(done["pid"].tolist()))[rank::world]
    new: list[dict] = []
    pending: list[dict] = []
    with progress_bar(progress and rank == 0, len(todo), f"{task} · {em.name}") as advance:
        for chunk in em.score(prefetch(prompts.prompt, todo, 2 * batch_size), cfg.padding, batch_size):
            new.extend(chunk)
            pending.extend(chunk)
            advance(len(chunk))
            if len(pending) >= FLUSH_ROWS:
                _flush(part, rank, pending)
                pending = []
    if pending:
        _flush(part, rank, pending)
    gathered = _gather(new, world)
    if rank != 0:
        _barrier(world)
        return None
    rows = pd.concat([done, pd.DataFrame(gathered, columns=COLUMNS)], ignore_index=True)
    rows = rows.drop_duplicates("pid").sort_values("pid").reset_index(drop=True).infer_objects()  # same dtypes resumed or not
    if len(rows) != len(prompts):
        raise ConfigError(f"{out}: {len(rows)} of {len(prompts)} prompts evaluated")
    summary = write_run(out, rows, task, em, cfg, prompts.metadata(), stride, interval, time.time() - t0, world,
                        extra or {})
    shutil.rmtree(part, ignore_errors=True)
    _barrier(world)
    return summary


def write_run(out: Path, rows: pd.DataFrame, task: str, em: EvalModel, cfg: PromptConfig, meta: dict,
              stride: int | None, interval: str, seconds: float, world: int, extra: dict) -> dict:
    """results.parquet, summary.json and the protocol's figure of scored rows (COLUMNS) of the prompts `cfg`
    (`meta`: their `RetrievalPrompts.metadata()`); returns the summary. `em` says which model scored them (for
    rows scored elsewhere, as lm-eval's read back, a record of it without weights)."""
    rows = rows.astype({"correct": bool, "prob": float})
    s = summarize(rows["residue"], rows["mapping"], rows["correct"], cfg.modulus, stride, interval=interval,
                  seed=cfg.seed)
    achieved = _achieved_moments(rows, cfg.modulus)
    summary = {
        "task": task, "model": em.name, "model_kind": em.kind, "protocol": cfg.padding, "modulus": cfg.modulus,
        "stride": stride, **s.to_dict(),
        "n_prompts": len(rows), "records": cfg.records, "demos": cfg.demos, "query_pos": meta["query_pos"],
        "prompt_length": meta["length"], "per_group": meta["per_group"],
        "per_group_requested": meta["per_group_requested"], "design_notice": meta["design_notice"],
        "target_moments": achieved,
        "beyond_training_length": beyond_training_length(em, meta["length"]),  # None: within it, or it is unknown
        "ratios": ratio_tests({"groups": s.groups}, model_ratios(em), seed=cfg.seed),  # every ratio dividing M
        "ratios_untested": sorted(r for r in model_ratios(em) if cfg.modulus % r),  # audit plans these
        "provenance": {"seed": cfg.seed, "prompt_config": cfg.to_dict(), "model_info": em.info,
                       "tokenizer": meta["tokenizer"], "word_pools": meta["word_pools"], "words": meta["words"],
                       "world_size": world, "seconds": round(seconds, 2), "versions": versions(), **extra},
    }
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "results.parquet", rows)
    write_json(out / "summary.json", summary, default=json_default)
    proto = protocol(task)
    to_png(proto.build_figure(summary, rows), out / proto.figure)
    return summary


def beyond_training_length(em: EvalModel, length: int) -> dict | None:
    """{"prompt_tokens", "trained_tokens"} when prompts of `length` tokens are longer than the sequences the model
    was trained on (a phasekv run's or an export's training length), else None (within it, or not known)."""
    trained = em.info.get("train_len")
    if not isinstance(trained, int) or isinstance(trained, bool) or length <= trained:
        return None
    return {"prompt_tokens": int(length), "trained_tokens": trained}


def _achieved_moments(rows: pd.DataFrame, modulus: int) -> dict:
    """Moments of the target positions actually scored (verifies the design on the rows)."""
    groups = [rows.loc[rows["residue"] == r, "target_pos"].tolist() for r in range(modulus)]
    return {**group_moments(groups), "query_positions": sorted(set(rows["query_pos"].tolist()))}


def versions() -> dict:
    from phasekv.provenance import versions as provenance

    return provenance("transformers")


def json_default(o):
    """JSON for numpy scalars and arrays (and str of anything else) in summaries."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _load_partial(part: Path, fingerprint: dict) -> pd.DataFrame:
    """Rows of an interrupted run with the same fingerprint (else none: the stale partial is discarded)."""
    fp = part / "fingerprint.json"
    if not fp.is_file():
        return pd.DataFrame(columns=COLUMNS)
    try:
        same = json.loads(fp.read_text()) == json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
    except (OSError, json.JSONDecodeError):
        same = False
    files = sorted(part.glob("rows-*.parquet"))
    if not same or not files:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True).drop_duplicates("pid")


def _flush(part: Path, rank: int, rows: list[dict]) -> None:
    n = len(list(part.glob(f"rows-r{rank}-*.parquet")))
    write_parquet(part / f"rows-r{rank}-{n:06d}-{os.getpid()}.parquet", pd.DataFrame(rows, columns=COLUMNS))


def _dist_init(device: torch.device) -> tuple[int, int]:
    """(rank, world) under torchrun (process group created on first use), (0, 1) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _gather(rows: list[dict], world: int) -> list[dict]:
    if world <= 1:
        return rows
    import torch.distributed as dist

    parts: list[list[dict]] | None = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(rows, parts, dst=0)
    return [r for p in parts for r in p] if parts is not None else []
