"""Access reviews: a SelfSubjectAccessReview (for the caller) or SubjectAccessReview (for anyone) answered
by the authorizer, and a SelfSubjectReview (`kubectl auth whoami`): the caller as authentication and
impersonation made it."""

from __future__ import annotations

import time
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.protobuf import PROTOBUF, ProtobufError, decode_review
from prewarm_devtools.kubeapi.rbac import Attributes, Authorizer
from prewarm_devtools.kubeapi.registry import Registry
from prewarm_devtools.kubeapi.resourcerequests import Target, decode_body
from prewarm_devtools.kubeapi.resources.reviews import SELF_SUBJECT_ACCESS_REVIEWS
from prewarm_devtools.kubeapi.store import dumps
from prewarm_devtools.kubeapi.transport import Response


def _asked(attributes: Any, resource_request: bool = True) -> Attributes:
    """The attributes an access review's `resourceAttributes` or `nonResourceAttributes` give."""
    if not isinstance(attributes, dict):
        raise errors.bad_request("the attributes of an access review must be an object")

    def text(key: str) -> str:
        return str(attributes.get(key) or "")

    if not resource_request:
        return Attributes(verb=text("verb"), resource_request=False, path=text("path"))
    return Attributes(
        verb=text("verb"),
        resource_request=True,
        group=text("group"),
        version=text("version"),
        resource=text("resource"),
        subresource=text("subresource"),
        namespace=text("namespace"),
        name=text("name"),
    )


def access_review(
    registry: Registry, authorizer: Authorizer, method: str, target: Target, identity: Identity, headers: Any,
    body: bytes,
) -> Response:
    """Answer a SelfSubjectAccessReview (for the caller) or SubjectAccessReview (for anyone)."""
    rtype = target.rtype
    if method != "POST" or target.name is not None:
        raise errors.method_not_allowed()
    if (headers.get("Content-Type") or "").split(";")[0].strip().lower() == PROTOBUF:
        try:
            decoded: Any = decode_review(body)
        except (ProtobufError, UnicodeDecodeError) as e:
            raise errors.bad_request(f"cannot decode the protobuf {rtype.kind}: {e}") from None
    else:
        decoded = decode_body(headers, body)
    review = registry.check_body(rtype, decoded)
    spec = review.get("spec")
    if not isinstance(spec, dict):
        spec = review["spec"] = {}
    problems = []
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if resource is not None and non_resource is not None:
        problems.append(
            FieldError(
                "Invalid",
                "spec.nonResourceAttributes",
                non_resource,
                "cannot be specified in combination with resourceAttributes",
            )
        )
    elif resource is None and non_resource is None:
        problems.append(
            FieldError(
                "Invalid",
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        )
    if rtype is SELF_SUBJECT_ACCESS_REVIEWS:
        subject = identity
    else:
        groups = spec.get("groups") or []
        if not spec.get("user") and not groups:
            problems.append(
                FieldError(
                    "Invalid",
                    "spec.user",
                    spec.get("user") or "",
                    "at least one of user or group must be specified",
                )
            )
        subject = Identity(str(spec.get("user") or ""), tuple(str(g) for g in groups), str(spec.get("uid") or ""))
    if problems:
        raise errors.invalid(rtype.kind, "", problems, rtype.group)
    asked = _asked(resource) if resource is not None else _asked(non_resource, resource_request=False)
    decision = authorizer.authorize(subject, asked)
    status: dict[str, Any] = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    review["metadata"] = {"creationTimestamp": None}
    review["status"] = status
    return Response(201, dumps(review))


def self_subject_review(
    registry: Registry, method: str, target: Target, identity: Identity, headers: Any, body: bytes
) -> Response:
    """Answer a SelfSubjectReview (`kubectl auth whoami`): the caller as authentication (and
    impersonation) made it."""
    rtype = target.rtype
    if method != "POST" or target.name is not None:
        raise errors.method_not_allowed()
    # The review asks nothing but who calls: kubectl's protobuf body (metadata only) is not read.
    if (headers.get("Content-Type") or "").split(";")[0].strip().lower() != PROTOBUF:
        registry.check_body(rtype, decode_body(headers, body))
    user: dict[str, Any] = {"username": identity.user, "groups": list(identity.groups)}
    if identity.uid:
        user["uid"] = identity.uid
    if identity.extra:
        user["extra"] = identity.extra_map
    review = {
        "kind": rtype.kind,
        "apiVersion": rtype.api_version,
        "metadata": {"creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "status": {"userInfo": user},
    }
    return Response(201, dumps(review))
