"""What a run logs while it trains, apart from the loop: `metrics.jsonl` and `gates.jsonl` (rank 0), optional
TensorBoard / wandb, the progress bar and the tokens/s clock. On resume the rows logged after the checkpoint
being resumed are dropped first, so every step is logged exactly once.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from phasekv.errors import ConfigError
from phasekv.io import write_text
from phasekv.progress import Progress
from phasekv.train.config import TrainConfig


class Logs:
    """metrics.jsonl / gates.jsonl appenders (rank 0) plus optional TensorBoard / wandb."""

    def __init__(self, out: Path, cfg: TrainConfig, main: bool, start_step: int):
        self.out, self.main, self.tb, self.wandb = out, main, None, None
        if not main:
            return
        for name in ("metrics.jsonl", "gates.jsonl"):  # drop rows logged after the checkpoint we resume from
            p = out / name
            if p.is_file():
                rows = [r for r in p.read_text().splitlines() if _row_step(r) <= start_step]
                write_text(p, "".join(r + "\n" for r in rows))
        if cfg.logger == "tensorboard":
            self.tb = _tensorboard(out)
        elif cfg.logger == "wandb":
            self.wandb = _wandb(out, cfg)

    def _append(self, name: str, rows: list[dict]):
        with open(self.out / name, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    def metrics(self, row: dict):
        if not self.main:
            return
        self._append("metrics.jsonl", [row])
        scalars = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        if self.tb:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, row["step"])
        if self.wandb:
            self.wandb.log(scalars, step=row["step"])

    def gates(self, rows: list[dict]):
        if self.main and rows:
            self._append("gates.jsonl", rows)

    def close(self):
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _tensorboard(out: Path):
    try:  # optional dependency, imported only when asked for
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("logger=tensorboard needs the tensorboard package (pip install tensorboard)") from None
    return SummaryWriter(str(out / "tensorboard"))


def _wandb(out: Path, cfg: TrainConfig):
    try:  # optional dependency, imported only when asked for
        import wandb
    except ImportError:
        raise ConfigError("logger=wandb needs the wandb package (pip install wandb)") from None
    return wandb.init(project="phasekv", name=out.name, dir=str(out), config=cfg.to_dict(), resume="allow")


def _row_step(line: str) -> float:
    """Step of a logged row; a blank or torn row (the process was killed mid-append) sorts after every step."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return math.inf


def progress_bar(enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), disable=not enabled)


class Clock:
    """Tokens/s since the last logged step, and over this session (a resumed run counts from its checkpoint)."""

    def __init__(self, step: int, tokens_per_step: int):
        self.start, self.last = time.time(), time.time()
        self.first_step, self.last_step, self.tokens_per_step = step, step, tokens_per_step

    def tick(self, step: int) -> dict:
        """`tokens`, `tokens_per_s` (since the last tick) and `elapsed_s` at `step`."""
        now = time.time()
        tps = self.tokens_per_step * (step - self.last_step) / max(now - self.last, 1e-9)
        self.last, self.last_step = now, step
        return {"tokens": step * self.tokens_per_step, "tokens_per_s": tps, "elapsed_s": now - self.start}

    def session(self, step: int) -> dict:
        """`tokens_per_s` and `elapsed_s` of this session, at its last step `step`."""
        elapsed = time.time() - self.start
        return {"tokens_per_s": (step - self.first_step) * self.tokens_per_step / max(elapsed, 1e-9),
                "elapsed_s": elapsed}
