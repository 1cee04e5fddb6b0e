"""Whether this python runs the GPU benchmarks from the tree as it is (no venv, no pip): CUDA torch, and every
package the benchmarks import. Prints one line per dependency of pyproject.toml (version, or missing and whether
the benchmarks need it) and exits 1 with a one-line error naming what is missing that they need.
    python3 benchmarks/gpu_env.py [--cpu]      (--cpu: no CUDA needed, the check of the imports alone)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
import tomllib

from common import ROOT

BENCHMARKS = ("bench_attention", "bench_decode", "bench_memory", "train_throughput", "gpu_check")
IMPORT_NAMES = {"pyyaml": "yaml"}  # distribution -> module, where they differ


def dependencies() -> list[tuple[str, str]]:
    """(distribution, version spec) of pyproject.toml's [project] dependencies."""
    with open(f"{ROOT}/pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [(m.group(1), m.group(2).strip()) for m in (re.match(r"([A-Za-z0-9_.\-]+)(.*)", d) for d in deps)]


def main(argv: list[str]) -> None:
    missing = []
    for name in BENCHMARKS:  # the benchmarks' own imports: what they need
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing.append(e.name.split(".")[0])
    loaded = {m.split(".")[0] for m in sys.modules}
    for dist, spec in dependencies():
        module = IMPORT_NAMES.get(dist, dist).replace("-", "_")
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        need = "needed by the benchmarks" if module in loaded or module in missing else "not imported by the benchmarks"
        print(f"{dist:>12} {version or 'MISSING':>16}  pyproject {spec or '(any)':<14} {need}")
    import torch

    cuda = torch.cuda.is_available()
    print(f"python {sys.version.split()[0]} · torch {torch.__version__} · CUDA {torch.version.cuda} · "
          f"{torch.cuda.get_device_name() if cuda else 'no GPU visible'}")
    if missing:
        raise SystemExit(f"error: {sys.executable} lacks {', '.join(sorted(set(missing)))}, which the benchmarks "
                         "import: bring the wheel(s) along (pip install --no-index --target ...) or use another python")
    if not cuda and "--cpu" not in argv:
        raise SystemExit(f"error: torch {torch.__version__} in {sys.executable} sees no CUDA device")


if __name__ == "__main__":
    main(sys.argv[1:])
