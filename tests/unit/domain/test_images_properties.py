"""Property tests for image references: round trips, rejection of bad tags and digests."""

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prewarm.domain.images import InvalidImageReference, parse_image

ALNUM = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
SEPARATOR = st.sampled_from([".", "_", "__", "-", "--", "---"])


@st.composite
def path_components(draw: st.DrawFn) -> str:
    parts = [draw(ALNUM)]
    for _ in range(draw(st.integers(0, 3))):
        parts += [draw(SEPARATOR), draw(ALNUM)]
    return "".join(parts)


HOST_LABEL = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,6}[a-zA-Z0-9])?", fullmatch=True)
PORT = st.integers(1, 65535).map(lambda port: f":{port}")
DOMAIN = st.lists(HOST_LABEL, min_size=2, max_size=4).map(".".join)
REGISTRY = st.one_of(
    st.none(),  # a Docker Hub familiar name
    st.sampled_from(["docker.io", "index.docker.io", "localhost", "localhost:5000", "[::1]:5000", "[fe80::1]"]),
    st.tuples(DOMAIN, st.one_of(st.just(""), PORT)).map("".join),
    st.tuples(HOST_LABEL, PORT).map("".join),
)
TAG = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", fullmatch=True)
DIGEST = st.one_of(
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda hex_: f"sha256:{hex_}"),
    st.text("0123456789abcdef", min_size=128, max_size=128).map(lambda hex_: f"sha512:{hex_}"),
)


@st.composite
def valid_references(draw: st.DrawFn) -> str:
    registry = draw(REGISTRY)
    components = draw(st.lists(path_components(), min_size=1, max_size=3))
    if registry is None and len(components) > 1:
        # A dotted first component would be read as a registry host.
        assume("." not in components[0])
    path = "/".join(components)
    reference = path if registry is None else f"{registry}/{path}"
    if tag := draw(st.one_of(st.none(), TAG)):
        reference += f":{tag}"
    if digest := draw(st.one_of(st.none(), DIGEST)):
        reference += f"@{digest}"
    assume(not re.fullmatch(r"[a-f0-9]{64}", reference))
    return reference


@given(valid_references())
def test_parse_format_parse_round_trips(reference: str) -> None:
    # Given a valid reference / When parsed, formatted and parsed again / Then nothing changes
    ref = parse_image(reference)

    assert parse_image(ref.format()) == ref
    assert parse_image(str(ref)).format() == ref.format()


@given(valid_references())
def test_pull_reference_always_parses_back_to_the_same_image(reference: str) -> None:
    ref = parse_image(reference)

    pulled = parse_image(ref.pull_reference)

    assert pulled.name == ref.name
    assert pulled.digest == ref.digest
    assert pulled.tag == (None if ref.digest else ref.tag or "latest")


@given(valid_references())
def test_parsed_parts_are_those_written(reference: str) -> None:
    ref = parse_image(reference)

    assert ref.repository.endswith(reference.split("@")[0].split("/")[-1].split(":")[0])
    assert (ref.digest is not None) == ("@" in reference)
    if ref.tag is not None:
        assert f":{ref.tag}" in reference


BAD_TAG = st.one_of(
    st.text(min_size=1, max_size=20).filter(lambda tag: "/" not in tag and "@" not in tag),
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{128,140}", fullmatch=True),
    st.just(""),
).filter(lambda tag: not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag))


@given(BAD_TAG)
def test_invalid_tags_are_rejected(tag: str) -> None:
    with pytest.raises(InvalidImageReference):
        parse_image(f"registry.example/app:{tag}")


VALID_DIGEST = re.compile(r"sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}")
BAD_DIGEST = st.one_of(
    st.tuples(
        st.sampled_from(["sha256", "sha384", "sha512", "md5", "SHA256", "sha-256", "blake3", ""]),
        st.text("0123456789abcdefABCDEFg", max_size=130),
    ).map(":".join),
    st.text(max_size=80),
).filter(lambda digest: "/" not in digest and "@" not in digest and not VALID_DIGEST.fullmatch(digest))


@given(BAD_DIGEST)
def test_invalid_digests_are_rejected(digest: str) -> None:
    with pytest.raises(InvalidImageReference):
        parse_image(f"registry.example/app@{digest}")


REFERENCE_CHARACTERS = "abcAB09._-/:@[]"


@settings(max_examples=300)
@given(st.text(REFERENCE_CHARACTERS, max_size=24))
def test_arbitrary_text_either_parses_and_round_trips_or_raises_invalid_reference(text: str) -> None:
    try:
        ref = parse_image(text)
    except InvalidImageReference as error:
        assert str(error).startswith("invalid image reference ")
        return
    assert parse_image(ref.format()) == ref


@settings(max_examples=300)
@given(st.one_of(st.text(REFERENCE_CHARACTERS, max_size=24), valid_references()))
def test_accepts_exactly_what_docker_image_py_accepts(text: str) -> None:
    # docker-image-py ports the same distribution grammar: an independent oracle for acceptance.
    reference_module = pytest.importorskip("docker_image.reference")
    try:
        theirs = reference_module.Reference.parse_normalized_named(text)
    except Exception:  # noqa: BLE001 - the oracle raises several unrelated exception types
        theirs = None
    try:
        ours = parse_image(text)
    except InvalidImageReference:
        ours = None

    assert (ours is None) == (theirs is None)
    if ours is not None and theirs is not None:
        assert (ours.registry, ours.repository) == (theirs.domain(), theirs.path())
        assert ours.tag == theirs["tag"]
        assert ours.digest == theirs["digest"]
