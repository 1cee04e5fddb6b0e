"""The driver's schedule without running anything: what is ready (slots, inputs finished or, on a chaining executor,
submitted) and what a failure leaves to skip, through every task behind it."""

from phasekv.study.executor import Executor
from phasekv.study.graph import SKIPPED, Schedule, Task


class Pool(Executor):
    def __init__(self, slots: int | None, chains: bool = False):
        self.slots, self.chains = slots, chains

    def submit(self, task, after):
        return object()


def _tasks() -> list[Task]:
    never = lambda: False  # noqa: E731
    return [Task("a", print, {}, never), Task("b", print, {}, never, after=["a"]),
            Task("c", print, {}, never, after=["b"]), Task("d", print, {}, never)]


def test_ready_waits_for_inputs_and_a_free_slot():
    plan = Schedule(_tasks(), Pool(slots=2))
    a = plan.ready()
    plan.start(a, object())
    assert a.name == "a" and plan.ready().name == "d"  # b waits for a to finish
    plan.start(plan.ready(), object())
    assert plan.ready() is None  # no free slot
    chained = Schedule(_tasks(), Pool(slots=None, chains=True))
    for name in "abcd":
        t = chained.ready()
        assert t.name == name  # a scheduler takes each task once its inputs are submitted
        chained.start(t, object())
    assert chained.inputs(chained.running["c"].task) == [chained.running["b"].handle]


def test_a_failure_skips_every_task_behind_it():
    plan = Schedule(_tasks(), Pool(slots=None, chains=True))
    for _ in range(2):
        plan.start(plan.ready(), object())  # a and b submitted
    r = plan.end(plan.running["a"].handle)
    assert plan.fail(r.task, ValueError("planted\n failure")) == "ValueError: planted failure"
    withdrawn = plan.skip()
    assert [w.task.name for w in withdrawn] == ["b"] and not plan.running
    assert plan.failed == {"a": "ValueError: planted failure", "b": SKIPPED, "c": SKIPPED}  # c: behind b
    assert [t.name for t in plan.todo] == ["d"] and plan.ready().name == "d"
