"""Crashes on demand: a proxy over the job store or the task queues that raises on the Nth call of a method.

A `FaultPlan` counts every call of the methods it watches, across the whole scenario, so a first run
without a fault tells how many write boundaries there are; later runs crash at each one in turn,
`before` the call (nothing of it is written) or `after` it (written, but the caller never learns).
A crash after a write is the same as a crash before the next write of the same delivery, so `after`
is only tried on the last write of each delivery. Nothing is counted before `watch()`: a scenario
sets up its state first, and other scenarios cover that part.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

# The calls that change something: a crash between two of them is a half-done operation.
STORE_WRITES = (
    "create_job", "replace_job_spec", "set_job_fields", "delete_job", "put_tasks", "delete_tasks", "commit_plan",
    "put_excluded", "update_task", "apply_updates", "add_task", "add_tasks", "remove_task", "claim_tasks", "finish_job",
    "put_rule",
    "delete_rule", "put_node", "delete_node",
)
QUEUE_WRITES = ("send", "send_many", "delete_queue")
WATCHED = {"store": STORE_WRITES, "queues": QUEUE_WRITES}

When = Literal["before", "after"]


class InjectedFault(Exception):
    """The simulated crash: no production code catches it, as none catches a Lambda timeout."""


@dataclass(frozen=True)
class Fault:
    method: str  # "store.commit_plan"
    call: int  # 1-based, counted over the whole scenario
    when: When

    def __str__(self) -> str:
        return f"{self.when} call {self.call} of {self.method}"


@dataclass
class FaultPlan:
    fault: Fault | None = None
    calls: Counter[str] = field(default_factory=Counter)
    fired: bool = False
    step: int = 0
    log: list[tuple[str, int, int]] = field(default_factory=list)  # (method, call, step)
    watching: bool = False

    def watch(self) -> None:
        """Count (and crash) from here on."""
        self.watching = True

    def wrap(self, role: str, target: Any) -> Any:
        return _Faulty(self, role, target)

    def begin_step(self) -> None:
        """A new delivery (a message, a stream record, a schedule, a CLI call) starts."""
        self.step += 1

    def faults(self) -> list[Fault]:
        """The distinct crash points of the run this plan recorded."""
        out = [Fault(method, n, "before") for method, n, _ in self.log]
        ends = [entry for entry, following in zip(self.log, [*self.log[1:], None], strict=True)
                if following is None or following[2] != entry[2]]
        return out + [Fault(method, n, "after") for method, n, _ in ends]

    def _call(self, name: str, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.watching:
            return method(*args, **kwargs)
        self.calls[name] += 1
        self.log.append((name, self.calls[name], self.step))
        armed = not self.fired and self.fault is not None and self.fault.method == name
        hit = armed and self.fault is not None and self.calls[name] == self.fault.call
        if hit and self.fault is not None and self.fault.when == "before":
            self.fired = True
            raise InjectedFault(str(self.fault))
        result = method(*args, **kwargs)
        if hit:
            self.fired = True
            raise InjectedFault(str(self.fault))
        return result


class _Faulty:
    """Delegates everything to `target`; watched methods go through the plan."""

    def __init__(self, plan: FaultPlan, role: str, target: Any) -> None:
        self._plan, self._role, self._target = plan, role, target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in WATCHED[self._role] or not callable(attr):
            return attr
        qualified = f"{self._role}.{name}"

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._plan._call(qualified, attr, args, kwargs)

        return call
