"""Registry credentials: docker config documents, the kubelet keyring lookup and ECR hosts."""

import base64

import pytest

from prewarm.domain.images import InvalidImageReference
from prewarm.domain.registries import (
    EcrRegistry,
    InvalidCredentialsError,
    InvalidDockerConfigError,
    Keyring,
    RegistryAuth,
    docker_config_auths,
    ecr_registry_for,
    keyring_key,
    parse_ecr_registry,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def keyring_of(*servers: str) -> Keyring:
    """A keyring whose credential for each server has that server as its username."""
    return Keyring.from_docker_config({"auths": {server: {"username": server, "password": "pw"} for server in servers}})


def users(auths: list[RegistryAuth]) -> list[str]:
    return [auth.username for auth in auths]


# --- docker config documents -------------------------------------------------------------------


def test_dockerconfigjson_entries_with_username_and_password_are_read() -> None:
    cfg = {"auths": {"my-registry.io": {"username": "ada", "password": "s3cret", "email": "ada@example.com"}}}

    assert docker_config_auths(cfg) == [RegistryAuth(username="ada", password="s3cret", server="my-registry.io")]


def test_legacy_dockercfg_is_a_top_level_map_of_servers() -> None:
    cfg = {"https://quay.io/v1/": {"auth": b64("rex:tiny arms"), "email": "rex@example.com"}}

    keyring = Keyring.from_docker_config(cfg)

    assert keyring.lookup("quay.io/team/app") == [RegistryAuth("rex", "tiny arms", "https://quay.io/v1/")]


def test_auth_field_is_decoded_and_the_password_may_contain_colons() -> None:
    cfg = {"auths": {"r.example.com": {"auth": b64("robot$ci:pa:ss:word")}}}

    assert docker_config_auths(cfg) == [RegistryAuth("robot$ci", "pa:ss:word", "r.example.com")]


def test_auth_field_overrides_username_and_password() -> None:
    cfg = {"auths": {"r.example.com": {"username": "old", "password": "old", "auth": b64("new:pw")}}}

    assert docker_config_auths(cfg)[0] == RegistryAuth("new", "pw", "r.example.com")


def test_auth_field_may_be_wrapped_over_lines_like_go_base64_allows() -> None:
    encoded = b64("user:" + "p" * 80)
    wrapped = encoded[:40] + "\n" + encoded[40:] + "\r\n"

    assert docker_config_auths({"auths": {"r.io": {"auth": wrapped}}})[0].password == "p" * 80


def test_field_names_match_case_insensitively_and_nulls_are_ignored_like_go_json() -> None:
    cfg = {"Auths": {"r.io": {"Username": "ada", "PASSWORD": "pw", "auth": None, "email": None}}}

    assert docker_config_auths(cfg) == [RegistryAuth("ada", "pw", "r.io")]


def test_config_with_null_or_missing_auths_has_no_credentials() -> None:
    assert docker_config_auths({"auths": None}) == []
    assert docker_config_auths({"auths": {}, "credsStore": "desktop"}) == []


def test_from_docker_config_json_reads_secret_bytes() -> None:
    raw = b'{"auths": {"r.io": {"auth": "' + b64("u:p").encode() + b'"}}}'

    assert Keyring.from_docker_config_json(raw).auths == (RegistryAuth("u", "p", "r.io"),)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (["r.io"], "invalid docker config: must be a JSON object, not list"),
        ({"auths": ["r.io"]}, 'invalid docker config: field "auths" must be an object, not list'),
        (
            {"auths": {"r.io": "u:p"}},
            'invalid docker config: entry "r.io": must be an object with "username" and "password" or "auth", not str',
        ),
        (
            {"auths": {"r.io": {"username": 7}}},
            'invalid docker config: entry "r.io": field "username" must be a string, not int',
        ),
        (
            {"auths": {"r.io": {"password": ["x"]}}},
            'invalid docker config: entry "r.io": field "password" must be a string, not list',
        ),
        (
            {"auths": {"r.io": {"auth": "%%%"}}},
            'invalid docker config: entry "r.io": field "auth" is not valid base64 of UTF-8 text',
        ),
        (
            {"auths": {"r.io": {"auth": b64("no-colon")}}},
            'invalid docker config: entry "r.io": field "auth" must decode to "username:password"',
        ),
        (
            {"auths": {"r.io": {"auth": b64("u:p")[:-1]}}},
            'invalid docker config: entry "r.io": field "auth" is not valid base64 of UTF-8 text',
        ),
    ],
)
def test_malformed_config_names_server_and_field(cfg: object, message: str) -> None:
    with pytest.raises(InvalidDockerConfigError) as caught:
        Keyring.from_docker_config(cfg)  # type: ignore[arg-type]

    assert str(caught.value) == message


