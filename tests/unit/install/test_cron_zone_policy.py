"""The policy that has the API server warn of an AdvancedCronJob resource with no time zone, evaluated offline
(cel-python) against the cron jobs `prewarm apply` warns of and those it does not: the same rule, the same
words, and a warning only."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from prewarm.domain.cronjobs import ZONE_NOT_GIVEN, AdvancedCronJob
from prewarm_cli.install.render import CRON_ZONE_POLICY
from tests.unit.install.test_manifests import one


def cron(schedule: str = "0 3 * * *", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "AdvancedCronJob",
            "metadata": {"name": "nightly", "namespace": "shop"},
            "spec": {"schedule": schedule, "template": {"imageListPullJobTemplate": {"spec": {
                "images": ["nginx:1.27"]}}}, **spec}}


def warned(obj: dict[str, Any]) -> list[str]:
    """The messages of the rendered policy's failed validations, as the API server evaluates it."""
    env = celpy.Environment()
    failed = []
    for validation in one("ValidatingAdmissionPolicy", CRON_ZONE_POLICY)["spec"]["validations"]:
        program = env.program(env.compile(validation["expression"]))
        if not program.evaluate({"object": celpy.json_to_cel(obj)}):
            failed.append(validation["message"])
    return failed


@pytest.mark.parametrize("obj", [cron(), cron(timeZone="Europe/Berlin"), cron("CRON_TZ=Asia/Tokyo 0 3 * * *"),
                                 cron("TZ=UTC @daily")])
def test_the_policy_warns_of_what_prewarm_apply_warns_of_in_its_words(obj: dict[str, Any]) -> None:
    assert warned(obj) == AdvancedCronJob.from_manifest(obj).warnings()


def test_it_warns_only_and_selects_the_cron_job_resources() -> None:
    assert warned(cron()) == [ZONE_NOT_GIVEN]
    assert one("ValidatingAdmissionPolicyBinding", CRON_ZONE_POLICY)["spec"] == {
        "policyName": CRON_ZONE_POLICY, "validationActions": ["Warn"]}
    policy = one("ValidatingAdmissionPolicy", CRON_ZONE_POLICY)["spec"]
    assert policy["failurePolicy"] == "Ignore"
    assert policy["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["prewarm.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["advancedcronjobs"]}]
