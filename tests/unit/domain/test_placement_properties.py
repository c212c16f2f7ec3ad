"""Properties of label selectors: the rendered query means what `matches` decides."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from prewarm.domain.kubernetes import LabelSelector

KEYS = ["app", "zone", "example.com/tier", "kubernetes.io/arch", "a_b.c"]
VALUES = ["", "a", "b", "web", "arm64", "v1.2"]

labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)
set_expressions = st.fixed_dictionaries(
    {
        "key": st.sampled_from(KEYS),
        "operator": st.sampled_from(["In", "NotIn"]),
        "values": st.lists(st.sampled_from(VALUES), min_size=1, max_size=3),
    }
)
existence_expressions = st.fixed_dictionaries(
    {"key": st.sampled_from(KEYS), "operator": st.sampled_from(["Exists", "DoesNotExist"])}
)
selectors = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": labels,
        "matchExpressions": st.lists(set_expressions | existence_expressions, max_size=4),
    },
)

_SET_TERM = re.compile(r"(?P<key>[^\s!=,()]+) (?P<op>in|notin) \((?P<values>[^()]*)\)")
_EQUALITY_TERM = re.compile(r"(?P<key>[^\s!=,()]+)(?P<op>==|=|!=)(?P<value>[^\s!=,()]*)")
_KEY = re.compile(r"(?P<neg>!?)(?P<key>[^\s!=,()]+)")


def _split_terms(query: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in query:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [*terms, current] if query else []


def _term_matches(term: str, labels: dict[str, str]) -> bool:
    """One term of the Kubernetes labelSelector grammar, evaluated independently of the code under test."""
    if match := _SET_TERM.fullmatch(term):
        present = match["key"] in labels
        inside = present and labels[match["key"]] in match["values"].split(",")
        return inside if match["op"] == "in" else not inside
    if match := _EQUALITY_TERM.fullmatch(term):
        equal = labels.get(match["key"]) == match["value"]
        return equal if match["op"] != "!=" else not equal
    if match := _KEY.fullmatch(term):
        return (match["key"] in labels) != bool(match["neg"])
    raise AssertionError(f"not a labelSelector term: {term!r}")


def query_matches(query: str, labels: dict[str, str]) -> bool:
    return all(_term_matches(term, labels) for term in _split_terms(query))


@given(selector=selectors, node_labels=labels)
def test_rendered_query_selects_exactly_what_matches_selects(
    selector: dict[str, Any], node_labels: dict[str, str]
) -> None:
    # Given any valid selector and any node labels
    parsed = LabelSelector.model_validate(selector)
    # Then evaluating its query string per the Kubernetes grammar agrees with matches()
    assert query_matches(parsed.to_query(), node_labels) == parsed.matches(node_labels)


@given(selector=selectors, data=st.data())
def test_query_does_not_depend_on_the_order_selectors_are_written_in(
    selector: dict[str, Any], data: st.DataObject
) -> None:
    # Given the same selector with its labels and expressions shuffled
    shuffled = dict(selector)
    if "matchLabels" in selector:
        items = data.draw(st.permutations(list(selector["matchLabels"].items())))
        shuffled["matchLabels"] = dict(items)
    if "matchExpressions" in selector:
        expressions = data.draw(st.permutations(selector["matchExpressions"]))
        shuffled["matchExpressions"] = [
            {**e, "values": data.draw(st.permutations(e["values"]))} if "values" in e else e for e in expressions
        ]
    # Then both render the same query
    assert LabelSelector.model_validate(shuffled).to_query() == LabelSelector.model_validate(selector).to_query()