def test_malformed_config_errors_never_echo_secret_values() -> None:
    # Given an auth that decodes to text without a colon, and a non-string password next to a secret
    secret = "hunter2-very-secret"
    for cfg in (
        {"auths": {"r.io": {"auth": b64(secret)}}},
        {"auths": {"r.io": {"auth": secret + "!"}}},
        {"auths": {"r.io": {"username": secret, "password": 12}}},
    ):
        with pytest.raises(InvalidDockerConfigError) as caught:
            Keyring.from_docker_config(cfg)
        assert secret not in str(caught.value)
        assert b64(secret) not in str(caught.value)


def test_invalid_json_is_reported_by_position_only() -> None:
    with pytest.raises(InvalidDockerConfigError) as caught:
        Keyring.from_docker_config_json('{"auths": {"r.io": {"password": "hunter2"')

    assert str(caught.value) == "invalid docker config: is not valid JSON (at character 41)"
    assert "hunter2" not in str(caught.value)


def test_registry_auth_repr_and_str_hide_the_password() -> None:
    auth = RegistryAuth(username="AWS", password="eyJwYXlsb2FkIjoi-token", server="r.io")

    assert repr(auth) == "RegistryAuth(server='r.io', username='AWS', password='***')"
    assert str(auth) == repr(auth)
    assert "token" not in repr([auth]) and "token" not in repr(Keyring([auth]))


def test_registry_auth_from_basic_token_decodes_an_ecr_authorization_token() -> None:
    auth = RegistryAuth.from_basic_token(b64("AWS:eyJ0b2tlbiI6:x"), "123456789012.dkr.ecr.us-east-1.amazonaws.com")

    assert (auth.username, auth.password) == ("AWS", "eyJ0b2tlbiI6:x")
    assert auth.auth == b64("AWS:eyJ0b2tlbiI6:x")


def test_registry_auth_from_a_malformed_token_raises_without_echoing_it() -> None:
    with pytest.raises(InvalidCredentialsError) as caught:
        RegistryAuth.from_basic_token(b64("tokenwithoutcolon"), "r.io")

    assert str(caught.value) == 'authorization token for "r.io" must decode to "username:password"'


# --- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "key"),
    [
        ("my-registry.io", "my-registry.io"),
        ("https://my-registry.io", "my-registry.io"),
        ("http://my-registry.io/", "my-registry.io"),
        ("https://index.docker.io/v1/", "index.docker.io"),
        ("https://index.docker.io/v2/", "index.docker.io"),
        ("quay.io/v1/team", "quay.io/team"),
        ("quay.io/v1", "quay.io/v1"),  # only "/v1/" with its slash is dropped
        ("my-registry.io:5000/images", "my-registry.io:5000/images"),
        ("https://user@my-registry.io/images?x=1#top", "my-registry.io/images"),
        ("my-registry.io/a%20b", "my-registry.io/a b"),
        ("[::1]:5000", "[::1]:5000"),
        ("*.my-registry.io", "*.my-registry.io"),
    ],
)
def test_keyring_key_normalises_servers_as_the_kubelet_does(server: str, key: str) -> None:
    assert keyring_key(server) == key


@pytest.mark.parametrize(
    "server",
    # "^" is not allowed in a Go URL host, so negated classes cannot be used in registry keys
    ["my registry.io", "r.io:port", "r\\io", "r.io/%zz", "r.io/\x00", "[::1", "registry-[^0-9].example.com"],
)
def test_servers_go_cannot_parse_are_ignored_and_listed(server: str) -> None:
    # Given a key Go's url.Parse rejects / When added / Then the kubelet skips it; so do we, visibly
    assert keyring_key(server) is None
    keyring = Keyring([RegistryAuth("u", "p", server), RegistryAuth("v", "q", "r.io")])

    assert keyring.ignored_servers == (server,)
    assert users(keyring.lookup("r.io/app")) == ["v"]


# --- lookup: the Kubernetes documentation's config.json examples ---------------------------------


