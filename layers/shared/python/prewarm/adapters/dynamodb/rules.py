"""Prewarm rules (`RULE#<name>`, sort key `RULE`) and the last run of each schedule (`SCHEDULE#<name>`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from prewarm.adapters.dynamodb.table import Table, to_item
from prewarm.domain.schedules import ScheduleRun


class RuleItems(Table):
    """The prewarm rules, each with its spec and spec hash."""

    def put_rule(self, name: str, spec: dict[str, Any], spec_hash: str) -> str:
        """Writes a rule; returns `created`, `configured` or `unchanged`, as kubectl says it."""
        return self._put_spec(f"rule {name}", {"pk": f"RULE#{name}", "sk": "RULE", "kind": "rule", "name": name,
                                               "spec": json.dumps(spec, sort_keys=True)}, spec_hash)

    def list_rules(self) -> list[dict[str, Any]]:
        return [json.loads(v["spec"]) for v in sorted(self._list_kind("rule"), key=lambda v: str(v["name"]))]

    def delete_rule(self, name: str) -> bool:
        out = self._call(f"delete rule {name}", "delete_item", Key=self._key(f"RULE#{name}", "RULE"),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out


class ScheduleRunItems(Table):
    """The last completed run of each schedule (`ScheduleRuns`)."""

    # One item per schedule, overwritten by each run: the sweep's costs one write a minute. No `kind`,
    # so the items stay out of the kinds index (and its writes), and `sk` is not JOB, so the stream's
    # filter keeps them from dispatch_job.

    def record_run(self, run: ScheduleRun) -> None:
        self._call(
            f"record the {run.schedule} run", "put_item",
            Item=to_item({"pk": f"SCHEDULE#{run.schedule}", "sk": "RUN", "schedule": run.schedule,
                        "started_at": run.started_at, "finished_at": run.finished_at}),
        )

    def last_runs(self, schedules: Sequence[str]) -> dict[str, ScheduleRun]:
        """The last recorded run of each of `schedules` that has one."""
        keys = [self._key(f"SCHEDULE#{name}", "RUN") for name in dict.fromkeys(schedules)]
        return {
            v["schedule"]: ScheduleRun(v["schedule"], started_at=float(v["started_at"]),
                                       finished_at=float(v["finished_at"]))
            for v in self._batch_get("read schedule runs", keys)
        }
