"""Whether pods may use an image the agent warmed without credentials of their own (KEP-2535).

From Kubernetes 1.35 the kubelet checks a pod's pull credentials before it starts a container from an
image that is already on the node (KEP-2535 "Ensure Secret Pulled Images"; feature gate
`KubeletEnsureSecretPulledImages`: alpha and off in 1.33 and 1.34, beta and on by default from
1.35). Its kubelet configuration field `imagePullCredentialsVerificationPolicy` says which images it
checks (kubernetes `pkg/kubelet/images/pullmanager/image_pull_policies.go`):

- `NeverVerify`: none; any pod on the node may use any image present.
- `NeverVerifyPreloadedImages` (the default with the gate on): only images the kubelet pulled itself.
- `NeverVerifyAllowlistedImages`: every image but those `preloadedImagesVerificationAllowlist` names
  (an image name without tag or digest, or a prefix ending in `/*`).
- `AlwaysVerify`: every image.

The kubelet counts an image as its own when it holds a pull record for the image's ID or a pull intent
for the image (`image_pull_manager.go`, `MustAttemptImagePull`). An image pulled through the CRI by
anything else, Prewarm's agent included, has neither: it is "preloaded". With the gate off (the field
is then left empty) or before 1.33, nothing is checked: as `NeverVerify`.

So a private image the agent warmed with shared credentials (the registry copies or its own role,
`prewarm_agent.credentials`) is usable by every pod on that node unless the policy checks it; under
`AlwaysVerify` the kubelet asks the registry for the manifest with the pod's own credentials, and the
warm layers still save the download.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.registries import ecr_registry_for

POLICY_FIELD = "imagePullCredentialsVerificationPolicy"
ALLOWLIST_FIELD = "preloadedImagesVerificationAllowlist"
FEATURE_GATE = "KubeletEnsureSecretPulledImages"


class VerificationPolicy(StrEnum):
    """`imagePullCredentialsVerificationPolicy`, as the kubelet configuration spells it."""

    NEVER_VERIFY = "NeverVerify"
    NEVER_VERIFY_PRELOADED = "NeverVerifyPreloadedImages"
    NEVER_VERIFY_ALLOWLISTED = "NeverVerifyAllowlistedImages"
    ALWAYS_VERIFY = "AlwaysVerify"


class KubeletConfigError(ValueError):
    """A `/configz` answer that is not a kubelet configuration; the message says what is wrong."""


def _allowlisted(image: str, allowlist: Sequence[str]) -> bool:
    """The kubelet's match: the image's name without tag or digest equals an entry, or starts with an
    entry's `host/path/` when the entry ends in `/*`. An image that does not parse matches nothing."""
    try:
        name = parse_image(image).name
    except InvalidImageReference:
        return False
    for entry in allowlist:
        if entry.endswith("/*") and name.startswith(entry[:-1]):
            return True
        if name == entry:
            return True
    return False


@dataclass(frozen=True)
class KubeletImagePolicy:
    """A node's kubelet policy for images already present. `policy` None: the kubelet checks nothing
    (feature gate off, or a kubelet before 1.33); `unknown` holds a value this code does not know."""

    policy: VerificationPolicy | None
    allowlist: tuple[str, ...] = ()
    unknown: str = ""

    @classmethod
    def from_configz(cls, doc: Any) -> KubeletImagePolicy:
        """The policy of a kubelet's `/configz` answer, `{"kubeletconfig": {...}}`."""
        config = doc.get("kubeletconfig") if isinstance(doc, Mapping) else None
        if not isinstance(config, Mapping):
            raise KubeletConfigError('the answer has no "kubeletconfig" object')
        gates = config.get("featureGates")
        gate = gates.get(FEATURE_GATE) if isinstance(gates, Mapping) else None
        value = config.get(POLICY_FIELD)
        allowlist = config.get(ALLOWLIST_FIELD) or []
        if not isinstance(allowlist, list) or not all(isinstance(e, str) for e in allowlist):
            raise KubeletConfigError(f"{ALLOWLIST_FIELD} is not a list of strings")
        if gate is False or value in (None, ""):
            return cls(None)
        try:
            return cls(VerificationPolicy(value), tuple(allowlist))
        except ValueError:
            return cls(None, unknown=str(value))

    def lets_any_pod_use(self, image: str | None) -> bool:
        """Whether any pod on the node may use `image` once the agent pulled it, without credentials of
        its own. None: an image not known yet (a rule's next push), which an allowlist may name when it
        names anything. An unknown policy counts as letting them (the safe reading for a warning)."""
        if self.policy is None or self.policy is VerificationPolicy.NEVER_VERIFY:
            return True
        if self.policy is VerificationPolicy.NEVER_VERIFY_PRELOADED:
            return True  # the agent's pulls are preloaded to the kubelet
        if self.policy is VerificationPolicy.NEVER_VERIFY_ALLOWLISTED:
            return bool(self.allowlist) if image is None else _allowlisted(image, self.allowlist)
        return False

    def describe(self) -> str:
        """`NeverVerifyPreloadedImages`, `not enforced (...)`, or the unknown value."""
        if self.unknown:
            return f"unknown policy {self.unknown!r}"
        if self.policy is None:
            return f"not enforced (kubelet before 1.35, or feature gate {FEATURE_GATE} off)"
        return str(self.policy)


def pulls_with_shared_credentials(image: str, pull_secrets_only: bool) -> bool:
    """Whether the agent may pull `image` with credentials shared by every job: the refresher's registry
    copy or the agent's own role, which the agent uses for private ECR hosts (after the job's pull
    secrets). `spec.pullSecretsOnly` jobs never do; ECR Public and other registries get no shared
    credential (anonymous, or the job's secrets)."""
    if pull_secrets_only:
        return False
    try:
        registry = ecr_registry_for(parse_image(image).registry)
    except InvalidImageReference:
        return False
    return registry is not None and not registry.public


def warm_credentials(image: str, pull_secrets: Sequence[str], pull_secrets_only: bool) -> str:
    """How the agent authenticates a job's pull: `shared` (a credential every job may use, see
    `pulls_with_shared_credentials`), `own` (the job's pull secrets only), or `none` (a public or
    unauthenticated image as far as Prewarm knows: no secrets and no private ECR host)."""
    if pulls_with_shared_credentials(image, pull_secrets_only):
        return "shared"
    return "own" if pull_secrets else "none"
