"""Container image references, parsed and normalised exactly as the kubelet does.

The kubelet parses ``spec.containers[].image`` with ``ParseNormalizedNamed`` from
github.com/distribution/reference (v0.6, vendored by Kubernetes) and digests with
github.com/opencontainers/go-digest. This module reproduces that grammar and normalisation:

* ``busybox`` -> ``docker.io/library/busybox``; ``index.docker.io/x`` -> ``docker.io/library/x``;
* the first path component is the registry when it contains ``.`` or ``:``, is ``localhost``,
  or has an uppercase letter (distribution's rule: Docker Hub namespaces are lowercase);
* the 255-character limit applies to the repository path without the registry, as in
  distribution v0.6 (``RepositoryNameTotalLengthMax``);
* a digest must be ``sha256``/``sha384``/``sha512`` with exactly 64/96/128 lowercase hex digits.

Decision: the grammar is written here rather than wrapping ``docker-image-py``. That port accepts a
trailing newline (its patterns end in ``$``, so ``"busybox\\n"`` parses), adds a host check that
distribution does not have, reports only generic errors ("invalid reference format") and is untyped.
The messages here name the part at fault. One deliberate difference from the kubelet: a first
component that contains ``.`` but is not a valid host (``foo.bar_baz/x``) is an error here, where
distribution yields a name with an empty domain that no registry can serve.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

DEFAULT_REGISTRY: Final = "docker.io"
LEGACY_DEFAULT_REGISTRY: Final = "index.docker.io"
OFFICIAL_REPOSITORY_PREFIX: Final = "library/"
DEFAULT_TAG: Final = "latest"
REPOSITORY_NAME_MAX_LENGTH: Final = 255

# distribution/reference regexp.go, with Go's ASCII-only \w and [[:xdigit:]] spelled out.
_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6_ADDRESS = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN_AND_PORT = rf"(?:{_DOMAIN_NAME}|{_IPV6_ADDRESS})(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

# Always used with fullmatch: Python's "$" would also match before a trailing newline.
# Groups: registry (absent when the grammar reads the first component as part of the path), repository, tag, digest.
_REFERENCE_RE: Final = re.compile(rf"(?:({_DOMAIN_AND_PORT})/)?({_REMOTE_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?")
_IDENTIFIER_RE: Final = re.compile(r"[a-f0-9]{64}")
_DOMAIN_AND_PORT_RE: Final = re.compile(_DOMAIN_AND_PORT)
_PATH_COMPONENT_RE: Final = re.compile(_PATH_COMPONENT)
_TAG_RE: Final = re.compile(_TAG)
_DIGEST_RE: Final = re.compile(_DIGEST)

# An image name (registry and repository, no tag or digest), for schemas that check references
# themselves (the CRDs' `pattern`s, prewarm.domain.jobs).
NAME_PATTERN: Final = rf"(?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME}"
TAG_PATTERN: Final = _TAG

# go-digest: the registered algorithms and the hex length each needs.
DIGEST_HEX_LENGTHS: Final[dict[str, int]] = {"sha256": 64, "sha384": 96, "sha512": 128}
_LOWER_HEX_RE: Final = re.compile(r"[a-f0-9]+")


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


class InvalidImageReference(ValueError):
    """An image reference the kubelet would refuse; the message says which part is wrong."""

    def __init__(self, reference: str, reason: str) -> None:
        self.reference = reference
        self.reason = reason
        super().__init__(f"invalid image reference {_quote(reference)}: {reason}")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A parsed, normalised image reference. Build one with :func:`parse_image`."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``registry/repository``, e.g. ``docker.io/library/busybox``."""
        return f"{self.registry}/{self.repository}"

    @property
    def pull_reference(self) -> str:
        """What to pull: ``name@digest`` when pinned (the tag is then ignored), else ``name:tag``."""
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or DEFAULT_TAG}"

    def format(self) -> str:
        """The full normalised reference, ``name[:tag][@digest]``; parses back to an equal ImageRef."""
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # Lets pydantic models declare `image: ImageRef`: validated from a string, serialised as one.
        from_string = core_schema.no_info_after_validator_function(parse_image, core_schema.str_schema())
        return core_schema.json_or_python_schema(
            json_schema=from_string,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_string]),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


