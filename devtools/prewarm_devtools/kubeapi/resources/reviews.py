"""The reviews (authorization.k8s.io/v1 and authentication.k8s.io/v1): answered by accessreviews.py, never
stored, so create is their only verb."""

from __future__ import annotations

from functools import partial

from prewarm_devtools.kubeapi.resources.types import ResourceType

AUTHORIZATION_GROUP = "authorization.k8s.io"
AUTHENTICATION_GROUP = "authentication.k8s.io"

_review_type = partial(ResourceType, namespaced=False, verbs=("create",))

SELF_SUBJECT_ACCESS_REVIEWS = _review_type(
    name="selfsubjectaccessreviews",
    singular="selfsubjectaccessreview",
    kind="SelfSubjectAccessReview",
    group=AUTHORIZATION_GROUP,
)
SUBJECT_ACCESS_REVIEWS = _review_type(
    name="subjectaccessreviews",
    singular="subjectaccessreview",
    kind="SubjectAccessReview",
    group=AUTHORIZATION_GROUP,
)
# Who the caller is, as authentication saw it (`kubectl auth whoami`).
SELF_SUBJECT_REVIEWS = _review_type(
    name="selfsubjectreviews",
    singular="selfsubjectreview",
    kind="SelfSubjectReview",
    group=AUTHENTICATION_GROUP,
)
