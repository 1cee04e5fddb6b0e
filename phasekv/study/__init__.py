"""The task graph of a study and where its tasks run.

- `graph`: `Task` (a unit of work with its inputs), `run_tasks` (the driver: submits what is ready, in the graph's
  order, skips what is done, reports failures and the time left; a `Schedule` and a `ProgressView`), the directory
  lock;
- `executor`: the seam, `Executor` (submit a task, wait for handles, find a job an earlier driver submitted);
- `local`: a process pool on this machine (the default); `slurm`: a SLURM job per task through submitit, whose
  jobs, states and results `jobs` reads (the only module that imports submitit, the optional `cluster` extra).

Layer: below `phasekv.train` (whose sweeps it runs on a cluster) and the demo (whose plans it runs); it knows
tasks, not what they compute, and imports only `progress`, `errors` and `io`.
"""

from phasekv.study.executor import Executor
from phasekv.study.graph import Lock, Task, console, makespan, run_tasks, time_left

__all__ = ["Executor", "Lock", "Task", "console", "makespan", "run_tasks", "time_left"]
