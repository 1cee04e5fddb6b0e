"""The demo's claim verdicts on two devices side by side: `phasekv demo --device cuda` against the CPU's, each from
its report's claims.json. Prints one line per claim and exits 1 when a verdict differs.
    python benchmarks/demo_verdicts.py CPU_DEMO_DIR CUDA_DEMO_DIR [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def verdicts(demo: Path) -> dict[str, str]:
    """Claim -> verdict of the demo directory's report."""
    return {c["claim"]: c["verdict"] for c in json.loads((demo / "report" / "claims.json").read_text())}


def seconds_of(demo: Path) -> float | None:
    """The demo's wall-clock seconds (its demo.json), None where it has none."""
    path = demo / "demo.json"
    return json.loads(path.read_text()).get("seconds") if path.exists() else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cpu", type=Path)
    p.add_argument("cuda", type=Path)
    p.add_argument("--json", default="", help="also write the comparison to this JSON file")
    args = p.parse_args(argv)
    cpu, cuda = verdicts(args.cpu), verdicts(args.cuda)
    rows = [{"claim": c, "cpu": cpu.get(c), "cuda": cuda.get(c), "same": cpu.get(c) == cuda.get(c)}
            for c in sorted(cpu.keys() | cuda.keys(), key=lambda c: (len(c), c))]
    for r in rows:
        print(f"{r['claim']:>4}  cpu: {str(r['cpu']):28s} cuda: {str(r['cuda']):28s} {'same' if r['same'] else 'DIFFERS'}")
    same = all(r["same"] for r in rows)
    seconds = {k: seconds_of(d) for k, d in (("cpu", args.cpu), ("cuda", args.cuda))}
    print(f"demo verdicts on CUDA {'equal' if same else 'NOT equal'} to the CPU's ({sum(r['same'] for r in rows)} of "
          f"{len(rows)} claims); wall-clock " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items() if v))
    result = {"claims": rows, "same": same, "seconds": seconds}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if not same:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