def _split_docker_domain(reference: str) -> tuple[str, str]:
    """distribution's splitDockerDomain: decide whether the first component is a registry."""
    first, slash, rest = reference.partition("/")
    if not slash:
        return DEFAULT_REGISTRY, OFFICIAL_REPOSITORY_PREFIX + reference
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remote = first, rest
    else:
        domain, remote = DEFAULT_REGISTRY, reference
    if domain == LEGACY_DEFAULT_REGISTRY:
        domain = DEFAULT_REGISTRY
    if domain == DEFAULT_REGISTRY and "/" not in remote:
        remote = OFFICIAL_REPOSITORY_PREFIX + remote
    return domain, remote


def digest_problem(digest: str) -> str | None:
    """Why go-digest would reject ``digest``, or None when it is valid."""
    algorithm, colon, encoded = digest.partition(":")
    if not algorithm or not colon or not encoded:
        return f"digest {_quote(digest)} must be <algorithm>:<hex>, e.g. sha256:<64 hex characters>"
    expected = DIGEST_HEX_LENGTHS.get(algorithm)
    if expected is None:
        return f"unsupported digest algorithm {_quote(algorithm)}: use one of {', '.join(DIGEST_HEX_LENGTHS)}"
    if len(encoded) != expected:
        return f"{algorithm} digest must have exactly {expected} hex characters, got {len(encoded)}"
    if not _LOWER_HEX_RE.fullmatch(encoded):
        return f"{algorithm} digest must contain only lowercase hex digits (0-9, a-f)"
    return None


def _explain(domain: str, remainder: str) -> str:
    """Name the part of ``domain/remainder`` that breaks the reference grammar."""
    before_digest, at, digest = remainder.partition("@")
    path, colon, tag = before_digest.partition(":")
    if at and not _DIGEST_RE.fullmatch(digest):
        return digest_problem(digest) or f"digest {_quote(digest)} is not <algorithm>:<hex>"
    if colon and not _TAG_RE.fullmatch(tag):
        if not tag:
            return 'tag after ":" is empty'
        return (
            f"tag {_quote(tag)} is not valid: up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'"
        )
    if not _DOMAIN_AND_PORT_RE.fullmatch(domain):
        return f"registry host {_quote(domain)} is not a valid host name, IPv4 or [IPv6] address with an optional :port"
    # The digest, tag and host are valid, so the grammar refused the path: one of its components.
    component = next(c for c in path.split("/") if not _PATH_COMPONENT_RE.fullmatch(c))
    if not component:
        return "repository path has an empty component (leading, trailing or doubled '/')"
    return (
        f"repository path component {_quote(component)} must be lowercase letters and digits "
        "separated by '.', '_', '__' or dashes"
    )


def parse_image(reference: str) -> ImageRef:
    """Parse and normalise ``reference`` as the kubelet does; raise InvalidImageReference if it is invalid."""
    if not isinstance(reference, str):
        raise InvalidImageReference(str(reference), f"must be a string, not {type(reference).__name__}")
    if not reference:
        raise InvalidImageReference(reference, "image reference must not be empty")
    if _IDENTIFIER_RE.fullmatch(reference):
        raise InvalidImageReference(
            reference,
            "a 64-character hex string is an image ID, not a repository name; use name@sha256:<hex>",
        )
    domain, remainder = _split_docker_domain(reference)
    remote = remainder.partition(":")[0]
    if remote.lower() != remote:
        if remote.partition("@")[0].lower() == remote.partition("@")[0]:
            raise InvalidImageReference(reference, "digest algorithm must be lowercase, e.g. sha256")
        raise InvalidImageReference(reference, "repository name must be lowercase")

    match = _REFERENCE_RE.fullmatch(f"{domain}/{remainder}")
    if match is None:
        raise InvalidImageReference(reference, _explain(domain, remainder))
    registry, repository, tag, digest = match.groups()
    if len(repository) > REPOSITORY_NAME_MAX_LENGTH:
        raise InvalidImageReference(
            reference,
            f"repository name must not be more than {REPOSITORY_NAME_MAX_LENGTH} characters (got {len(repository)})",
        )
    if digest and (problem := digest_problem(digest)):
        raise InvalidImageReference(reference, problem)
    if registry != domain:
        raise InvalidImageReference(reference, _explain(domain, remainder))
    return ImageRef(registry=domain, repository=repository, tag=tag, digest=digest)


