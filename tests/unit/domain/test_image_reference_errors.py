"""What an image reference error says: the reference as the user wrote it and the part at fault."""

from __future__ import annotations

import pytest

from prewarm.domain.images import InvalidImageReference, digest_problem, parse_image

HEX64 = "a" * 64


def refusal(reference: object) -> InvalidImageReference:
    with pytest.raises(InvalidImageReference) as caught:
        parse_image(reference)  # type: ignore[arg-type]
    return caught.value


def test_the_message_quotes_the_reference_with_its_characters_as_typed() -> None:
    error = refusal("café/app:v1")
    assert error.reference == "café/app:v1"
    assert str(error).startswith('invalid image reference "café/app:v1": ')
    assert '"café"' in error.reason


def test_a_reference_that_is_not_a_string_is_named_by_its_text() -> None:
    error = refusal(42)
    assert (error.reference, error.reason) == ("42", "must be a string, not int")


def test_a_repository_name_too_long_names_the_reference() -> None:
    reference = "r.example/" + "a" * 256
    error = refusal(reference)
    assert error.reference == reference
    assert error.reason == "repository name must not be more than 255 characters (got 256)"


@pytest.mark.parametrize(
    ("digest", "problem"),
    [
        ("sha256:", "must be <algorithm>:<hex>"),
        (":" + HEX64, "must be <algorithm>:<hex>"),
        ("sha256", "must be <algorithm>:<hex>"),
        # go-digest splits at the first colon: the rest is the hex, colon and all
        (f"sha256:{HEX64}:b", "sha256 digest must have exactly 64 hex characters, got 66"),
        ("md5:" + "a" * 32, 'unsupported digest algorithm "md5"'),
    ],
)
def test_a_digest_is_algorithm_colon_hex_split_at_the_first_colon(digest: str, problem: str) -> None:
    found = digest_problem(digest)
    assert found is not None and problem in found


def test_a_reference_whose_digest_has_a_second_colon_is_refused_for_its_hex_length() -> None:
    assert refusal(f"busybox@sha256:{HEX64}:b").reason == "sha256 digest must have exactly 64 hex characters, got 66"


def test_an_uppercase_letter_after_the_first_at_sign_is_the_digests_fault() -> None:
    assert refusal(f"busybox@sha256@SHA256:{HEX64}").reason == "digest algorithm must be lowercase, e.g. sha256"
    assert refusal(f"Busybox@sha256:{HEX64}").reason == "repository name must be lowercase"
