"""Layer 4 (above attention): whole models. `PhaseLM` (a Qwen3-shaped decoder of `attention` layers), its
files (`io`, safetensors with a manifest), Hugging Face interop (`hf`: Qwen3 weights, DeepSeek-V4
compressors), the one gate-scores hook (`gates`) and gate concentration (`concentration`) that training,
analyses and mitigations share, and the core CLI (`phasekv info`, `phasekv smoke`).
"""
