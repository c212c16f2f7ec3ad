"""A namespace's warm budget: the rule (`prewarm.domain.warm_budgets`)."""

from __future__ import annotations

import pytest

from prewarm.domain.kubernetes import LabelSelector
from prewarm.domain.warm_budgets import (
    BudgetPolicy,
    ImageCost,
    LabelReach,
    WarmBudget,
    WarmBudgetExceededError,
    fit,
    parse_bytes,
    usage_line,
)

MIB = 2**20
BUDGET = WarmBudget("team-a", 100 * MIB)


def image(name: str, mib: int | None, digest: str = "") -> ImageCost:
    return ImageCost(f"reg.io/{name}:v1", digest or f"sha256:{name}", None if mib is None else mib * MIB)


def test_a_job_within_the_budget_beside_what_is_kept_is_accepted() -> None:
    found = fit(BUDGET, [image("b", 40)], [image("a", 60)], BudgetPolicy.REFUSE, can_trim=False)

    assert (found.refused, found.kept_bytes, found.job_bytes) == (False, 60 * MIB, 40 * MIB)
    assert found.note() == ""


def test_a_job_beyond_the_budget_is_refused_with_every_figure() -> None:
    found = fit(BUDGET, [image("b", 41)], [image("a", 60)], BudgetPolicy.REFUSE, can_trim=False)

    assert found.refused
    assert found.refusal("ImagePullJob team-a/web") == (
        "ImagePullJob team-a/web refused: namespace team-a keeps at most 104857600 bytes (100.0 MiB) of images "
        "warm per node; its other jobs keep 62914560 bytes (60.0 MiB) and this job adds 42991616 bytes (41.0 MiB) "
        "(policy Refuse; annotation prewarm.dev/warm-bytes-per-node)")


def test_a_digest_two_jobs_want_counts_once() -> None:
    kept = [image("a", 60), ImageCost("reg.io/a@sha256:a", "sha256:a", 60 * MIB)]
    same = ImageCost("reg.io/a:latest", "sha256:a", 60 * MIB)

    found = fit(BUDGET, [same, image("b", 40)], kept, BudgetPolicy.REFUSE, can_trim=False)

    assert (found.refused, found.kept_bytes, found.job_bytes) == (False, 60 * MIB, 40 * MIB)


def test_a_list_job_under_trim_keeps_its_images_in_order_while_they_fit() -> None:
    images = [image("b", 30), image("c", 20), image("d", 5), image("e", 1)]

    found = fit(BUDGET, images, [image("a", 60)], BudgetPolicy.TRIM, can_trim=True)

    assert not found.refused
    assert [i.reference for i in found.accepted] == ["reg.io/b:v1", "reg.io/d:v1", "reg.io/e:v1"]
    assert [i.reference for i in found.trimmed] == ["reg.io/c:v1"]
    assert found.note() == ("trimmed by namespace team-a's budget of 104857600 bytes (100.0 MiB) per node (policy "
                            "Trim): reg.io/c:v1 not pulled; 100663296 bytes (96.0 MiB) kept with this job")


def test_trim_cannot_split_a_single_image_job_nor_a_list_none_of_whose_images_fit() -> None:
    assert fit(BUDGET, [image("b", 50)], [image("a", 60)], BudgetPolicy.TRIM, can_trim=False).refused
    assert fit(BUDGET, [image("b", 50), image("c", 41)], [image("a", 60)], BudgetPolicy.TRIM, can_trim=True).refused


def test_an_image_of_unknown_size_is_not_counted_and_the_verdict_says_so() -> None:
    found = fit(BUDGET, [image("b", None)], [image("a", 100), image("k", None)], BudgetPolicy.REFUSE,
                can_trim=False)

    assert not found.refused
    assert found.job_bytes == 0
    assert found.note() == "size unknown at apply, not counted against the budget: reg.io/b:v1, reg.io/k:v1"


