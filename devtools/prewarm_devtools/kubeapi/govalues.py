"""The values Go's decoders of the built-in types parse from strings, with the errors they return:
`time.Parse` of RFC 3339 (metav1.Time, MicroTime), `resource.ParseQuantity`, and base64 (`[]byte`).

Each function returns None when Go accepts the text, else Go's error message.
"""

from __future__ import annotations

import datetime

RFC3339 = "2006-01-02T15:04:05Z07:00"
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"
# The chunks of the two layouts, as time.Parse walks them.
_LAYOUT_CHUNKS = {
    RFC3339: ("2006", "-", "01", "-", "02", "T", "15", ":", "04", ":", "05", "Z07:00"),
    RFC3339_MICRO: ("2006", "-", "01", "-", "02", "T", "15", ":", "04", ":", "05", ".000000", "Z07:00"),
}
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class _Bad(Exception):
    """time.Parse's errBad: the value does not fit the layout element."""


def _quote(text: str) -> str:
    # time's quote(): double quotes, `"` and `\` escaped, non-ASCII and control bytes as \x escapes.
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return '"' + "".join(out) + '"'


def _number(value: str, fixed: bool) -> tuple[int, str]:
    """time's getnum: one or two digits (exactly two when `fixed`)."""
    if not value[:1].isdigit() or not value[:1].isascii():
        raise _Bad
    if not (value[1:2].isdigit() and value[1:2].isascii()):
        if fixed:
            raise _Bad
        return int(value[0]), value[1:]
    return int(value[:2]), value[2:]


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def parse_time(value: str, layout: str = RFC3339) -> str | None:
    """None if `time.Parse(layout, value)` succeeds, else its error message."""

    def failed(elem: str, rest: str, message: str = "") -> str:
        if message:
            return f"parsing time {_quote(value)}{message}"
        return f"parsing time {_quote(value)} as {_quote(layout)}: cannot parse {_quote(rest)} as {_quote(elem)}"

    rest = value
    year = month = day = 1
    out_of_range = ""
    for elem in _LAYOUT_CHUNKS[layout]:
        before = rest
        try:
            if elem in ("-", "T", ":"):
                if not rest.startswith(elem):
                    raise _Bad
                rest = rest[1:]
            elif elem == "2006":
                if len(rest) < 4 or not rest[:4].isascii() or not rest[:4].isdigit():
                    raise _Bad
                year, rest = int(rest[:4]), rest[4:]
            elif elem in ("01", "02", "04", "05", "15"):
                number, rest = _number(rest, fixed=elem != "15")
                # The day is checked against its month once the whole value is read.
                limit = {"01": (1, 12, "month"), "02": (0, 99, "day"), "15": (0, 23, "hour"),
                         "04": (0, 59, "minute"), "05": (0, 59, "second")}[elem]
                if not limit[0] <= number <= limit[1]:
                    out_of_range = out_of_range or limit[2]
                month = number if elem == "01" else month
                day = number if elem == "02" else day
                if elem == "05" and layout == RFC3339 and len(rest) >= 2 and rest[0] in ".," and rest[1].isdigit():
                    # A fraction the layout does not ask for is taken after the seconds.
                    n = 2
                    while n < len(rest) and rest[n].isascii() and rest[n].isdigit():
                        n += 1
                    rest = rest[n:]
            elif elem == ".000000":
                if len(rest) < 7 or rest[0] not in ".," or not (rest[1:7].isascii() and rest[1:7].isdigit()):
                    raise _Bad
                rest = rest[7:]
            else:  # Z07:00
                if rest.startswith("Z"):
                    rest = rest[1:]
                else:
                    if len(rest) < 6 or rest[3] != ":" or rest[0] not in "+-":
                        raise _Bad
                    hours, _ = _number(rest[1:3], fixed=True)
                    minutes, _ = _number(rest[4:6], fixed=True)
                    if hours > 24:
                        out_of_range = out_of_range or "time zone offset hour"
                    if minutes > 60:
                        out_of_range = out_of_range or "time zone offset minute"
                    rest = rest[6:]
        except _Bad:
            return failed(elem, before)
        if out_of_range:
            return failed(elem, before, f": {out_of_range} out of range")
    if rest:
        return failed("", "", f": extra text: {_quote(rest)}")
    days = 29 if month == 2 and _leap(year) else _DAYS_IN_MONTH[month - 1] if 1 <= month <= 12 else 31
    if not 1 <= day <= days:
        return failed("", "", ": day out of range")
    return None


QUANTITY_FORMAT = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
QUANTITY_SUFFIX = "unable to parse quantity's suffix"
_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("n", "u", "m", "", "k", "M", "G", "T", "P", "E")


def canonical_time(value: str, *, micro: bool = False) -> str:
    """A time `parse_time` took, as metav1.Time (UTC, RFC 3339 to the second) or MicroTime (to the
    microsecond) encodes it; a spelling Python does not read (a one-digit hour) is left as it is."""
    try:
        parsed = datetime.datetime.fromisoformat(value).astimezone(datetime.UTC)
    except ValueError:
        return value
    return parsed.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def parse_quantity(text: str) -> str | None:
    """None if `resource.ParseQuantity(text)` succeeds, else its error message (parseQuantityString's
    walk, then the suffixer)."""
    if text == "":
        return QUANTITY_FORMAT
    pos, end = (1 if text[0] in "+-" else 0), len(text)
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    if pos < end and text[pos] == ".":
        pos += 1
        while pos < end and text[pos].isascii() and text[pos].isdigit():
            pos += 1
    if pos == end:
        return None
    suffix_start = pos
    while pos < end and text[pos] in "eEinumkKMGTP":
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    if pos < end:
        return QUANTITY_FORMAT
    suffix = text[suffix_start:]
    if suffix in _BINARY_SUFFIXES or suffix in _DECIMAL_SUFFIXES:
        return None
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = suffix[1:]
        digits = exponent[1:] if exponent[:1] in "+-" else exponent
        if digits.isascii() and digits.isdigit() and -(2**31) <= int(exponent) < 2**31:
            return None
    return QUANTITY_SUFFIX


_BASE64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def parse_base64(text: str) -> str | None:
    """None if Go's `base64.StdEncoding` decodes `text` (line breaks skipped), else its
    CorruptInputError: `illegal base64 data at input byte N`."""
    src = text.encode()
    si = 0

    def corrupt(at: int) -> str:
        return f"illegal base64 data at input byte {at}"

    while True:
        j = 0
        while j < 4:
            if si == len(src):
                if j == 0:
                    return None
                return corrupt(si - j)
            char = src[si]
            si += 1
            if char in _BASE64:
                j += 1
                continue
            if char in b"\r\n":
                continue
            if char != ord("=") or j in (0, 1):
                return corrupt(si - 1)
            if j == 2:
                while si < len(src) and src[si] in b"\r\n":
                    si += 1
                if si == len(src):
                    return corrupt(len(src))
                if src[si] != ord("="):
                    return corrupt(si - 1)
                si += 1
            while si < len(src) and src[si] in b"\r\n":
                si += 1
            return corrupt(si) if si < len(src) else None
