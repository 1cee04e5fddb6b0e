"""`phasekv export`: a full-attention phasekv model as a Hugging Face Qwen3 directory that evaluates like its run.

The directory holds config.json, model.safetensors and the tokenizer files, so transformers and inference
engines (vLLM, SGLang) load it as they are; config.json also carries the run's evaluation metadata under
`phasekv_evaluation` (the recall words and layout, the training length: what `lookup_config` builds the run's
prompts from), and every phasekv loader reads it back, in process or through an engine serving the directory.
"""

from __future__ import annotations

from pathlib import Path

from phasekv.errors import ConfigError
from phasekv.eval.models import evaluation_info
from phasekv.model.transformer import PhaseLM
from phasekv.train.run import load_run


def export(model: str | Path, out: str | Path) -> Path:
    """Write the model of `model` (a run, checkpoint, PhaseLM.save or Qwen3 directory) to `out`."""
    phaselm, tok = load_run(model, hf_tokenizer=True)
    if not isinstance(phaselm, PhaseLM):
        raise ConfigError(f"{model}: only phasekv models (or Qwen3 directories) export, not {type(phaselm).__name__}")
    meta = {k: v for k, v in evaluation_info(model).items() if v is not None}
    hf = phaselm.to_hf(evaluation=meta or None)
    out = Path(out)
    hf.save_pretrained(out)  # safetensors
    tok.save_pretrained(out)
    return out
