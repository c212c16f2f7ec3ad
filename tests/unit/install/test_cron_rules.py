"""Kruise's AdvancedCronJob cases (pkg/webhook/advancedcronjob, its tests and samples) through the
`advancedcronjobs.prewarm.dev` CRD as the embedded API evaluates it (`kubectl apply`) and through the model
(`prewarm apply`, the resource sync): what Kruise's webhook refuses, the CRD refuses at apply, naming the field
the model names; what only the model can check is listed with why."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from prewarm_cli.install.crds import custom_resource_definitions
from prewarm_devtools.kubeapi.customresources import custom_resource_types, definition_status
from prewarm_devtools.kubeapi.errors import FieldError
from tests.unit.domain.test_cronjobs import PR_2207_SAMPLE, REFUSED, cron, errors

Obj = dict[str, Any]
# Refused by the model only (so by the sync, in the resource's status message), and why the CRD cannot say it.
NOT_AT_APPLY = {"broken time zone": "whether a zone exists needs the time zone database"}


def served() -> Any:
    (crd,) = [c for c in custom_resource_definitions() if c["spec"]["names"]["kind"] == "AdvancedCronJob"]
    crd = copy.deepcopy(crd)
    definition_status(crd, [], "2026-11-28T00:00:00Z")
    (rtype,) = custom_resource_types(crd)
    return rtype


TYPE = served()


def resource(doc: Obj) -> Obj:
    return {**copy.deepcopy(doc), "apiVersion": "prewarm.dev/v1alpha1"}


def crd_errors(doc: Obj) -> list[FieldError]:
    assert TYPE.decode(doc) == []
    return TYPE.validate(doc, None)


@pytest.mark.parametrize("name", REFUSED)
def test_kruises_refusals_are_refused_at_apply_naming_the_models_field(name: str) -> None:
    doc = resource(REFUSED[name][0])
    found = crd_errors(doc)
    if name in NOT_AT_APPLY:
        assert found == [], f"the CRD refuses {name}: take it out of NOT_AT_APPLY"
        assert errors(doc), "the model refuses it"
        return
    assert found, f"the CRD accepts {name}"
    model_paths = [path for path, _ in errors(doc)]
    for error in found:
        if error.field == "<nil>":
            continue
        assert any(p == error.field or p.startswith((f"{error.field}.", f"{error.field}[")) or
                   error.field.startswith(p) for p in model_paths), f"{error} vs the model's {model_paths}"


def test_kruises_valid_cases_and_sample_are_accepted_with_its_defaults() -> None:
    import yaml

    for doc in (cron(), cron(schedule="1 0 * * *", timeZone="Asia/Shanghai", startingDeadlineSeconds=100,
                             concurrencyPolicy="Forbid"), resource(yaml.safe_load(PR_2207_SAMPLE))):
        doc = resource(doc)
        assert crd_errors(doc) == []
        assert errors(doc) == []
    sample = resource(yaml.safe_load(PR_2207_SAMPLE))
    crd_errors(sample)
    spec = sample["spec"]
    # SetDefaultsAdvancedCronJob's: Replace for an image list, not paused, 3 and 1 runs kept, completionPolicy
    assert (spec["concurrencyPolicy"], spec["paused"], spec["successfulJobsHistoryLimit"],
            spec["failedJobsHistoryLimit"]) == ("Replace", False, 3, 1)
    assert spec["template"]["imageListPullJobTemplate"]["spec"]["completionPolicy"] == {}


def test_what_the_crd_says_kubectl_prints_with_kruises_words() -> None:
    shown = {name: [str(e) for e in crd_errors(resource(REFUSED[name][0]))] for name in (
        "Allow with an image list", "ttlSecondsAfterFinished", "a job template", "TZ and timeZone",
        "deadline below the defaulted timeout")}
    assert shown == {
        "Allow with an image list": ['spec.concurrencyPolicy: Invalid value: "object": concurrencyPolicy should be '
                                     'Replace or Forbid, but current value is: Allow'],
        "ttlSecondsAfterFinished": [
            'spec.template.imageListPullJobTemplate.spec.completionPolicy.ttlSecondsAfterFinished: Invalid value: '
            '"object": ttlSecondsAfterFinished is not supported in advancedCronJob: successfulJobsHistoryLimit and '
            'failedJobsHistoryLimit keep finished runs'],
        "a job template": ['spec.template: Invalid value: "object": Prewarm runs only spec.template.imageListPull'
                           "JobTemplate; a jobTemplate or broadcastJobTemplate (pods) is for OpenKruise's controller"],
        "TZ and timeZone": ['spec.schedule: Invalid value: "object": cannot use both timeZone field and TZ or CRON_TZ '
                            'in schedule'],
        "deadline below the defaulted timeout": [
            'spec.template.imageListPullJobTemplate.spec.completionPolicy.activeDeadlineSeconds: Invalid value: '
            '"object": completionPolicy.activeDeadlineSeconds must be greater than pullPolicy.timeoutSeconds (600 '
            'when completionPolicy.type is not given)'],
    }


def test_names_are_atomic_lists_as_in_kruises_crd() -> None:
    spec = TYPE.custom.schema["properties"]["spec"]["properties"]
    selector = spec["template"]["properties"]["imageListPullJobTemplate"]["properties"]["spec"]["properties"][
        "selector"]
    assert selector["properties"]["names"]["x-kubernetes-list-type"] == "atomic"


def test_the_samplefiles_cron_jobs_are_accepted_at_apply_and_by_the_model() -> None:
    import yaml

    from tests.unit.install.test_job_rules import SAMPLES

    docs = [doc for path in sorted(SAMPLES.glob("jobs/*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "AdvancedCronJob"]
    assert len(docs) == 2
    for doc in docs:
        assert errors(doc) == []
        assert [str(e) for e in crd_errors(resource(doc))] == []
