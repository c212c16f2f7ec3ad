"""Namespaces' warm budgets (`WARMBUDGETS#<cluster>`, sort key `WARMBUDGETS`): one item per cluster, the copy
of its Namespaces' budget annotations the resource sync keeps, so that every apply (the CLI, a push, a
resource) reads them from the table alone (docs/architecture.md, "Namespace warm budgets")."""

from __future__ import annotations

import json
from collections.abc import Mapping

from prewarm.adapters.dynamodb.table import Table, from_item
from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.warm_budgets import WarmBudget


def warm_budgets_pk(cluster: str) -> str:
    return f"WARMBUDGETS#{cluster}"


class WarmBudgetItems(Table):
    """`WarmBudgetItems`: each cluster's namespaces' warm budgets, one item (no `kind`: outside the index)."""

    def get_warm_budgets(self, cluster: str = DEFAULT_CLUSTER) -> dict[str, WarmBudget]:
        out = self._call(f"read the warm budgets of cluster {cluster!r}", "get_item",
                         Key=self._key(warm_budgets_pk(cluster), "WARMBUDGETS"), ConsistentRead=True)
        stored = json.loads(from_item(out["Item"])["budgets"]) if "Item" in out else {}
        return {ns: WarmBudget.from_dict(ns, value) for ns, value in stored.items()}

    def put_warm_budgets(self, budgets: Mapping[str, WarmBudget], cluster: str = DEFAULT_CLUSTER) -> bool:
        """Stores `budgets` (every namespace's of `cluster`); False when they are the ones stored."""
        if budgets == self.get_warm_budgets(cluster):
            return False
        value = json.dumps({ns: b.as_dict() for ns, b in sorted(budgets.items())}, sort_keys=True)
        self._update(f"write the warm budgets of cluster {cluster!r}", warm_budgets_pk(cluster), "WARMBUDGETS",
                     {"budgets": value})
        return True
