"""Image references: kubelet grammar, normalisation, default pull policy and the pull decision."""

import pydantic
import pytest

from prewarm.domain.images import (
    ImageRef,
    InvalidImageReference,
    parse_image,
)

SHA = "sha256:" + "4f6a2e1b" * 8
SHA512 = "sha512:" + "0123456789abcdef" * 8


# Every example of https://kubernetes.io/docs/concepts/containers/images/ plus the registries we target.
@pytest.mark.parametrize(
    ("reference", "registry", "repository", "tag", "digest", "pull_reference"),
    [
        ("busybox", "docker.io", "library/busybox", None, None, "docker.io/library/busybox:latest"),
        (
            "busybox:1.32.0",
            "docker.io",
            "library/busybox",
            "1.32.0",
            None,
            "docker.io/library/busybox:1.32.0",
        ),
        (
            "registry.k8s.io/pause:latest",
            "registry.k8s.io",
            "pause",
            "latest",
            None,
            "registry.k8s.io/pause:latest",
        ),
        ("registry.k8s.io/pause:3.5", "registry.k8s.io", "pause", "3.5", None, "registry.k8s.io/pause:3.5"),
        (f"busybox@{SHA}", "docker.io", "library/busybox", None, SHA, f"docker.io/library/busybox@{SHA}"),
        (
            f"registry.k8s.io/pause:3.5@{SHA}",
            "registry.k8s.io",
            "pause",
            "3.5",
            SHA,
            f"registry.k8s.io/pause@{SHA}",
        ),
        ("library/busybox", "docker.io", "library/busybox", None, None, "docker.io/library/busybox:latest"),
        ("bitnami/redis:7", "docker.io", "bitnami/redis", "7", None, "docker.io/bitnami/redis:7"),
        ("docker.io/busybox", "docker.io", "library/busybox", None, None, "docker.io/library/busybox:latest"),
        (
            "index.docker.io/busybox",
            "docker.io",
            "library/busybox",
            None,
            None,
            "docker.io/library/busybox:latest",
        ),
        (
            "index.docker.io/bitnami/redis",
            "docker.io",
            "bitnami/redis",
            None,
            None,
            "docker.io/bitnami/redis:latest",
        ),
        ("localhost/app", "localhost", "app", None, None, "localhost/app:latest"),
        (
            "localhost:5000/team/app:v1",
            "localhost:5000",
            "team/app",
            "v1",
            None,
            "localhost:5000/team/app:v1",
        ),
        (
            "fictional.registry.example:10443/a/b/c:1.0",
            "fictional.registry.example:10443",
            "a/b/c",
            "1.0",
            None,
            "fictional.registry.example:10443/a/b/c:1.0",
        ),
        ("127.0.0.1:5000/app", "127.0.0.1:5000", "app", None, None, "127.0.0.1:5000/app:latest"),
        ("[::1]:5000/app:v2", "[::1]:5000", "app", "v2", None, "[::1]:5000/app:v2"),
        ("[2001:db8::1]/app", "[2001:db8::1]", "app", None, None, "[2001:db8::1]/app:latest"),
        ("myhost:5000/app", "myhost:5000", "app", None, None, "myhost:5000/app:latest"),
        (
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app:2024-01-01",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            "team/app",
            "2024-01-01",
            None,
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app:2024-01-01",
        ),
        ("public.ecr.aws/nginx/nginx:1.27", "public.ecr.aws", "nginx/nginx", "1.27", None, None),
        ("a.b/x__y.z--w-v_u", "a.b", "x__y.z--w-v_u", None, None, None),
        ("busybox:Latest_1.0-rc.1", "docker.io", "library/busybox", "Latest_1.0-rc.1", None, None),
        (f"app@{SHA512}", "docker.io", "library/app", None, SHA512, None),
        # A single component is always a Docker Hub name, even if it looks like a host.
        ("localhost", "docker.io", "library/localhost", None, None, None),
        ("localhost:5000", "docker.io", "library/localhost", "5000", None, None),
        ("example.com", "docker.io", "library/example.com", None, None, None),
        # distribution treats an uppercase first component as a host: Hub namespaces are lowercase.
        ("Registry/app", "Registry", "app", None, None, "Registry/app:latest"),
    ],
)
def test_parse_image_normalises_like_the_kubelet(
    reference: str,
    registry: str,
    repository: str,
    tag: str | None,
    digest: str | None,
    pull_reference: str | None,
) -> None:
    # Given a reference as written in a pod spec / When parsed
    ref = parse_image(reference)

    # Then registry, repository, tag and digest are the kubelet's
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert ref.name == f"{registry}/{repository}"
    if pull_reference is not None:
        assert ref.pull_reference == pull_reference
    assert parse_image(str(ref)) == ref


