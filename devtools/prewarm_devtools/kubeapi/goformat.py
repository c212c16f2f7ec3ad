"""How Go prints values, for errors worded as the API server words them: `%v` of a float64 (`go_float`),
encoding/json's Marshal of a decoded JSON value (`go_json`), and a bad value as `field.Error` prints it
(`go_value`)."""

from __future__ import annotations

import decimal
import json
import math
from typing import Any

from prewarm_devtools.kubeapi.errors import GoSyntax


def _digits(value: float) -> tuple[str, int]:
    """The shortest decimal digits of abs(value) and where the point goes (as strconv's decimal)."""
    _, digits, exponent = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    return text, len(text) + exponent


def _fixed(text: str, point: int) -> str:
    if point <= 0:
        return f"0.{'0' * -point}{text}"
    if point >= len(text):
        return text + "0" * (point - len(text))
    return f"{text[:point]}.{text[point:]}"


def _exponent(text: str, point: int, min_digits: int) -> str:
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{mantissa}e{'+' if point >= 1 else '-'}{abs(point - 1):0{min_digits}d}"


def go_float(value: float) -> str:
    """Go's `%v` of a float64: the shortest digits, an exponent from 1e+06 up and below 1e-04."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if value < 0 else ""
    text, point = _digits(value)
    if value != 0 and (point - 1 < -4 or point - 1 >= 6):
        return sign + _exponent(text, point, 2)
    return sign + _fixed(text, point)


def go_json(value: Any) -> str:
    """`json.Marshal` of a decoded JSON value: compact, sorted keys, Go's number and HTML escaping."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return json.dumps(value)
    if isinstance(value, float):
        return _go_json_float(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028")):
            text = text.replace(char, escaped)
        return text.replace("\u2029", "\\u2029")
    if isinstance(value, list):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    return "{" + ",".join(f"{go_json(str(k))}:{go_json(v)}" for k, v in sorted(value.items())) + "}"


def _go_json_float(value: float) -> str:
    # encoding/json: fixed notation from 1e-6 to 1e21, else an exponent without a leading zero.
    sign = "-" if value < 0 else ""
    text, point = _digits(value)
    if value == 0 or 1e-6 <= abs(value) < 1e21:
        return sign + _fixed(text, point)
    return sign + _exponent(text, point, 1)


def go_value(value: Any) -> GoSyntax:
    """A bad value as `field.Error` prints it: `%v` for numbers and booleans, `%q` for strings, else JSON."""
    if isinstance(value, bool):
        return GoSyntax("true" if value else "false")
    if isinstance(value, int):
        return GoSyntax(str(value))
    if isinstance(value, float):
        return GoSyntax(go_float(value))
    if isinstance(value, str):
        return GoSyntax(json.dumps(value, ensure_ascii=False))
    return GoSyntax(go_json(value))
