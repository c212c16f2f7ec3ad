"""Registry credentials: docker config parsing, the kubelet's keyring lookup and ECR registry hosts.

``Keyring`` follows the kubelet's credential keyring (kubernetes ``pkg/credentialprovider/keyring.go``):

* each docker config key gets ``https://`` when it has no scheme, is parsed as a URL, loses a leading
  ``/v1/`` or ``/v2/`` path and becomes ``host`` or ``host/path`` (``BasicDockerKeyring.Add``);
* keys are tried in reverse string order, so ``quay.io/team`` before ``quay.io``, and every matching
  credential is returned (``Lookup``);
* a key matches an image when the ports are equal, the hosts have the same number of dot-separated
  parts, each part matches as a Go ``filepath.Match`` glob, and the key's path is a string prefix of the
  image's path (``URLsMatch``); so ``*.kubernetes.io`` does not match ``kubernetes.io``;
* when nothing matches and the image looks like a Docker Hub image (``isDefaultRegistryMatch``), the
  ``index.docker.io`` credentials (also written ``https://index.docker.io/v1/``) are returned;
* the image is matched by its normalised name without tag or digest, as the kubelet passes it.

Go's ``url.Parse`` is reproduced closely enough for registry keys (scheme, userinfo, host, port, path,
query and fragment); a key it would reject is skipped like the kubelet does and listed in
``Keyring.ignored_servers``. Percent-escapes in a host are treated as invalid.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from prewarm.domain.images import DEFAULT_REGISTRY, LEGACY_DEFAULT_REGISTRY, parse_image

_DEFAULT_REGISTRY_KEY: Final = LEGACY_DEFAULT_REGISTRY


class InvalidCredentialsError(ValueError):
    """Registry credentials that cannot be read. Messages never contain secret values."""


class InvalidDockerConfigError(InvalidCredentialsError):
    """A ``.dockerconfigjson`` or ``.dockercfg`` document that the kubelet would fail to read."""

    def __init__(self, reason: str, server: str | None = None, field: str | None = None) -> None:
        self.server = server
        self.field = field
        self.reason = reason
        where = ""
        if server is not None:
            where += f"entry {json.dumps(server)}: "
        if field is not None:
            where += f"field {json.dumps(field)} "
        super().__init__(f"invalid docker config: {where}{reason}")


@dataclass(frozen=True, slots=True, repr=False)
class RegistryAuth:
    """A username and password for a registry ``server`` (the docker config key as written)."""

    username: str
    password: str
    server: str

    def __repr__(self) -> str:
        # Tokens must never reach logs.
        return f"RegistryAuth(server={self.server!r}, username={self.username!r}, password='***')"

    __str__ = __repr__

    @property
    def auth(self) -> str:
        """The docker config ``auth`` field: base64 of ``username:password``."""
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")

    @classmethod
    def from_basic_token(cls, token: str, server: str) -> RegistryAuth:
        """Decode a base64 ``user:password`` token, such as an ECR authorizationToken, for ``server``."""
        username, password = _decode_basic(
            token,
            lambda reason: InvalidCredentialsError(f"authorization token for {json.dumps(server)} {reason}"),
        )
        return cls(username=username, password=password, server=server)


def _decode_basic(token: str, error: Callable[[str], Exception]) -> tuple[str, str]:
    # Go's base64.StdEncoding skips CR and LF, then needs canonical padding.
    cleaned = token.replace("\r", "").replace("\n", "")
    try:
        decoded = base64.b64decode(cleaned, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        # "from None": a UnicodeDecodeError would carry the secret bytes into tracebacks.
        raise error("is not valid base64 of UTF-8 text") from None
    username, colon, password = decoded.partition(":")
    if not colon:
        raise error('must decode to "username:password"')
    return username, password


# --- Go net/url and net helpers, as far as registry keys need them -------------------------------

_SCHEME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# Non-ASCII as the negated class `[^\x00-\x7f]`, not the range `\x80-\U0010ffff`: the same characters,
# but a range that wide takes `re` about 7 ms per pattern to compile, on every cold start.
_HOST_CHARS_RE: Final = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:\[\]<>\"]|[^\x00-\x7f])*")
_PORT_RE: Final = re.compile(r"(?::[0-9]*)?")
_USERINFO_RE: Final = re.compile(r"(?:[A-Za-z0-9\-._:~!$&'()*+,;=%@]|[^\x00-\x7f])*")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE_RE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class _Url:
    host: str  # with port and brackets, as Go's URL.Host
    path: str


def _parse_url(raw: str) -> _Url | None:
    """Go's url.Parse for ``scheme://authority/path`` strings; None where Go returns an error."""
    if _CONTROL_RE.search(raw):
        return None
    rest = raw.partition("#")[0]
    scheme, colon, rest = rest.partition(":")
    rest = rest.partition("?")[0]
    if not colon or not _SCHEME_RE.fullmatch(scheme) or not rest.startswith("//"):
        return None
    authority, slash, path = rest[2:].partition("/")
    userinfo, at, host = authority.rpartition("@")
    if at and not _USERINFO_RE.fullmatch(userinfo):
        return None
    if host.startswith("["):
        close = host.rfind("]")
        if close < 0 or not _PORT_RE.fullmatch(host[close + 1 :]):
            return None
    elif ":" in host and not _PORT_RE.fullmatch(host[host.rfind(":") :]):
        return None
    path = slash + path
    if not _HOST_CHARS_RE.fullmatch(host) or _BAD_ESCAPE_RE.search(path):
        return None
    return _Url(host=host, path=unquote(path))