def test_format_gives_the_full_normalised_reference_with_tag_and_digest() -> None:
    # Given a reference with both a tag and a digest
    ref = parse_image(f"index.docker.io/busybox:1.36@{SHA}")

    # Then format() keeps both while pull_reference pins the digest only
    assert ref.format() == f"docker.io/library/busybox:1.36@{SHA}"
    assert str(ref) == ref.format()
    assert ref.pull_reference == f"docker.io/library/busybox@{SHA}"


PATH_RULE = "must be lowercase letters and digits separated by '.', '_', '__' or dashes"
TAG_RULE = "is not valid: up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'"
HOST_RULE = "is not a valid host name, IPv4 or [IPv6] address with an optional :port"
DIGEST_FORM = "must be <algorithm>:<hex>, e.g. sha256:<64 hex characters>"
LOWER_HEX = "sha256 digest must contain only lowercase hex digits (0-9, a-f)"
EMPTY_COMPONENT = "repository path has an empty component (leading, trailing or doubled '/')"


@pytest.mark.parametrize(
    ("reference", "reason"),
    [
        ("Busybox", "repository name must be lowercase"),
        ("example.com/Team/app", "repository name must be lowercase"),
        ("", "image reference must not be empty"),
        ("busybox:", 'tag after ":" is empty'),
        ("busybox:-1", f'tag "-1" {TAG_RULE}'),
        ("busybox:.hidden", f'tag ".hidden" {TAG_RULE}'),
        ("busybox:a+b", f'tag "a+b" {TAG_RULE}'),
        ("busybox@sha256:abc", "sha256 digest must have exactly 64 hex characters, got 3"),
        ("busybox@sha256:" + "a" * 63, "sha256 digest must have exactly 64 hex characters, got 63"),
        ("busybox@sha256:" + "A" * 64, LOWER_HEX),
        ("busybox@sha256:" + "g" * 64, LOWER_HEX),
        ("busybox@md5:" + "a" * 32, 'unsupported digest algorithm "md5": use one of sha256, sha384, sha512'),
        ("busybox@SHA256:" + "a" * 64, "digest algorithm must be lowercase, e.g. sha256"),
        ("busybox@", f'digest "" {DIGEST_FORM}'),
        ("busybox@sha256", f'digest "sha256" {DIGEST_FORM}'),
        ("example.com//app", EMPTY_COMPONENT),
        ("example.com/app/", EMPTY_COMPONENT),
        ("example.com/a_-b", f'repository path component "a_-b" {PATH_RULE}'),
        ("example.com/a___b", f'repository path component "a___b" {PATH_RULE}'),
        ("example.com/-app", f'repository path component "-app" {PATH_RULE}'),
        ("busybox\n", f'repository path component "busybox\\n" {PATH_RULE}'),
        (" busybox", f'repository path component " busybox" {PATH_RULE}'),
        ("registry:port/app", f'registry host "registry:port" {HOST_RULE}'),
        ("-bad.example/app", f'registry host "-bad.example" {HOST_RULE}'),
        ("foo.bar_baz/app", f'registry host "foo.bar_baz" {HOST_RULE}'),
        ("[fe80::1%eth0]:5000/app", f'registry host "[fe80::1%eth0]:5000" {HOST_RULE}'),
        ("a" * 64, "a 64-character hex string is an image ID, not a repository name; use name@sha256:<hex>"),
    ],
)
def test_invalid_reference_is_rejected_naming_what_is_wrong(reference: str, reason: str) -> None:
    # Given a reference the kubelet refuses / When parsed / Then the error says why
    with pytest.raises(InvalidImageReference) as caught:
        parse_image(reference)

    assert caught.value.reason == reason
    assert caught.value.reference == reference
    assert isinstance(caught.value, ValueError)


