"""The job store on one DynamoDB table, one module per item kind (key design and capacity model in
docs/architecture.md): `jobs` (job items), `tasks` (node items and excluded nodes), `nodes` (registered
nodes), `rules` (prewarm rules and schedule runs), `clusters` (registered clusters), `cron_jobs`
(AdvancedCronJobs), `budgets` (one per registry), `warm_budgets` (namespaces' budgets, one per cluster),
all on `table`'s calls and error mapping: a failed condition is a conflict (re-read, decide again),
throttling is retryable.
"""

from __future__ import annotations

from prewarm.adapters.dynamodb.budgets import BudgetItems
from prewarm.adapters.dynamodb.clusters import ClusterItems
from prewarm.adapters.dynamodb.cron_jobs import CronJobItems, cron_job_of_item
from prewarm.adapters.dynamodb.jobs import MAX_SHARDS, NODES_PER_SHARD, job_of_item
from prewarm.adapters.dynamodb.nodes import NodeItems
from prewarm.adapters.dynamodb.rules import RuleItems, ScheduleRunItems
from prewarm.adapters.dynamodb.snapshots import WarmSnapshotItems
from prewarm.adapters.dynamodb.table import excluded_sk, job_pk, node_sk, shard_of, task_pk
from prewarm.adapters.dynamodb.tasks import MAX_NODES_PER_TRANSACTION, NodeTaskItems
from prewarm.adapters.dynamodb.warm_budgets import WarmBudgetItems

__all__ = [
    "MAX_NODES_PER_TRANSACTION",
    "MAX_SHARDS",
    "NODES_PER_SHARD",
    "DynamoJobStore",
    "cron_job_of_item",
    "excluded_sk",
    "job_of_item",
    "job_pk",
    "node_sk",
    "shard_of",
    "task_pk",
]


class DynamoJobStore(NodeTaskItems, NodeItems, RuleItems, ScheduleRunItems, ClusterItems, WarmSnapshotItems,
                     CronJobItems, BudgetItems, WarmBudgetItems):
    """`JobStore` and `ScheduleRuns` on the JobsTable. Give it a boto3 DynamoDB client, or it builds one
    on first use."""