@pytest.mark.parametrize(
    ("server", "image", "matches"),
    [
        ("my-registry.io/images", "my-registry.io/images", True),
        ("my-registry.io/images", "my-registry.io/images/my-image", True),
        ("my-registry.io/images", "my-registry.io/images/another-image", True),
        ("*.my-registry.io/images", "a.my-registry.io/images", True),
        ("*.my-registry.io/images", "a.sub.my-registry.io/images", False),
        ("*.my-registry.io/images", "my-registry.io/images", False),
        ("my-registry.io:5000", "my-registry.io:5000/app", True),
        ("my-registry.io", "my-registry.io:5000/app", False),
        ("my-registry.io:5000", "my-registry.io/app", False),
        ("*.kubernetes.io", "kubernetes.io/app", False),
        ("*.*.kubernetes.io", "abc.kubernetes.io/app", False),
        ("*.*.kubernetes.io", "a.b.kubernetes.io/app", True),
        # kubelet URLsMatch table
        ("*.kubernetes.io", "prefix.kubernetes.io/app", True),
        ("prefix.*.io", "prefix.kubernetes.io/app", True),
        ("prefix.kubernetes.*", "prefix.kubernetes.io/app", True),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io/app", True),
        ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", True),
        ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", True),
        ("*.kubernetes.io:1111/blah", "prefix.kubernetes.io:1111/blah", True),
        ("prefix.*.io:1111/foo", "prefix.kubernetes.io:1111/foo/bar", True),
        ("kubernetes.io", "kubernetes.com/app", False),
        ("k*.io", "quay.io/app", False),
        ("*.kubernetes.io:1234/blah", "prefix.kubernetes.io:1111/blah", False),
        ("prefix.*.io/foo", "prefix.kubernetes.io:1111/foo/bar", False),
        ("https://*.docker.io/v2/", "prefix.docker.io/app", True),
        ("https://suffix.*.io", "prefix.docker.io/app", False),
        ("https://prefix.docker.c*", "prefix.docker.io/app", False),
        # the key path is a string prefix of the image path, as in the kubelet
        ("bar.example.com/pong", "bar.example.com/pongz", True),
        ("bar.example.com/pong/pang", "bar.example.com/pong", False),
        # character classes follow Go's filepath.Match
        ("registry-[0-9].example.com", "registry-7.example.com/app", True),
        ("registry-[a-c].example.com", "registry-d.example.com/app", False),
        ("registry-[z-a].example.com", "registry-b.example.com/app", False),
        ("registry-[.example.com", "registry-a.example.com/app", False),  # malformed pattern: never matches
        # "?" starts the URL query in Go, so it cannot act as a glob in a host
        ("registry-?.example.com", "registry-1.example.com/app", False),
        ("[::1]:5000", "[::1]:5000/app", True),
        ("localhost:5000", "localhost:5000/app", True),
    ],
)
def test_lookup_matches_keys_like_the_kubelet(server: str, image: str, matches: bool) -> None:
    assert (keyring_of(server).lookup(image) != []) is matches


def test_lookup_returns_every_match_most_specific_key_first() -> None:
    # Given overlapping keys in any order
    keyring = keyring_of("bar.example.com", "bar.example.com/pong", "*.example.com", "bar.example.com/pong/pang")

    # Then all that match come back, keys in reverse string order
    assert users(keyring.lookup("bar.example.com/pong/pang/app")) == [
        "bar.example.com/pong/pang",
        "bar.example.com/pong",
        "bar.example.com",
        "*.example.com",
    ]
    assert users(keyring.lookup("bar.example.com/ping")) == ["bar.example.com", "*.example.com"]
    assert keyring.lookup("example.com/app") == []


def test_credentials_under_the_same_key_are_all_returned_in_config_order() -> None:
    keyring = Keyring.from_docker_config(
        {"auths": {"https://quay.io": {"username": "first", "password": "1"}, "quay.io/": {"auth": b64("second:2")}}}
    )

    assert users(keyring.lookup("quay.io/team/app")) == ["first", "second"]


def test_lookup_ignores_tag_and_digest_of_the_image() -> None:
    keyring = keyring_of("my-registry.io/images")

    assert users(keyring.lookup("my-registry.io/images/app:1.0@sha256:" + "a" * 64)) == ["my-registry.io/images"]


