"""What the API serves now: the built-in group versions and the served versions of established
CustomResourceDefinitions, and the discovery documents (`/api/v1`, `/apis`, `/apis/<group>`,
`/apis/<group>/<version>`) that follow from them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

from prewarm_devtools.kubeapi.customresources import CUSTOM_RESOURCE_DEFINITIONS
from prewarm_devtools.kubeapi.resources import GROUP_VERSIONS, RESOURCES
from prewarm_devtools.kubeapi.resources.admissionregistration import ADMISSION_GROUP
from prewarm_devtools.kubeapi.resources.types import ResourceType

Obj = dict[str, Any]

_APIEXTENSIONS = f"{CUSTOM_RESOURCE_DEFINITIONS.group}/v1"
#: The built-in group versions in the order `/apis` lists them, by plural name.
BUILT_IN_GROUP_VERSIONS: dict[str, dict[str, ResourceType]] = {}
for _gv, _served in GROUP_VERSIONS.items():
    BUILT_IN_GROUP_VERSIONS[_gv] = _served
    if _gv == f"{ADMISSION_GROUP}/v1":
        BUILT_IN_GROUP_VERSIONS[_APIEXTENSIONS] = {CUSTOM_RESOURCE_DEFINITIONS.name: CUSTOM_RESOURCE_DEFINITIONS}
#: The built-in stored resources, by plural name.
BUILT_IN: dict[str, ResourceType] = {**RESOURCES, CUSTOM_RESOURCE_DEFINITIONS.name: CUSTOM_RESOURCE_DEFINITIONS}
BUILT_IN_KINDS: dict[str, ResourceType] = {r.kind: r for r in BUILT_IN.values()}
_KUBE_VERSION = re.compile(r"v([1-9][0-9]*)(?:(alpha|beta)([1-9][0-9]*))?")


def version_priority(version: str) -> tuple[int, int, int, int, str]:
    """Sort key of versions as discovery orders them: GA, then beta, then alpha, newest first; others last."""
    match = _KUBE_VERSION.fullmatch(version)
    if not match:
        return (1, 0, 0, 0, version)
    stage = {None: 2, "beta": 1, "alpha": 0}[match.group(2)]
    return (0, -stage, -int(match.group(1)), -int(match.group(3) or 0), "")


class Catalog:
    """The served group versions; CRDs come and go with `define`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Both rebuilt on every change and swapped whole, so readers need no lock.
        self._definitions: dict[str, list[ResourceType]] = {}
        self._custom: dict[str, dict[str, ResourceType]] = {}

    def define(self, definition: str, types: list[ResourceType]) -> None:
        """Serve `types` (one per served version) for the CRD `definition`; none: serve nothing for it."""
        with self._lock:
            definitions = {name: served for name, served in self._definitions.items() if name != definition}
            if types:
                definitions[definition] = types
            custom: dict[str, dict[str, ResourceType]] = {}
            for name in sorted(definitions):
                for rtype in definitions[name]:
                    custom.setdefault(f"{rtype.group}/{rtype.version}", {})[rtype.name] = rtype
            self._definitions, self._custom = definitions, custom

    def definition(self, name: str) -> list[ResourceType]:
        """The served versions of the CRD `name`."""
        return list(self._definitions.get(name, ()))

    def served(self, group_version: str) -> Mapping[str, ResourceType] | None:
        """What `group_version` (`v1`, `apps/v1`, `prewarm.dev/v1alpha1`) serves by plural name, or None."""
        return BUILT_IN_GROUP_VERSIONS.get(group_version) or self._custom.get(group_version)

    def custom_types(self) -> list[ResourceType]:
        """One type per CRD (its storage version where served): what reaches each CRD's objects."""
        found = []
        for types in self._definitions.values():
            storage = types[0].custom.storage_version if types[0].custom else ""
            found.append(next((t for t in types if t.version == storage), types[0]))
        return found

    def stored_types(self) -> list[ResourceType]:
        return [*BUILT_IN.values(), *self.custom_types()]

    def find(self, resource: str) -> ResourceType | None:
        """A type by plural name (`pods`) or plural and group (`imagepulljobs.prewarm.dev`)."""
        if resource in BUILT_IN:
            return BUILT_IN[resource]
        return next((t for t in self.custom_types() if resource in (t.name, t.storage)), None)

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """The type of an object's apiVersion and kind (built-ins by kind alone, as seeding takes them)."""
        served = self._custom.get(api_version) or {}
        return next((t for t in served.values() if t.kind == kind), None) or BUILT_IN_KINDS.get(kind)

    def group_versions(self) -> dict[str, Mapping[str, ResourceType]]:
        """Every served group version: the built-in ones, then the CRDs' groups by name, versions by priority."""
        custom = self._custom
        ordered = sorted(custom, key=lambda gv: (gv.split("/")[0], version_priority(gv.split("/")[1])))
        return {**BUILT_IN_GROUP_VERSIONS, **{gv: custom[gv] for gv in ordered if gv not in BUILT_IN_GROUP_VERSIONS}}

    def api_groups(self) -> list[Obj]:
        """The `APIGroup`s of `/apis`: every served group but the core one."""
        versions: dict[str, list[str]] = {}
        for group_version in self.group_versions():
            if "/" in group_version:
                name, version = group_version.split("/")
                versions.setdefault(name, []).append(version)
        groups = []
        for name, names in versions.items():
            listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in names]
            groups.append({"name": name, "versions": listed, "preferredVersion": listed[0]})
        return groups

    def discovery(self, group_version: str) -> Obj:
        """The `APIResourceList` of `/api/v1` or `/apis/<group>/<version>`."""
        entries: list[Obj] = []
        for r in sorted((self.served(group_version) or {}).values(), key=lambda r: r.name):
            entry: Obj = {
                "name": r.name,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            if r.categories:
                entry["categories"] = list(r.categories)
            entries.append(entry)
            if r.has_status:
                entries.append(
                    {
                        "name": f"{r.name}/status",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        if "/" not in group_version:
            return {"kind": "APIResourceList", "groupVersion": group_version, "resources": entries}
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}
