"""One budget per registry: whose quota a host counts against, what a pull costs, and the pacing of starts."""

from __future__ import annotations

import random

import pytest

from prewarm.domain.registry_budget import (
    DEFAULT_REQUESTS_PER_SECOND,
    ECR_LAYER_REQUESTS_PER_SECOND,
    BudgetConfigError,
    BudgetState,
    RegistryBudget,
    RegistryBudgets,
    budget_key,
    is_throttled,
    is_throttled_report,
    pull_requests,
    reserve_starts,
    throttle_backoff,
)


def test_every_host_of_one_ecr_registry_shares_the_account_and_region_budget() -> None:
    assert budget_key("123456789012.dkr.ecr.us-west-2.amazonaws.com") == "ecr:123456789012:us-west-2"
    assert budget_key("123456789012.dkr.ecr-fips.us-west-2.amazonaws.com") == "ecr:123456789012:us-west-2"
    assert budget_key("123456789012.dkr.ecr.eu-west-1.amazonaws.com") != budget_key(
        "123456789012.dkr.ecr.us-west-2.amazonaws.com")
    assert budget_key("Registry.Example.com:5000") == "registry.example.com:5000"


def test_a_pull_costs_its_manifest_its_config_and_one_request_per_layer() -> None:
    assert pull_requests(30) == 32
    assert RegistryBudget(requests_per_second=32).pull_seconds(30) == 1.0
    with pytest.raises(ValueError, match="layers must be >= 0, got -1"):
        pull_requests(-1)


def test_the_byte_rate_costs_a_pull_when_it_is_the_slower() -> None:
    budget = RegistryBudget(requests_per_second=100, bytes_per_second=1000)
    assert budget.pull_seconds(8, size_bytes=5000) == 5.0
    assert budget.pull_seconds(8, size_bytes=10) == 0.1
    assert budget.pull_seconds(8) == 0.1
    assert budget.pull_seconds(None) == 0.32  # unknown layers: costed as 30


def test_the_default_leaves_headroom_under_ecr_s_layer_quota() -> None:
    assert DEFAULT_REQUESTS_PER_SECOND == 0.8 * ECR_LAYER_REQUESTS_PER_SECOND
    assert not RegistryBudget(requests_per_second=0).enabled
    assert RegistryBudget(requests_per_second=0).pull_seconds(30) == 0.0


def test_starts_come_at_once_within_the_burst_then_at_the_rate() -> None:
    reservation = reserve_starts(None, now=10.0, costs=[0.5] * 5, burst_seconds=1.0)
    assert reservation.starts == (10.0, 10.0, 10.5, 11.0, 11.5)
    assert reservation.tat == 12.5


def test_a_second_batch_continues_where_the_first_left_and_an_idle_budget_refills() -> None:
    first = reserve_starts(None, now=0.0, costs=[1.0] * 3, burst_seconds=1.0)
    second = reserve_starts(first.tat, now=0.0, costs=[1.0], burst_seconds=1.0)
    assert first.starts == (0.0, 1.0, 2.0)
    assert second.starts == (3.0,) and second.tat == 4.0
    idle = reserve_starts(first.tat, now=100.0, costs=[1.0, 1.0], burst_seconds=1.0)
    assert idle.starts == (100.0, 101.0)


def test_no_second_of_starts_spends_more_than_the_rate_and_the_burst() -> None:
    rate, costs = 100.0, [11 / 100.0] * 1000  # 11 requests a pull at 100 requests a second
    starts = reserve_starts(None, now=0.0, costs=costs, burst_seconds=1.0).starts
    for second in range(int(starts[-1]) + 1):
        spent = sum(11 for s in starts if second <= s < second + 1)
        assert spent <= rate * (1.0 + 1.0), second  # a burst of 1 s, then 1 s at the rate
    assert starts[-1] == pytest.approx(1000 * 0.11 - 1.0)  # the budget spent with it, less the burst


def test_a_negative_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="cost must be >= 0 seconds, got -1"):
        reserve_starts(None, now=0.0, costs=[-1.0], burst_seconds=1.0)


def test_overrides_are_keyed_as_the_registry_s_budget_and_bad_ones_name_the_host_and_field() -> None:
    budgets = RegistryBudgets.parse(RegistryBudget(), {
        "123456789012.dkr.ecr.us-west-2.amazonaws.com": {"requestsPerSecond": 20, "bytesPerSecond": 1e9}})
    assert budgets.of("ecr:123456789012:us-west-2") == RegistryBudget(20, 1e9)
    assert budgets.of("ghcr.io") == RegistryBudget()
    with pytest.raises(BudgetConfigError, match=r"registry budget of ghcr\.io: unknown field\(s\) rps"):
        RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"rps": 1}})
    with pytest.raises(BudgetConfigError, match=r"ghcr\.io: requestsPerSecond must be >= 0, got -1"):
        RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"requestsPerSecond": -1}})
    with pytest.raises(BudgetConfigError, match=r"ghcr\.io: expected an object"):
        RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": 5})
    with pytest.raises(BudgetConfigError, match="bytesPerSecond must be > 0 when set, got 0"):
        RegistryBudget(bytes_per_second=0)
    with pytest.raises(BudgetConfigError, match="burstSeconds must be >= 0, got -1"):
        RegistryBudget(burst_seconds=-1)


