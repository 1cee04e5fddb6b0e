"""Audit a Hugging Face checkpoint for periodic weak spots, from Python.

No checkpoint is downloaded: the script writes a tiny `transformers` config, DeepSeek-V4 by default (a
compressed sparse attention layer at ratio 4 and a heavily compressed one at ratio 8) or Qwen3 (full
attention), trains it on phasekv's synthetic recall with `phasekv.train.loop.train` (its checkpoints are
`save_pretrained` directories with the tokenizer beside them), then audits the latest checkpoint
directory as the Hugging Face model it is: every compression ratio the config declares gets its own
residue profile, periodicity test and weakest phase (a model without one is tested for `--stride`).

    python examples/audit_hf_checkpoint.py                 # DeepSeek-V4, 1,600 steps: ~20 CPU-minutes to train
    python examples/audit_hf_checkpoint.py --config qwen3 --tiny   # seconds: a model at chance (inconclusive)

transformers' DeepSeek-V4 code is slow on a CPU (about 5 s a batch of 32 prompts for this tiny model): its
full audit, 13,824 prompts, takes a while; `--device cuda` is the way for real checkpoints.

With your own checkpoint: `phasekv.eval.models.load("path/to/hf-dir")` and `run_audit` as below.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import DeepseekV4Config, Qwen3Config

from phasekv.eval.models import load
from phasekv.mitigate.audit import run_audit
from phasekv.runtime import reuse_freed_memory
from phasekv.train.loop import train
from phasekv.train.run import resolve_model_dir


def tiny_v4_config() -> DeepseekV4Config:
    """Hidden 64, two layers (CSA at ratio 4, HCA at ratio 8), one KV head, sliding window 16, 4 experts."""
    layers = ["compressed_sparse_attention", "heavily_compressed_attention"]
    return DeepseekV4Config(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=32, q_lora_rank=32,
        o_lora_rank=32, o_groups=2, index_n_heads=2, index_head_dim=16, index_topk=1024, partial_rotary_factor=0.5,
        layer_types=layers, mlp_layer_types=["moe"] * 2,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=16, n_routed_experts=4, num_experts_per_tok=2, hc_mult=1, moe_intermediate_size=32,
        max_position_embeddings=512, initializer_range=0.125)


def tiny_qwen3_config() -> Qwen3Config:
    """Hidden 64, two layers, 4 query heads and one KV head: full attention."""
    return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=512)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/example-audit", help="working directory")
    ap.add_argument("--config", choices=("v4", "qwen3"), default="v4", help="the tiny model's architecture")
    ap.add_argument("--stride", type=int, default=4, help="stride to test a model without compression ratios for")
    ap.add_argument("--tiny", action="store_true", help="tiny budgets (seconds; too short to learn anything)")
    args = ap.parse_args(argv)
    reuse_freed_memory()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.json"
    hf_config = tiny_v4_config() if args.config == "v4" else tiny_qwen3_config()
    config.write_text(json.dumps(hf_config.to_dict()))

    budget = dict(steps=2, batch_size=4, val_sequences=4, log_every=1) if args.tiny else dict(steps=1600)
    run = out / "run"
    if not (run / "done.json").exists():  # a finished run is reused; an interrupted one resumes
        train(hf_config=str(config), out=str(run), recall={"gap_prob": 1.0, "max_gap": 4}, val_every=0,
              gate_steps="none", progress=False, threads=1, resume=(run / "config.json").exists(), **budget)
    checkpoint, kind = resolve_model_dir(run)  # the latest save_pretrained directory, what load(run) opens
    assert kind == "hf", kind

    # Evaluated as the transformers model it holds, never converted. The run directory also says which recall
    # words and layout the model was trained on, so the audit runs the lookup on them; a bare Hugging Face
    # directory of your own (`load("path/to/hf-dir")`) gets the needle test, which needs nothing model-specific.
    model = load(run, device="cpu")
    design = dict(modulus=4, per_group=16) if args.tiny else {}  # tiny: 64 prompts (an exact design at M = 4)
    stride = None if args.config == "v4" else args.stride  # V4: every ratio its config.json declares
    verdict = run_audit(model, out / "audit", stride=stride, margin=10.0, progress=False, **design)
    print(f"{checkpoint}: {verdict['verdict']} (exit code {verdict['exit_code']}), "
          f"mean {verdict['mean']:.1f}, gap {verdict['gap']:.1f} [{verdict['gap_ci'][0]:.1f}, {verdict['gap_ci'][1]:.1f}]")
    for ratio in verdict.get("ratios", []):
        print(f"  ratio {ratio['ratio']} ({', '.join(ratio['layer_types'])}): residues mod {ratio['modulus']}")
    print(f"wrote {out / 'audit' / 'audit.json'} and audit.png")
    return verdict


if __name__ == "__main__":
    main()
