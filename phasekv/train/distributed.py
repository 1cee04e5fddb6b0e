"""Distributed setup and model wrapping, apart from the loop (as torchtitan keeps `parallelize` apart from
`train.py`): this rank's place in a torchrun job, its device, DDP or FSDP2 (`fully_shard`) wrapping, and the
full (unsharded) state dicts a checkpoint holds. A single process takes the same path with world = 1: no
process group, no wrapper.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from phasekv.attention import blockwise
from phasekv.attention.attention import Attention
from phasekv.errors import ConfigError
from phasekv.model.transformer import PhaseLM
from phasekv.train.config import TrainConfig


@dataclass
class Dist:
    """This process's place in a torchrun job (rank 0 of a world of 1 without torchrun)."""

    rank: int = 0  # global rank
    world: int = 1  # number of processes
    local_rank: int = 0  # rank on this node: the index of its CUDA device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(x)
        return x

    def barrier(self):
        if self.world > 1:
            torch.distributed.barrier()

    def close(self):
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init_dist(device: str) -> Dist:
    """Rank/world from torchrun's environment; initialises the process group (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    d = Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return d


def pick_device(spec: str, dist: Dist) -> torch.device:
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but no CUDA device is available")
        dev = torch.device("cuda", dist.local_rank if spec == "cuda" else int(spec.split(":")[1]))
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def capturable(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether each layer of `model` traces into one graph (`torch.compile(fullgraph=True)`): the study's attention
    layers, full or compressed on the fused triton kernels (on `device`'s backend: the blockwise path reads a
    position on the host), and no coverage regulariser (its gate reads run inside the layers)."""
    if not isinstance(model, PhaseLM) or model.config.coverage_reg:
        return False
    fused = blockwise.backend(torch.empty(0, device=device)) == "triton"
    return all(type(b.attn) is Attention and (b.attn.compressor is None or fused) for b in model.layers)


def compile_layers(model: torch.nn.Module, backend: str = "inductor") -> None:
    """Each layer of `model` compiled whole (one graph: `fullgraph`), at static shapes; `capturable` says whether a
    PhaseLM's can be."""
    for block in model.layers:
        block.compile(backend=backend, fullgraph=True, dynamic=False)


def wrap(model: PhaseLM, cfg: TrainConfig, dist: Dist, device: torch.device) -> torch.nn.Module:
    """Optional torch.compile (each layer captured whole, at static shapes, where it can be: `capturable`; else the
    model, with graph breaks), and DDP or FSDP2 under torchrun (FSDP2 shards `model` in place)."""
    wrapped: torch.nn.Module = model
    layers = cfg.compile and capturable(model, device)
    if layers:  # as torchtitan: per block, before sharding
        compile_layers(model)
    if dist.world > 1 and cfg.fsdp:
        from torch.distributed.fsdp import fully_shard  # imported when used: ~1 s of start-up otherwise

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif dist.world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile and not layers:
        wrapped = torch.compile(wrapped)
    return wrapped


def eager(model: torch.nn.Module, cfg: TrainConfig, device: torch.device):
    """A context in which layers compiled by `wrap` run eagerly: they are the training step's; validation and the
    gate probe (whose hooks read inside the layers) run as they did before."""
    return torch.compiler.set_stance("force_eager") if cfg.compile and capturable(model, device) else nullcontext()


def no_sync(wrapped: torch.nn.Module, cfg: TrainConfig, dist: Dist, last_micro_step: bool):
    """DDP's `no_sync()` on every accumulation micro-step but the last: gradients are all-reduced once a step."""
    if dist.world > 1 and not cfg.fsdp and not last_micro_step and hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()
    return nullcontext()


def full_state(model: PhaseLM, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts, gathered whole onto the CPU (collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # ~1 s to import

    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: PhaseLM, opt: torch.optim.Optimizer, msd: dict, osd: dict, strict: bool = True):
    """Load full state dicts into a (possibly sharded) model and its optimizer; `strict=False` accepts
    parameters without optimizer state (never reached by a gradient, e.g. a V4 indexer whose top-k keeps
    every entry)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict  # ~1 s to import

    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd,
                   options=StateDictOptions(full_state_dict=True, strict=strict))
