"""Training from scratch: `train(...)` (the `phasekv train` command), checkpoints, `load_run`, sweeps."""

from phasekv.train.config import TrainConfig
from phasekv.train.loop import TrainingDiverged, train
from phasekv.train.run import load_run

__all__ = ["TrainConfig", "TrainingDiverged", "load_run", "train"]
