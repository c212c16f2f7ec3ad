"""Registry budgets (`BUDGET#<budget key>`, sort key `BUDGET`): one item per registry, the only key a
batch of pull starts writes, once per batch (docs/architecture.md, "Registry budget")."""

from __future__ import annotations

from collections.abc import Sequence

from prewarm.adapters.dynamodb.table import Table, from_item
from prewarm.domain.registry_budget import BudgetState, RegistryBudget, reserve_starts
from prewarm.domain.retry import retry_on_conflict
from prewarm.services.ports import StoreConflictError

# Fillers reserving at once take turns: a write refused by another's (its version moved) reads again.
RESERVE_ATTEMPTS = 8


def budget_pk(key: str) -> str:
    return f"BUDGET#{key}"


class BudgetItems(Table):
    """`BudgetItems`: the GCRA state of each registry's budget, its theoretical arrival time `tat`,
    written under a version so that two fillers never reserve the same seconds."""

    def reserve_pull_starts(self, key: str, costs: Sequence[float], *, now: float,
                            burst_seconds: float, horizon: float | None = None,
                            budget: RegistryBudget | None = None) -> tuple[float, ...]:
        """Start times for pulls from registry `key` costing `costs` seconds of its budget each, reserved
        in one conditional write; with `horizon`, only the first ones that start within it (`reserve_starts`)."""
        if not costs:
            return ()

        def reserve() -> tuple[float, ...]:
            out = self._call(f"read the budget of {key}", "get_item", Key=self._key(budget_pk(key), "BUDGET"),
                             ConsistentRead=True)
            current = from_item(out["Item"]) if "Item" in out else None
            version = int(current["version"]) if current is not None else 0
            tat = float(current["tat"]) if current is not None else None
            reservation = reserve_starts(tat, now=now, costs=costs, burst_seconds=burst_seconds, horizon=horizon)
            condition = "attribute_not_exists(pk)" if current is None else "#version = :version"
            rates = BudgetState(reservation.tat, budget).fields() if budget is not None else {"tat": reservation.tat}
            self._update(f"reserve {len(costs)} pull starts of {key}", budget_pk(key), "BUDGET",
                         {**rates, "version": version + 1, "updated_at": now},
                         condition=condition, values={":version": version} if current is not None else None)
            return reservation.starts

        return retry_on_conflict(reserve, conflict=StoreConflictError, attempts=RESERVE_ATTEMPTS, exhausted=lambda: (
            StoreConflictError(f"the budget of {key} kept changing: {RESERVE_ATTEMPTS} reservations refused")))

    def get_budget(self, key: str) -> BudgetState | None:
        out = self._call(f"read the budget of {key}", "get_item", Key=self._key(budget_pk(key), "BUDGET"))
        return BudgetState.of_item(from_item(out["Item"])) if "Item" in out else None