def _split_host_port(hostport: str) -> tuple[str, str]:
    """Go's net.SplitHostPort, falling back to (hostport, "") on error as the kubelet does."""
    failed = (hostport, "")
    colon = hostport.rfind(":")
    if colon < 0:
        return failed
    start, end_search = 0, 0
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0 or close + 1 != colon:
            return failed
        host = hostport[1:close]
        start, end_search = 1, close + 1
    else:
        host = hostport[:colon]
        if ":" in host:
            return failed
    if "[" in hostport[start:] or "]" in hostport[end_search:]:
        return failed
    return host, hostport[colon + 1 :]


def _glob_regex(pattern: str) -> re.Pattern[str] | None:
    """Translate a Go filepath.Match pattern (Unix) into a regex; None for a malformed pattern."""

    def class_char(i: int) -> tuple[str, int] | None:
        if i >= len(pattern) or pattern[i] in "-]":
            return None
        if pattern[i] == "\\":
            i += 1
            if i >= len(pattern):
                return None
        # Go also fails when the class is not closed after this character.
        return (pattern[i], i + 1) if i + 1 < len(pattern) else None

    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "\\":
            if i + 1 >= len(pattern):
                return None
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif char == "[":
            i += 1
            negated = i < len(pattern) and pattern[i] == "^"
            i += 1 if negated else 0
            ranges: list[tuple[str, str]] = []
            while not (i < len(pattern) and pattern[i] == "]" and ranges):
                low = class_char(i)
                if low is None:
                    return None
                lo, i = low
                hi = lo
                if pattern[i] == "-":
                    high = class_char(i + 1)
                    if high is None:
                        return None
                    hi, i = high
                ranges.append((lo, hi))
            i += 1
            # Go accepts an inverted range such as z-a; it matches nothing.
            items = "".join(f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in ranges if lo <= hi)
            out.append((f"[^{items}]" if items else r"[\s\S]") if negated else (f"[{items}]" if items else "(?!)"))
        else:
            out.append(re.escape(char))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _urls_match(glob: str, target: str) -> bool:
    """The kubelet's URLsMatchStr: does registry key ``glob`` cover image name ``target``?"""
    glob_url, target_url = _parse_url("https://" + glob), _parse_url("https://" + target)
    if glob_url is None or target_url is None:
        return False
    glob_host, glob_port = _split_host_port(glob_url.host)
    target_host, target_port = _split_host_port(target_url.host)
    glob_parts, target_parts = glob_host.split("."), target_host.split(".")
    if glob_port != target_port or len(glob_parts) != len(target_parts):
        return False
    if not target_url.path.startswith(glob_url.path):
        return False
    for glob_part, target_part in zip(glob_parts, target_parts, strict=True):
        regex = _glob_regex(glob_part)
        if regex is None or not regex.fullmatch(target_part):
            return False
    return True


def _is_default_registry_match(name: str) -> bool:
    """The kubelet's isDefaultRegistryMatch; note it also holds for ``localhost/...`` names."""
    first, slash, _ = name.partition("/")
    if not first:
        return False
    if not slash or first in (DEFAULT_REGISTRY, LEGACY_DEFAULT_REGISTRY):
        return True
    return "." not in first and ":" not in first


