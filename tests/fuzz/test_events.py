"""EventBridge "ECR Image Action" events into `on_image_push`: jobs, or an error naming the field.

The events are the sample push with fields deleted, replaced by garbage or added, and plain garbage.
The handler answers with its result, an `EventError` naming the event's fields, or a
`JobValidationError` naming what of the push cannot make a job (a digest, a repository name).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prewarm import bootstrap
from prewarm.domain.kubernetes import JobValidationError
from prewarm.events import EventError, parse_ecr_event
from prewarm.services.jobs import apply_manifest
from tests.fuzz.strategies import PYDANTIC_WORDING, json_values, mutated
from tests.support.events import load_event
from tests.support.handlers import load_handler

RULE = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "all"},
        "spec": {"repositories": ["*"], "tags": ["*"], "includeUntagged": True}}
PUSH = load_event("ecr_push")
details = st.fixed_dictionaries({
    "repository-name": st.sampled_from(["ml/llm", "Team/App", "a//b", "", "x" * 300]) | st.text(max_size=20),
    "image-digest": st.sampled_from(["sha256:" + "a" * 64, "sha256:abc", "SHA256:" + "a" * 64, ""])
    | st.text(max_size=20),
    "image-tag": st.sampled_from(["v1", "", "latest"]) | st.text(max_size=10),
    "action-type": st.sampled_from(["PUSH", "DELETE"]), "result": st.sampled_from(["SUCCESS", "FAILURE"]),
})
events = st.one_of(
    mutated(st.just(PUSH)),
    st.builds(lambda detail: {**PUSH, "detail": {**PUSH["detail"], **detail}}, details).flatmap(
        lambda e: mutated(st.just(e))),
    json_values,
)

# The event's kind named (or its detail-type, when that is what is wrong), then the fields at fault.
ECR_EVENT_ERROR = re.compile(
    r"invalid ECR (event: detail-type: |(Image|Replication|Pull Through Cache) Action event: )")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events)
# Found by this test: a push naming no manifest media type, of a repository ECR cannot read, raised EcrError
@example({**PUSH, "detail": {k: v for k, v in PUSH["detail"].items() if k != "manifest-media-type"}})
def test_any_event_makes_jobs_or_an_error_naming_the_field(stack: dict[str, Any], event: Any) -> None:
    apply_manifest(bootstrap.store(), RULE, now=1.0)
    handler = load_handler("on_image_push")
    try:
        result = handler.lambda_handler(event, stack["ctx"])
    except EventError as e:
        assert ECR_EVENT_ERROR.match(str(e)) and not PYDANTIC_WORDING.search(str(e)), e
    except JobValidationError as e:
        assert all(p.path for p in e.errors) and not PYDANTIC_WORDING.search(str(e)), e
    else:
        assert set(result) == {"jobs"}


def test_an_event_missing_its_detail_fields_names_them_without_pydantic_wording() -> None:
    # Given a push event whose detail lost the repository and the action type
    event = {**PUSH, "detail": {"result": "SUCCESS", "image-digest": "sha256:" + "a" * 64}}
    # When it is parsed, then the error names both fields, in the event's words
    with pytest.raises(EventError) as raised:
        parse_ecr_event(event)
    assert str(raised.value) == ("invalid ECR Image Action event: detail.repository-name: Field required; "
                                 "detail.action-type: Field required")
