"""One rank of a demo training under torchrun: the reference the cluster test compares SLURM's ranks with.

    torchrun --nproc_per_node 2 tests/cluster/rank.py PLAN.json ARCH RUN_DIR
"""

import json
import sys

from phasekv.demo.stages import train_model

if __name__ == "__main__":
    plan, arch, run_dir = sys.argv[1:4]
    train_model(json.loads(open(plan).read()), arch, run_dir)