def test_a_job_that_adds_nothing_is_accepted_over_a_budget_since_lowered() -> None:
    found = fit(WarmBudget("team-a", 10 * MIB), [image("a", 60)], [image("a", 60)], BudgetPolicy.REFUSE,
                can_trim=False)

    assert not found.refused


def test_the_namespace_annotations_declare_the_budget_and_a_bad_one_refuses_everything() -> None:
    def namespace(**notes: str) -> dict[str, object]:
        return {"metadata": {"name": "team-a", "annotations": notes}}

    assert WarmBudget.of_namespace(namespace()) is None
    assert WarmBudget.of_namespace(namespace(**{"prewarm.dev/warm-bytes-per-node": "20Gi",
                                                "prewarm.dev/warm-budget-policy": "Trim"})) == WarmBudget(
        "team-a", 20 * 2**30, BudgetPolicy.TRIM)
    bad = WarmBudget.of_namespace(namespace(**{"prewarm.dev/warm-bytes-per-node": "lots"}))
    assert bad is not None
    assert bad.problem == ('namespace team-a: annotation prewarm.dev/warm-bytes-per-node: not a number of bytes: '
                           '"lots" (give bytes, or a quantity such as 20Gi or 500M)')
    assert fit(bad, [image("b", 1)], [], BudgetPolicy.REFUSE, can_trim=False).refusal("ImagePullJob team-a/w") == (
        "ImagePullJob team-a/w refused: " + bad.problem)
    policy = WarmBudget.of_namespace(namespace(**{"prewarm.dev/warm-bytes-per-node": "1",
                                                  "prewarm.dev/warm-budget-policy": "Drop"}))
    assert policy is not None and policy.problem == (
        'namespace team-a: annotation prewarm.dev/warm-budget-policy: unsupported value "Drop": supported values: '
        '"Refuse", "Trim"')