def test_invalid_reference_message_quotes_the_reference_then_the_reason() -> None:
    with pytest.raises(InvalidImageReference) as caught:
        parse_image("Busybox")

    assert str(caught.value) == 'invalid image reference "Busybox": repository name must be lowercase'


def test_tag_may_be_128_characters_but_not_129() -> None:
    assert parse_image("busybox:" + "t" * 128).tag == "t" * 128

    with pytest.raises(InvalidImageReference, match="tag"):
        parse_image("busybox:" + "t" * 129)


def test_repository_path_may_be_255_characters_without_the_registry() -> None:
    # Given a path of exactly 255 characters behind a long registry name
    path = "team/" + "a" * 250

    # Then it parses: distribution counts the path only
    assert parse_image(f"very.long.registry.example.com:5000/{path}").repository == path


def test_repository_path_of_256_characters_is_too_long() -> None:
    path = "team/" + "a" * 251

    with pytest.raises(InvalidImageReference) as caught:
        parse_image(f"example.com/{path}")

    assert caught.value.reason == "repository name must not be more than 255 characters (got 256)"


def test_docker_hub_library_prefix_counts_towards_the_length_limit() -> None:
    # "library/" makes a 248-character familiar name 256 long
    with pytest.raises(InvalidImageReference, match=r"\(got 256\)"):
        parse_image("a" * 248)
    assert parse_image("a" * 247).repository == "library/" + "a" * 247


def test_sha384_and_sha512_digests_need_their_own_lengths() -> None:
    assert parse_image("app@sha384:" + "b" * 96).digest == "sha384:" + "b" * 96
    with pytest.raises(InvalidImageReference, match="sha512 digest must have exactly 128 hex characters, got 64"):
        parse_image("app@sha512:" + "b" * 64)


def test_a_non_string_reference_is_rejected() -> None:
    with pytest.raises(InvalidImageReference, match="must be a string, not int"):
        parse_image(42)  # type: ignore[arg-type]


def job_model() -> type[pydantic.BaseModel]:
    """A model with an ImageRef field. Defined when called: pydantic builds its schema at class creation,
    which must happen in the test, not at import (mutation testing swaps the code each test runs)."""

    class _Job(pydantic.BaseModel):
        image: ImageRef

    return _Job


def test_pydantic_models_accept_an_image_string_and_serialise_it_back() -> None:
    # Given a model with an ImageRef field / When validated from JSON
    _Job = job_model()
    job = _Job.model_validate_json('{"image": "busybox:1.36"}')

    # Then the field is parsed and dumps as the normalised string
    assert job.image == ImageRef("docker.io", "library/busybox", "1.36")  # type: ignore[attr-defined]
    assert job.model_dump() == {"image": "docker.io/library/busybox:1.36"}
    assert job.model_dump_json() == '{"image":"docker.io/library/busybox:1.36"}'
    assert _Job(image=job.image).image is job.image  # type: ignore[attr-defined]
    assert _Job.model_json_schema()["properties"]["image"]["type"] == "string"


def test_pydantic_validation_error_carries_the_reference_message() -> None:
    with pytest.raises(pydantic.ValidationError, match="repository name must be lowercase"):
        job_model().model_validate({"image": "Busybox"})