def keyring_key(server: str) -> str | None:
    """The key the kubelet files ``server`` under (``host[/path]``), or None when it cannot parse it."""
    value = server if server.startswith(("https://", "http://")) else "https://" + server
    parsed = _parse_url(value)
    if parsed is None:
        return None
    path = parsed.path
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return parsed.host + path if path and path != "/" else parsed.host


# --- docker config documents ---------------------------------------------------------------------


def _json_field(obj: Mapping[str, Any], name: str) -> Any:
    # Go's encoding/json matches keys case-insensitively; the last matching key wins, null is skipped.
    value = None
    for key, item in obj.items():
        if isinstance(key, str) and key.casefold() == name and item is not None:
            value = item
    return value


def _string_field(entry: Mapping[str, Any], name: str, server: str) -> str:
    value = _json_field(entry, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidDockerConfigError(f"must be a string, not {type(value).__name__}", server, name)
    return value


def _entry_auth(server: Any, entry: Any) -> RegistryAuth:
    if not isinstance(server, str):
        raise InvalidDockerConfigError(f"registry keys must be strings, not {type(server).__name__}")
    if not isinstance(entry, Mapping):
        raise InvalidDockerConfigError(
            f'must be an object with "username" and "password" or "auth", not {type(entry).__name__}', server
        )
    username = _string_field(entry, "username", server)
    password = _string_field(entry, "password", server)
    _string_field(entry, "email", server)
    if auth := _string_field(entry, "auth", server):
        username, password = _decode_basic(auth, lambda reason: InvalidDockerConfigError(reason, server, "auth"))
    return RegistryAuth(username=username, password=password, server=server)


def docker_config_auths(cfg: Mapping[str, Any]) -> list[RegistryAuth]:
    """The credentials of a ``{"auths": {...}}`` config or a legacy ``.dockercfg`` map, in order."""
    if not isinstance(cfg, Mapping):
        raise InvalidDockerConfigError(f"must be a JSON object, not {type(cfg).__name__}")
    has_auths = any(isinstance(key, str) and key.casefold() == "auths" for key in cfg)
    entries = (_json_field(cfg, "auths") or {}) if has_auths else cfg
    if not isinstance(entries, Mapping):
        raise InvalidDockerConfigError(f"must be an object, not {type(entries).__name__}", field="auths")
    return [_entry_auth(server, entry) for server, entry in entries.items()]


# --- the keyring ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tier:
    """One BasicDockerKeyring: keys reverse-sorted, credentials per key in the order added."""

    index: tuple[str, ...]
    creds: Mapping[str, tuple[RegistryAuth, ...]]

    @classmethod
    def build(cls, auths: Iterable[RegistryAuth]) -> tuple[_Tier, tuple[str, ...]]:
        creds: dict[str, list[RegistryAuth]] = {}
        ignored: list[str] = []
        for auth in auths:
            key = keyring_key(auth.server)
            if key is None:
                ignored.append(auth.server)
            else:
                creds.setdefault(key, []).append(auth)
        tier = cls(
            index=tuple(sorted(creds, reverse=True)),
            creds={key: tuple(found) for key, found in creds.items()},
        )
        return tier, tuple(ignored)

    def lookup(self, name: str) -> list[RegistryAuth]:
        found = [auth for key in self.index if _urls_match(key, name) for auth in self.creds[key]]
        if not found and _is_default_registry_match(name):
            found = list(self.creds.get(_DEFAULT_REGISTRY_KEY, ()))
        return found


class Keyring:
    """Registry credentials looked up per image exactly as the kubelet does."""

    __slots__ = ("_tiers", "ignored_servers")

    def __init__(self, auths: Iterable[RegistryAuth] = ()) -> None:
        tier, ignored = _Tier.build(auths)
        self._tiers: tuple[_Tier, ...] = (tier,)
        #: Config keys the kubelet cannot parse as URLs and so never uses.
        self.ignored_servers: tuple[str, ...] = ignored

    @classmethod
    def from_docker_config(cls, cfg: Mapping[str, Any]) -> Keyring:
        """A keyring from a parsed ``.dockerconfigjson`` (``{"auths": ...}``) or legacy ``.dockercfg``."""
        return cls(docker_config_auths(cfg))

    @classmethod
    def from_docker_configs(cls, cfgs: Iterable[Mapping[str, Any]]) -> Keyring:
        """One keyring from several configs, as the kubelet combines a pod's imagePullSecrets."""
        return cls(auth for cfg in cfgs for auth in docker_config_auths(cfg))

    @classmethod
    def from_docker_config_json(cls, raw: str | bytes) -> Keyring:
        """A keyring from the JSON text of a docker config secret."""
        try:
            cfg = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            # The position only: the document holds secrets.
            position = getattr(error, "pos", None)
            raise InvalidDockerConfigError(f"is not valid JSON (at character {position})") from None
        return cls.from_docker_config(cfg)

    def merge(self, *others: Keyring) -> Keyring:
        """The kubelet's union keyring: this keyring's matches first, then each other's in turn."""
        merged = Keyring()
        merged._tiers = self._tiers + tuple(tier for other in others for tier in other._tiers)
        merged.ignored_servers = self.ignored_servers + tuple(s for o in others for s in o.ignored_servers)
        return merged

    def lookup(self, image: str) -> list[RegistryAuth]:
        """Every credential that applies to ``image``, most specific key first; [] when none does."""
        name = parse_image(image).name
        return [auth for tier in self._tiers for auth in tier.lookup(name)]

    @property
    def auths(self) -> tuple[RegistryAuth, ...]:
        """All credentials, in lookup priority order."""
        return tuple(auth for tier in self._tiers for key in tier.index for auth in tier.creds[key])

    def to_docker_config(self) -> dict[str, dict[str, dict[str, str]]]:
        """``{"auths": {server: {username, password, auth}}}``; the first credential per server wins."""
        auths: dict[str, dict[str, str]] = {}
        for auth in self.auths:
            auths.setdefault(auth.server, {"username": auth.username, "password": auth.password, "auth": auth.auth})
        return {"auths": auths}

    def __len__(self) -> int:
        return len(self.auths)

    def __repr__(self) -> str:
        return f"Keyring(servers={[auth.server for auth in self.auths]!r})"


# --- ECR registries ------------------------------------------------------------------------------

# cloud-provider-aws cmd/ecr-credential-provider: ecrPrivateHostPattern.
_ECR_PRIVATE_HOST_RE: Final = re.compile(
    r"(\d{12})\.dkr([.\-])ecr(-fips)?\.([a-zA-Z0-9][a-zA-Z0-9_-]*)\."
    r"(amazonaws\.com(?:\.cn)?|on\.(?:aws|amazonwebservices\.com\.cn)|sc2s\.sgov\.gov|c2s\.ic\.gov"
    r"|cloud\.adc-e\.uk|csp\.hci\.ic\.gov)",
    re.ASCII,
)
ECR_PUBLIC_HOST: Final = "public.ecr.aws"
_PARTITION_BY_DOMAIN: Final[dict[str, str]] = {
    "amazonaws.com.cn": "aws-cn",
    "on.amazonwebservices.com.cn": "aws-cn",
    "c2s.ic.gov": "aws-iso",
    "sc2s.sgov.gov": "aws-iso-b",
    "cloud.adc-e.uk": "aws-iso-e",
    "csp.hci.ic.gov": "aws-iso-f",
}


@dataclass(frozen=True, slots=True)
class EcrRegistry:
    """An Amazon ECR registry host. Public ECR has no account or region."""

    host: str
    account: str | None
    region: str | None
    partition: str
    fips: bool = False
    dual_stack: bool = False
    public: bool = False


def parse_ecr_registry(host: str) -> EcrRegistry | None:
    """The ECR registry ``host`` names (no port, no path), or None when it is not an ECR host."""
    if host == ECR_PUBLIC_HOST:
        return EcrRegistry(host=host, account=None, region=None, partition="aws", public=True)
    match = _ECR_PRIVATE_HOST_RE.fullmatch(host)
    if match is None:
        return None
    account, dkr_separator, fips, region, domain = match.groups()
    partition = _PARTITION_BY_DOMAIN.get(domain) or ("aws-us-gov" if region.startswith("us-gov-") else "aws")
    return EcrRegistry(
        host=host,
        account=account,
        region=region,
        partition=partition,
        fips=fips is not None,
        dual_stack=dkr_separator == "-" or domain.startswith("on."),
    )


def ecr_registry_for(image_or_host: str) -> EcrRegistry | None:
    """The ECR registry of an image reference, host or ``host:port``, read as the ECR provider does."""
    value = image_or_host if "://" in image_or_host else "https://" + image_or_host
    parsed = _parse_url(value)
    if parsed is None:
        return None
    host = parsed.host
    colon = host.rfind(":")
    if colon >= 0 and _PORT_RE.fullmatch(host[colon:]):
        host = host[:colon]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return parse_ecr_registry(host)
