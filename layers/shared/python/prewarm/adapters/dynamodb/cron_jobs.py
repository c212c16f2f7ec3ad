"""AdvancedCronJob items (`CRON#<key>`, sort key `CRON`): a cron job's manifest as applied. Its runs are job
items of their own; its schedule lives in EventBridge Scheduler, kept in step through the table stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from prewarm.adapters.dynamodb.table import Table, from_item, plain_value
from prewarm.domain.cronjobs import StoredCronJob
from prewarm.domain.keys import JobKey

CRON_SK = "CRON"


def cron_pk(key: JobKey) -> str:
    return f"CRON#{key}"


def cron_job_of_value(value: Mapping[str, Any]) -> StoredCronJob:
    return StoredCronJob(JobKey.parse(str(value["key"])), json.loads(value["spec"]), str(value.get("spec_hash", "")),
                         str(value.get("uid", "")))


def cron_job_of_item(item: Mapping[str, Any] | None) -> StoredCronJob | None:
    """The cron job an item holds, as the table stream shows it (plain values); None for any other item."""
    if not item or item.get("sk") != CRON_SK:
        return None
    return cron_job_of_value({k: plain_value(v) for k, v in item.items()})


class CronJobItems(Table):
    """The AdvancedCronJobs, each with its manifest and spec hash."""

    def put_cron_job(self, key: JobKey, manifest: dict[str, Any], spec_hash: str, uid: str = "") -> str:
        """Writes a cron job; returns `created`, `configured` or `unchanged`, as kubectl says it. Its uid is
        `uid` when given (a resource's), else the stored one's, else a new one."""
        return self._put_spec(f"cron job {key}", {"pk": cron_pk(key), "sk": CRON_SK, "kind": "cronjob",
                                                  "key": str(key), "spec": json.dumps(manifest, sort_keys=True),
                                                  "uid": uid or str(uuid.uuid4())}, spec_hash,
                              keep=() if uid else ("uid",))

    def get_cron_job(self, key: JobKey) -> StoredCronJob | None:
        found = self._call("get cron job", "get_item", Key=self._key(cron_pk(key), CRON_SK), ConsistentRead=True)
        return cron_job_of_value(from_item(found["Item"])) if "Item" in found else None

    def list_cron_jobs(self) -> list[StoredCronJob]:
        return [cron_job_of_value(v) for v in sorted(self._list_kind("cronjob"), key=lambda v: str(v["key"]))]

    def delete_cron_job(self, key: JobKey) -> bool:
        out = self._call(f"delete cron job {key}", "delete_item", Key=self._key(cron_pk(key), CRON_SK),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out
