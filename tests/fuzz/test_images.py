"""Image references from anywhere (a job, a push event, a task): an `ImageRef` or `InvalidImageReference`.

tests/unit/domain/test_images_properties.py covers the reference alphabet; here any text at all, any
length, and values that are not text.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prewarm.domain.images import InvalidImageReference, parse_image
from tests.fuzz.strategies import image_refs, json_values

texts = st.one_of(
    image_refs, st.text(max_size=80),
    st.builds(lambda ref, junk: ref + junk, image_refs, st.sampled_from(["\n", " ", "\x00", "é", "\u202e", "@", ":"])),
    st.builds(lambda n: "a" * n, st.integers(250, 600)), st.builds(lambda n: "a.b/" + "c/" * n, st.integers(1, 200)),
)


@settings(max_examples=500, deadline=None)
@given(texts)
def test_any_text_is_an_image_or_an_error_quoting_it(reference: str) -> None:
    try:
        image = parse_image(reference)
    except InvalidImageReference as e:
        assert str(e).startswith(f"invalid image reference {json.dumps(reference, ensure_ascii=False)}: ")
        assert e.reason
    else:
        assert parse_image(image.format()) == image
        assert parse_image(image.pull_reference).name == image.name


@settings(max_examples=100, deadline=None)
@given(json_values.filter(lambda v: not isinstance(v, str)))
def test_a_value_that_is_no_text_is_an_invalid_reference_saying_so(value: Any) -> None:
    try:
        parse_image(value)
    except InvalidImageReference as e:
        assert "must be a string" in e.reason
    else:
        raise AssertionError(f"{value!r} parsed as an image")