def test_a_jobs_own_policy_annotation_overrides_the_namespaces() -> None:
    def manifest(policy: str) -> dict[str, object]:
        return {"metadata": {"annotations": {"prewarm.dev/warm-budget-policy": policy}}}

    assert BUDGET.policy_for({"metadata": {}}) is BudgetPolicy.REFUSE
    assert BUDGET.policy_for(manifest("Trim")) is BudgetPolicy.TRIM
    with pytest.raises(WarmBudgetExceededError, match=r'metadata.annotations\[prewarm.dev/warm-budget-policy\]: '
                                                      r'unsupported value "trim"'):
        BUDGET.policy_for(manifest("trim"))


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("1k", 1000), ("3Mi", 3 * MIB), ("2G", 2 * 10**9)])
def test_sizes_read_as_kubernetes_quantities(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_jobs_that_name_disjoint_nodes_never_share_one_and_do_not_add_up() -> None:
    gpu, cpu = frozenset({"gpu-1", "gpu-2"}), frozenset({"cpu-1"})

    found = fit(BUDGET, [image("b", 70).on(cpu)], [image("a", 70).on(gpu)], BudgetPolicy.REFUSE, can_trim=False,
                nodes=cpu)

    assert (found.refused, found.kept_bytes, found.job_bytes, found.node) == (False, 0, 70 * MIB, "cpu-1")


def test_a_job_on_nodes_it_shares_with_another_is_refused_on_the_fullest_naming_it() -> None:
    kept = [image("a", 70).on(frozenset({"n1"})), image("c", 10).on(frozenset({"n2"})), image("d", 5)]

    found = fit(BUDGET, [image("b", 30)], kept, BudgetPolicy.REFUSE, can_trim=False, nodes=frozenset({"n1", "n2"}))

    assert (found.refused, found.node, found.kept_bytes, found.job_bytes) == (True, "n1", 75 * MIB, 30 * MIB)
    assert "per node; on node n1 its other jobs keep 78643200 bytes (75.0 MiB)" in found.refusal("ImagePullJob x/y")


def test_a_job_that_may_reach_any_node_meets_every_node_another_job_names() -> None:
    kept = [image("a", 70).on(frozenset({"n1"})), image("d", 5)]

    refused = fit(BUDGET, [image("b", 30)], kept, BudgetPolicy.REFUSE, can_trim=False)
    fits = fit(BUDGET, [image("b", 25)], kept, BudgetPolicy.REFUSE, can_trim=False)

    assert (refused.refused, refused.node, refused.kept_bytes) == (True, "n1", 75 * MIB)
    assert not fits.refused


def test_the_usage_shown_is_the_fullest_nodes() -> None:
    kept = [image("a", 70).on(frozenset({"n1"})), image("c", 10).on(frozenset({"n2"})), image("d", 5)]

    assert usage_line(BUDGET, kept) == ("namespace team-a: 78643200 bytes (75.0 MiB) of 104857600 bytes (100.0 MiB) "
                                        "per node kept on node n1 (policy Refuse)")


def pool(**labels: str) -> LabelReach:
    return LabelReach.of(LabelSelector(match_labels=labels))


def pools(key: str, operator: str, *values: str) -> LabelReach:
    return LabelReach.of(LabelSelector(match_expressions=[{"key": key, "operator": operator, "values": list(values)
                                                           if values else None}]))


@pytest.mark.parametrize(("mine", "theirs", "share"), [
    (pool(pool="a"), pool(pool="b"), False),
    (pool(pool="a"), pool(pool="a", gpu="x"), True),
    (pool(pool="a"), pool(gpu="x"), True),
    (pool(pool="a"), pools("pool", "In", "a", "b"), True),
    (pools("pool", "In", "c"), pools("pool", "In", "a", "b"), False),
    (pool(pool="a"), pools("pool", "NotIn", "a"), False),
    (pools("pool", "In", "a", "b"), pools("pool", "NotIn", "a"), True),
    (pool(pool="a"), pools("pool", "DoesNotExist"), False),
    (pool(pool="a"), pools("pool", "Exists"), True),
    (pool(pool="a"), LabelReach(), True),
], ids=["other-value", "narrower", "other-key", "in-set", "disjoint-sets", "not-in", "not-in-part", "absent",
        "exists", "any"])
def test_two_label_selectors_share_a_node_unless_no_node_can_meet_both(
        mine: LabelReach, theirs: LabelReach, share: bool) -> None:
    assert (mine.shares_a_node_with(theirs), theirs.shares_a_node_with(mine)) == (share, share)


def test_jobs_on_pools_no_node_is_in_both_of_do_not_add_up_and_one_that_may_meet_both_sees_both() -> None:
    gpu, cpu = pool(pool="gpu"), pool(pool="cpu")
    kept = [image("a", 70).on(None, gpu)]

    beside = fit(BUDGET, [image("b", 70).on(None, cpu)], kept, BudgetPolicy.REFUSE, can_trim=False, labels=cpu)
    over = fit(BUDGET, [image("c", 40).on(None, gpu)], kept, BudgetPolicy.REFUSE, can_trim=False, labels=gpu)
    either = fit(BUDGET, [image("d", 40)], [*kept, image("b", 70).on(None, cpu)], BudgetPolicy.REFUSE,
                 can_trim=False, labels=pools("pool", "In", "gpu", "cpu"))

    assert (beside.refused, beside.kept_bytes) == (False, 0)
    assert (over.refused, over.kept_bytes) == (True, 70 * MIB)
    assert "per node; on nodes pool in (gpu) its other jobs keep 73400320 bytes" in over.refusal("ImagePullJob x/y")
    assert (either.refused, either.kept_bytes) == (True, 140 * MIB)  # it cannot tell which pool: both count


def test_the_usage_shown_is_the_fullest_pools() -> None:
    kept = [image("a", 70).on(None, pool(pool="gpu")), image("b", 20).on(None, pool(pool="cpu")),
            image("c", 5).on(None, pool(pool="cpu"))]

    assert usage_line(BUDGET, kept) == ("namespace team-a: 73400320 bytes (70.0 MiB) of 104857600 bytes (100.0 MiB) "
                                        "per node kept on nodes pool in (gpu) (policy Refuse)")