def test_a_registry_s_assumed_layer_count_costs_its_pulls_of_unknown_layers_and_is_kept_with_the_budget() -> None:
    budgets = RegistryBudgets.parse(RegistryBudget(requests_per_second=10), {"ghcr.io": {"layersIfUnknown": 8}})
    ghcr = budgets.of("ghcr.io")
    assert (ghcr.requests_per_second, ghcr.layers_if_unknown) == (10, 8)
    assert ghcr.pull_seconds(None) == 1.0 and ghcr.pull_seconds(18) == 2.0  # 2 + 8, 2 + 18 requests
    assert budgets.of("quay.io").pull_seconds(None) == 3.2  # the default: 2 + 30
    state = BudgetState(5.0, ghcr)
    assert BudgetState.of_item(state.fields()) == state
    assert BudgetState.of_item({"tat": 5.0, "requests_per_second": 10}).budget.layers_if_unknown == 30  # older item
    with pytest.raises(BudgetConfigError, match=r"ghcr\.io: layersIfUnknown must be a whole number, got 2\.5"):
        RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"layersIfUnknown": 2.5}})
    with pytest.raises(BudgetConfigError, match=r"ghcr\.io: layersIfUnknown must be >= 0, got -1"):
        RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"layersIfUnknown": -1}})


def test_without_a_burst_starts_come_one_cost_apart_from_now() -> None:
    assert RegistryBudget().burst_seconds == 0.0
    assert reserve_starts(None, now=5.0, costs=[0.25] * 4, burst_seconds=0.0).starts == (5.0, 5.25, 5.5, 5.75)


def test_a_registry_s_429_is_told_from_other_pull_errors() -> None:
    assert is_throttled("unexpected status code https://x/v2/a/blobs/sha256:0: 429 Too Many Requests - Server "
                        "message: toomanyrequests: Rate exceeded")
    assert is_throttled("toomanyrequests: Rate exceeded")
    assert not is_throttled("401 Unauthorized") and not is_throttled("sha256:4290 not found")
    assert is_throttled_report("throttled by the registry, retrying in 2s")
    assert not is_throttled_report("pulling for 3s")


def test_throttle_backoff_doubles_from_1_s_to_30_s_with_jitter() -> None:
    rng = random.Random(7)
    assert all(0.5 <= throttle_backoff(1, rng) <= 1.0 for _ in range(50))
    assert all(15.0 <= throttle_backoff(9, rng) <= 30.0 for _ in range(50))
    with pytest.raises(ValueError, match="throttles start at 1, got 0"):
        throttle_backoff(0)


def test_an_invalid_registry_budgets_entry_fails_the_functions_settings_at_cold_start_naming_it() -> None:
    # Before: the settings read fine and the first send of tasks failed, minutes later, in one function.
    import pytest

    from prewarm.settings import Settings, SettingsError

    env = {"TABLE_NAME": "jobs", "REGISTRY_BUDGETS": '{"quay.io": {"requestsPerSecond": -1}}'}
    with pytest.raises(SettingsError, match=r"invalid REGISTRY_BUDGETS: registry budget of quay\.io: "
                                            r"requestsPerSecond must be >= 0, got -1"):
        Settings.from_env(env)
    assert Settings.from_env({**env, "REGISTRY_BUDGETS": '{"quay.io": {"requestsPerSecond": 5}}'})


def test_a_byte_budget_alone_costs_a_pull_its_bytes_and_neither_rate_means_no_budget() -> None:
    # Before: requestsPerSecond 0 made every pull cost 0 s, the byte budget with it.
    bytes_only = RegistryBudget(requests_per_second=0, bytes_per_second=1000)
    assert bytes_only.pull_seconds(8, size_bytes=5000) == 5.0
    assert bytes_only.pull_seconds(8) == 0.0  # size unknown: nothing to cost it by
    assert bytes_only.paces and not bytes_only.enabled  # requests are not counted
    assert not RegistryBudget(requests_per_second=0).paces
    assert RegistryBudget().paces


def test_a_host_s_entry_inherits_the_default_byte_budget_and_0_turns_it_off() -> None:
    # Before: an entry without bytesPerSecond dropped the global byte budget for its host.
    default = RegistryBudget(requests_per_second=10, bytes_per_second=1e9)
    budgets = RegistryBudgets.parse(default, {"ghcr.io": {"layersIfUnknown": 12},
                                              "quay.io": {"bytesPerSecond": 0},
                                              "docker.io": {"bytesPerSecond": None},
                                              "gcr.io": {"bytesPerSecond": 5e8}})
    assert budgets.of("ghcr.io") == RegistryBudget(10, 1e9, layers_if_unknown=12)
    assert budgets.of("quay.io").bytes_per_second is None and budgets.of("quay.io").requests_per_second == 10
    assert budgets.of("docker.io").bytes_per_second is None
    assert budgets.of("gcr.io").bytes_per_second == 5e8
    off = RegistryBudgets.parse(default, {"quay.io": {"requestsPerSecond": 0, "bytesPerSecond": 0}}).of("quay.io")
    assert not off.paces
    with pytest.raises(BudgetConfigError, match=r"quay\.io: bytesPerSecond must be > 0 when set, got -1"):
        RegistryBudgets.parse(default, {"quay.io": {"bytesPerSecond": -1}})
