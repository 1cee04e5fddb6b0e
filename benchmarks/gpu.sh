#!/usr/bin/env bash
# One prepared GPU run of the phasekv benchmarks (bf16, T up to 128K), figures written to a file.
#   bash benchmarks/gpu.sh [OUT_FILE]        (default: benchmarks/gpu-results.txt, or $OUT/gpu-results.txt)
# Installs what it needs into .venv-gpu (a CUDA build of torch + this package), checks the equality tests
# of the fast paths on the GPU, then runs benchmarks/run_all.py --gpu. Time: ~10 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_FILE="${1:-${OUT:+$OUT/gpu-results.txt}}"
OUT_FILE="${OUT_FILE:-benchmarks/gpu-results.txt}"
VENV=.venv-gpu
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"          # override e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "error: no NVIDIA GPU visible (nvidia-smi failed)" >&2; exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || {
  "$VENV/bin/pip" install -q $TORCH_SPEC
  "$VENV/bin/pip" install -q -e '.[dev]'
}
"$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'CUDA build of torch needed'; print(torch.__version__, torch.cuda.get_device_name())"

mkdir -p "$(dirname "$OUT_FILE")"
TMP="$OUT_FILE.tmp"
{
  echo "# phasekv GPU benchmarks · $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo
  echo "## fast-path equality on the GPU (fp32, max abs diff <= 1e-5 vs the dense-mask reference)"
  "$VENV/bin/python" benchmarks/gpu_check.py
  echo
  "$VENV/bin/python" benchmarks/run_all.py --gpu --device cuda --dtype bf16 --threads 8
} 2>&1 | tee "$TMP"
mv "$TMP" "$OUT_FILE"   # only a complete run replaces the figures file
echo "figures written to $OUT_FILE"
