"""Training from scratch: `train(...)` (the `phasekv train` command), checkpoints, `load_run`, sweeps.

    phasekv train --arch "W8/S8 · 1 KV" --preset tiny --out runs/w8s8          # default recall recipe
    phasekv train --arch full-1kv --data "corpus/*.parquet" --tokenizer tok.json --recall-mix 0.1 --out runs/x
    phasekv train --out runs/w8s8 --resume                                     # continue after a crash
    phasekv train --hf-config v4/config.json --out runs/v4                     # any transformers causal LM
    torchrun --nproc_per_node 8 -m phasekv train --fsdp ...                    # DDP / FSDP2

    from phasekv.train import train, load_run
    summary = train(arch="W8/S8 · 1 KV", preset="tiny", out="runs/w8s8")     # dict, also DIR/done.json
    model, tokenizer = load_run("runs/w8s8")     # run dir | checkpoint dir | PhaseLM.save dir | HF model dir

The default data is synthetic associative recall (`phasekv.data.recall`) with a word tokenizer of the
words it uses (`phasekv.data.recall_tokenizer`); validation reports held-out recall accuracy by residue mod 24.
A run directory holds config.json, tokenizer.json, metrics.jsonl, gates.jsonl, checkpoints/ and done.json
(see `phasekv.train.checkpoint`). With `--hf-config` / `--hf-model` the model is a transformers causal LM and
each checkpoint a `save_pretrained` directory with the tokenizer beside it (`phasekv.train.hfmodel`).

Modules, as in torchtitan: `loop` (the step loop, `Trainer`), `build` (tokenizer, model, optimizer),
`distributed` (process group, device, DDP/FSDP2), `metrics` (logs, progress), `resume` (config merging,
state restore), `checkpoint`, `config`, `hfmodel` (transformers models), `sweep`, `cli`.

Layer: above `phasekv.data` and `phasekv.model`, which it composes (streams feed a PhaseLM; weights are
saved in the model's own file format), and below `phasekv.eval`, `analysis` and `mitigate`, which read the
runs it writes. Training itself needs nothing from those layers.
"""

from phasekv.train.config import TrainConfig
from phasekv.train.loop import TrainingDiverged, train
from phasekv.train.run import load_run

__all__ = ["TrainConfig", "TrainingDiverged", "load_run", "train"]
