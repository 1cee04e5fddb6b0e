"""Fault injection: run a job in a forked child that SIGKILLs itself at the n-th call of a chosen function.

A real SIGKILL (no `finally`, no flush, no atexit) at a point chosen by name and call count, so every
interruption is reproducible; `kill_at(...)` returns when the child is dead and asserts it died there.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
from dataclasses import dataclass


@dataclass
class KillPoint:
    target: str  # "module:attr.path" of the function to wrap
    n: int  # die at its n-th (matching) call
    when: str = "after"  # "before" or "after" the real call
    match: str | None = None  # count only calls with this substring in their arguments
    torn: bool = False  # (file appenders) write half of the first row, then die

    def __str__(self) -> str:
        return f"{self.target}#{self.n}{'/torn' if self.torn else f'/{self.when}'}"


def _resolve(target: str):
    mod, _, path = target.partition(":")
    obj = importlib.import_module(mod)
    *parents, name = path.split(".")
    for p in parents:
        obj = getattr(obj, p)
    return obj, name


def _arm(point: KillPoint) -> None:
    owner, name = _resolve(point.target)
    real = getattr(owner, name)
    calls = {"n": 0}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def wrapper(*args, **kwargs):
        if point.match is None or point.match in repr(args) + repr(kwargs):
            calls["n"] += 1
        if calls["n"] == point.n:
            if point.torn:  # Logs._append(self, name, rows): half a line, as a kill mid-write leaves it
                self, fname, rows = args
                import json

                with open(self.out / fname, "a") as f:
                    line = json.dumps(rows[0])
                    f.write(line[: len(line) // 2])
                die()
            if point.when == "before":
                die()
            out = real(*args, **kwargs)
            die()
            return out
        return real(*args, **kwargs)

    setattr(owner, name, wrapper)


def _child(point: KillPoint, job, args, cwd) -> None:
    import torch

    torch.set_num_threads(1)
    if cwd is not None:
        os.chdir(cwd)
    _arm(point)
    job(*args)


def kill_at(point: KillPoint, job, *args, cwd=None, timeout: float = 120) -> None:
    """Run job(*args) in a forked child that is SIGKILLed at `point`; fails if it ended any other way."""
    proc = mp.get_context("fork").Process(target=_child, args=(point, job, args, cwd))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError(f"{point}: still running after {timeout}s")
    assert proc.exitcode == -signal.SIGKILL, f"{point}: the job ended with exit code {proc.exitcode}, not at the kill point"
