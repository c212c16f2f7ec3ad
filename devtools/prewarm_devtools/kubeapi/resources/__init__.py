"""The built-in resource types served, a module an API group (pods apart from the rest of core/v1),
and the tables of them that discovery and routing read. `ResourceType` (types.py) also describes the
resources of CRDs (customresources.py), and catalog.py adds the CRDs' own type.

Per type: scope, discovery entry, supported field selectors (pkg/apis/core/v1/conversion.go and
each registry's strategy), strategic-merge list keys (the OpenAPI `x-kubernetes-patch-merge-key`
of release 1.37), defaulting, create/update preparation (status reset, generation, immutable
fields) and validation.
"""

from __future__ import annotations

from prewarm_devtools.kubeapi.resources.admissionregistration import (
    ADMISSION_GROUP,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from prewarm_devtools.kubeapi.resources.apps import APPS_GROUP, DAEMON_SETS
from prewarm_devtools.kubeapi.resources.core import (
    CONFIG_MAPS,
    EVENTS,
    NAMESPACES,
    NODES,
    SECRETS,
    SERVICE_ACCOUNTS,
)
from prewarm_devtools.kubeapi.resources.pods import PODS
from prewarm_devtools.kubeapi.resources.rbac import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    RBAC_GROUP,
    ROLE_BINDINGS,
    ROLES,
)
from prewarm_devtools.kubeapi.resources.reviews import (
    AUTHENTICATION_GROUP,
    AUTHORIZATION_GROUP,
    SELF_SUBJECT_ACCESS_REVIEWS,
    SELF_SUBJECT_REVIEWS,
    SUBJECT_ACCESS_REVIEWS,
)
from prewarm_devtools.kubeapi.resources.scheduling import PRIORITY_CLASSES, SCHEDULING_GROUP
from prewarm_devtools.kubeapi.resources.types import ResourceType

#: The stored resources, by plural name (unique across the served groups).
RESOURCES: dict[str, ResourceType] = {
    r.name: r
    for r in (
        CONFIG_MAPS,
        EVENTS,
        NAMESPACES,
        NODES,
        PODS,
        SECRETS,
        SERVICE_ACCOUNTS,
        DAEMON_SETS,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        ROLES,
        ROLE_BINDINGS,
        PRIORITY_CLASSES,
        VALIDATING_ADMISSION_POLICIES,
        VALIDATING_ADMISSION_POLICY_BINDINGS,
    )
}
REVIEWS: dict[str, ResourceType] = {r.name: r for r in (SELF_SUBJECT_ACCESS_REVIEWS, SUBJECT_ACCESS_REVIEWS)}


def _group(group: str) -> dict[str, ResourceType]:
    return {name: r for name, r in RESOURCES.items() if r.group == group}


#: What each served group version serves, by plural name; groups in the order `/apis` lists them.
GROUP_VERSIONS: dict[str, dict[str, ResourceType]] = {
    "v1": _group(""),
    f"{APPS_GROUP}/v1": _group(APPS_GROUP),
    f"{ADMISSION_GROUP}/v1": _group(ADMISSION_GROUP),
    f"{AUTHENTICATION_GROUP}/v1": {SELF_SUBJECT_REVIEWS.name: SELF_SUBJECT_REVIEWS},
    f"{AUTHORIZATION_GROUP}/v1": REVIEWS,
    f"{RBAC_GROUP}/v1": _group(RBAC_GROUP),
    f"{SCHEDULING_GROUP}/v1": _group(SCHEDULING_GROUP),
}