def test_lookup_of_an_invalid_image_raises() -> None:
    with pytest.raises(InvalidImageReference):
        keyring_of("r.io").lookup("r.io/App")


@pytest.mark.parametrize("server", ["index.docker.io", "https://index.docker.io/v1/", "https://index.docker.io/v2/"])
@pytest.mark.parametrize("image", ["busybox", "library/busybox", "google/docker-registry", "docker.io/x/y"])
def test_docker_hub_images_fall_back_to_the_index_docker_io_entry(server: str, image: str) -> None:
    assert users(keyring_of(server).lookup(image)) == [server]


def test_docker_io_key_matches_docker_hub_images_directly() -> None:
    assert users(keyring_of("docker.io").lookup("busybox")) == ["docker.io"]
    assert users(keyring_of("docker.io/bitnami").lookup("bitnami/redis")) == ["docker.io/bitnami"]
    assert keyring_of("docker.io/bitnami").lookup("busybox") == []


def test_docker_hub_fallback_is_not_used_for_other_registries() -> None:
    keyring = keyring_of("https://index.docker.io/v1/")

    assert keyring.lookup("world.mesos.org/foo/bar") == []
    assert keyring.lookup("registry:5000/foo/bar") == []
    assert keyring.lookup("myhostdocker.io/foo/bar") == []


def test_docker_hub_fallback_also_covers_localhost_as_the_kubelet_does() -> None:
    # isDefaultRegistryMatch only looks for "." or ":" in the first component
    assert users(keyring_of("index.docker.io").lookup("localhost/app")) == ["index.docker.io"]


def test_docker_hub_fallback_applies_only_when_nothing_else_matches() -> None:
    keyring = keyring_of("index.docker.io", "docker.io/bitnami")

    assert users(keyring.lookup("bitnami/redis")) == ["docker.io/bitnami"]
    assert users(keyring.lookup("busybox")) == ["index.docker.io"]


def test_merge_returns_pull_secret_matches_before_node_credentials() -> None:
    # Given a job's pull secrets and the node's ECR credentials
    ecr_host = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    pull_secrets = keyring_of(f"{ecr_host}/team")
    node = Keyring([RegistryAuth("AWS", "token", ecr_host)])

    # When merged / Then the union keyring answers secrets first, as the kubelet's does
    merged = pull_secrets.merge(node)

    assert users(merged.lookup(f"{ecr_host}/team/app")) == [f"{ecr_host}/team", "AWS"]
    assert users(merged.lookup(f"{ecr_host}/other/app")) == ["AWS"]
    assert users(node.merge(pull_secrets).lookup(f"{ecr_host}/team/app")) == ["AWS", f"{ecr_host}/team"]
    assert len(merged) == 2


def test_merge_keeps_each_keyrings_docker_hub_fallback() -> None:
    merged = keyring_of("quay.io").merge(keyring_of("index.docker.io"), keyring_of("docker.io"))

    assert users(merged.lookup("busybox")) == ["index.docker.io", "docker.io"]


def test_from_docker_configs_combines_pull_secrets_into_one_ordered_index() -> None:
    keyring = Keyring.from_docker_configs(
        [
            {"auths": {"r.io": {"username": "host", "password": "p"}}},
            {"r.io/team": {"username": "team", "password": "p"}},
        ]
    )

    assert users(keyring.lookup("r.io/team/app")) == ["team", "host"]


def test_to_docker_config_writes_username_password_and_auth() -> None:
    keyring = Keyring([RegistryAuth("AWS", "pa:ss", "123456789012.dkr.ecr.us-east-1.amazonaws.com")])

    assert keyring.to_docker_config() == {
        "auths": {
            "123456789012.dkr.ecr.us-east-1.amazonaws.com": {
                "username": "AWS",
                "password": "pa:ss",
                "auth": b64("AWS:pa:ss"),
            }
        }
    }


def test_to_docker_config_keeps_the_higher_priority_credential_per_server() -> None:
    merged = Keyring([RegistryAuth("secret", "1", "r.io")]).merge(Keyring([RegistryAuth("node", "2", "r.io")]))

    assert merged.to_docker_config()["auths"]["r.io"]["username"] == "secret"


def test_to_docker_config_reads_back_to_the_same_credentials() -> None:
    keyring = Keyring.from_docker_config(
        {"auths": {"a.io": {"auth": b64("u:p:q")}, "b.io/x": {"username": "v", "password": ""}}}
    )

    assert Keyring.from_docker_config(keyring.to_docker_config()).auths == keyring.auths


