"""The demo's cost from its `demo.json` (written by `phasekv demo`): single-core CPU-minutes in all and by kind of
task, wall-clock of its runs with their load averages, and the replayed schedule on idle cores. CPU time does not
depend on what else the machine ran, so it is the figure to compare across runs and machines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def kind(task: str) -> str:
    """'train w8s8-1kv' -> 'train', 'lookup prefix full-1kv' -> 'lookup', 'theory checks' -> 'theory'."""
    return task.split()[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--demo", default="demo_out/demo.json", help="a demo's demo.json")
    args = p.parse_args(argv)
    path = Path(args.demo)
    print(f"\n=== demo cost ({path}) ===")
    if not path.is_file():
        print(f"no {path}: run `make demo` first (or pass --demo PATH)")
        return
    d = json.loads(path.read_text())
    tasks = {k: v for k, v in d.get("tasks", {}).items() if isinstance(v, dict)}
    by_kind: dict[str, float] = {}
    for name, t in tasks.items():
        by_kind[kind(name)] = by_kind.get(kind(name), 0.0) + t["cpu_s"]
    cpu = d.get("cpu_seconds", sum(by_kind.values()))
    print(f"{d.get('mode', '?')} demo, {d.get('threads', '?')}, {d.get('machine', '?')}: "
          f"{cpu / 60:.1f} single-core CPU-minutes")
    print("  by task kind: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(by_kind.items(), key=lambda x: -x[1])))
    print("  training: " + ", ".join(f"{n.split(maxsplit=1)[1]} {t['cpu_s']:.0f} s" for n, t in tasks.items()
                                     if kind(n) == "train"))
    runs = d.get("invocations", [])
    loads = "; ".join(f"{r['seconds'] / 60:.1f} min at load {r['load_average'][0]}-{r['load_average'][1]}" for r in runs)
    print(f"  wall-clock: {d.get('seconds', 0) / 60:.1f} min ({loads}); replayed on idle cores: "
          f"{d.get('idle_estimate_seconds', 0) / 60:.1f} min")


if __name__ == "__main__":
    main()
