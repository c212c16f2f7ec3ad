"""Property tests for credentials: glob matching, auth encoding and docker config round trips."""

import fnmatch

from hypothesis import given
from hypothesis import strategies as st

from prewarm.domain.registries import Keyring, RegistryAuth, docker_config_auths, keyring_key

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
GLOB_LABEL = st.text("ab-*?", min_size=1, max_size=6)


@given(st.lists(GLOB_LABEL, min_size=1, max_size=3), st.lists(LABEL, min_size=1, max_size=3))
def test_star_globs_in_host_labels_match_like_fnmatch_label_by_label(globs: list[str], labels: list[str]) -> None:
    # "?" would start a URL query in Go, so only "*" is checked against fnmatch here.
    globs = [glob.replace("?", "*") for glob in globs]
    keyring = Keyring([RegistryAuth("u", "p", ".".join(globs) + ".example.com")])
    image = ".".join(labels) + ".example.com/app"

    expected = len(globs) == len(labels) and all(
        fnmatch.fnmatchcase(label, glob) for glob, label in zip(globs, labels, strict=True)
    )

    assert (keyring.lookup(image) != []) is expected


USERNAME = st.text(st.characters(exclude_characters=":", exclude_categories=["Cs"]), max_size=20)
PASSWORD = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@given(USERNAME, PASSWORD)
def test_auth_field_round_trips_any_username_and_password(username: str, password: str) -> None:
    auth = RegistryAuth(username, password, "r.io")

    assert docker_config_auths({"auths": {"r.io": {"auth": auth.auth}}}) == [auth]


SERVER = st.builds(
    lambda labels, path: ".".join(labels) + ".io" + path,
    st.lists(LABEL, min_size=1, max_size=3),
    st.sampled_from(["", "/team", "/v1/", ":5000"]),
)


@given(st.dictionaries(SERVER, st.tuples(USERNAME, PASSWORD), max_size=5))
def test_to_docker_config_reads_back_to_the_same_keyring(entries: dict[str, tuple[str, str]]) -> None:
    keyring = Keyring(RegistryAuth(user, password, server) for server, (user, password) in entries.items())

    again = Keyring.from_docker_config(keyring.to_docker_config())

    assert again.auths == keyring.auths
    assert again.to_docker_config() == keyring.to_docker_config()


HOST = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=2).map(lambda labels: ".".join(labels) + ".io")
KEY_PATH = st.sampled_from(["", "/", "/team", "/team/app", "/te", "/v1/", "/v2/team", "/other"])


@given(st.lists(st.tuples(HOST, KEY_PATH, USERNAME), max_size=8), st.sampled_from(["a.io", "b.io", "a.b.io"]))
def test_lookup_returns_exactly_the_matching_keys_in_reverse_order(
    servers: list[tuple[str, str, str]], host: str
) -> None:
    # Given credentials for overlapping hosts and paths
    keyring = Keyring(RegistryAuth(user, "p", server + path) for server, path, user in servers)

    # When an image is looked up
    found = keyring.lookup(f"{host}/team/app")

    # Then the keys found never increase, and every credential with a matching key is there
    keys = [keyring_key(auth.server) or "" for auth in found]
    assert keys == sorted(keys, reverse=True)
    matching = [
        auth
        for auth in keyring.auths
        if fnmatch.fnmatchcase(host, (keyring_key(auth.server) or "").split("/")[0])
        and "/team/app".startswith("/" + (keyring_key(auth.server) or "").partition("/")[2])
        and (keyring_key(auth.server) or "").count(".") == host.count(".")
    ]
    assert sorted(found, key=repr) == sorted(matching, key=repr)