# --- ECR -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (
            "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            EcrRegistry("123456789012.dkr.ecr.us-east-1.amazonaws.com", "123456789012", "us-east-1", "aws"),
        ),
        (
            "123456789012.dkr.ecr-fips.us-east-2.amazonaws.com",
            EcrRegistry(
                "123456789012.dkr.ecr-fips.us-east-2.amazonaws.com", "123456789012", "us-east-2", "aws", fips=True
            ),
        ),
        (
            "123456789012.dkr.ecr.us-gov-west-1.amazonaws.com",
            EcrRegistry(
                "123456789012.dkr.ecr.us-gov-west-1.amazonaws.com", "123456789012", "us-gov-west-1", "aws-us-gov"
            ),
        ),
        (
            "123456789012.dkr.ecr-fips.us-gov-east-1.amazonaws.com",
            EcrRegistry(
                "123456789012.dkr.ecr-fips.us-gov-east-1.amazonaws.com",
                "123456789012",
                "us-gov-east-1",
                "aws-us-gov",
                fips=True,
            ),
        ),
        (
            "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
            EcrRegistry("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn", "123456789012", "cn-north-1", "aws-cn"),
        ),
        (
            "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov",
            EcrRegistry("123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov", "123456789012", "us-iso-east-1", "aws-iso"),
        ),
        (
            "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov",
            EcrRegistry(
                "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov", "123456789012", "us-isob-east-1", "aws-iso-b"
            ),
        ),
        (
            "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk",
            EcrRegistry(
                "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk", "123456789012", "eu-isoe-west-1", "aws-iso-e"
            ),
        ),
        (
            "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov",
            EcrRegistry(
                "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov", "123456789012", "us-isof-south-1", "aws-iso-f"
            ),
        ),
        (
            "123456789012.dkr-ecr.eu-west-1.on.aws",
            EcrRegistry("123456789012.dkr-ecr.eu-west-1.on.aws", "123456789012", "eu-west-1", "aws", dual_stack=True),
        ),
        (
            "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
            EcrRegistry(
                "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
                "123456789012",
                "cn-northwest-1",
                "aws-cn",
                dual_stack=True,
            ),
        ),
        ("public.ecr.aws", EcrRegistry("public.ecr.aws", None, None, "aws", public=True)),
    ],
)
def test_ecr_hosts_are_recognised_with_account_region_and_partition(host: str, expected: EcrRegistry) -> None:
    assert parse_ecr_registry(host) == expected


@pytest.mark.parametrize(
    "host",
    [
        "registry.k8s.io",
        "docker.io",
        "12345678901.dkr.ecr.us-east-1.amazonaws.com",  # 11 digits
        "1234567890123.dkr.ecr.us-east-1.amazonaws.com",  # 13 digits
        "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.example",
        "evil.example/123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com:443",  # a host, not host:port
        "123456789012.dkr.ecr..amazonaws.com",
        "123456789012.ecr.us-east-1.amazonaws.com",
        "abcdefghijkl.dkr.ecr.us-east-1.amazonaws.com",
        "public.ecr.aws.example",
        "",
    ],
)
def test_other_hosts_are_not_ecr(host: str) -> None:
    assert parse_ecr_registry(host) is None


@pytest.mark.parametrize(
    ("image_or_host", "host"),
    [
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app:1.0", "123456789012.dkr.ecr.us-east-1.amazonaws.com"),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com:443", "123456789012.dkr.ecr.us-east-1.amazonaws.com"),
        (
            "https://123456789012.dkr.ecr.eu-west-1.amazonaws.com/v2/",
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        ),
        ("public.ecr.aws/nginx/nginx:1.27", "public.ecr.aws"),
    ],
)
def test_ecr_registry_for_reads_the_host_of_an_image_or_host_with_port(image_or_host: str, host: str) -> None:
    registry = ecr_registry_for(image_or_host)

    assert registry is not None
    assert registry.host == host


@pytest.mark.parametrize("image_or_host", ["busybox", "busybox:1.0", "registry.k8s.io/pause:3.9", "r.io:port/x"])
def test_ecr_registry_for_other_images_is_none(image_or_host: str) -> None:
    assert ecr_registry_for(image_or_host) is None
