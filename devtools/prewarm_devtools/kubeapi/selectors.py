"""Label and field selectors with the grammar and error messages of k8s.io/apimachinery.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, `a>1`, `a<1`,
comma-joined, whitespace tolerant. Field selectors: `f=v`, `f==v`, `f!=v`, comma-joined, with
`\\`, `\\,` and `\\=` escapes in values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, aggregate
from prewarm_devtools.kubeapi.validation import label_value_errors, qualified_name_errors


class SelectorParseError(ValueError):
    """A selector string does not parse; the message is the API server's."""


class _Tok(Enum):
    ERROR = auto()
    END = auto()
    CLOSE = auto()
    COMMA = auto()
    NOT = auto()
    DOUBLE_EQUALS = auto()
    EQUALS = auto()
    GT = auto()
    IDENT = auto()
    IN = auto()
    LT = auto()
    NOT_EQUALS = auto()
    NOT_IN = auto()
    OPEN = auto()


_SYMBOLS = {
    ")": _Tok.CLOSE,
    ",": _Tok.COMMA,
    "!": _Tok.NOT,
    "==": _Tok.DOUBLE_EQUALS,
    "=": _Tok.EQUALS,
    ">": _Tok.GT,
    "<": _Tok.LT,
    "!=": _Tok.NOT_EQUALS,
    "(": _Tok.OPEN,
}
_KEYWORDS = {"in": _Tok.IN, "notin": _Tok.NOT_IN}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_OPERATORS = {
    _Tok.IN: "in",
    _Tok.NOT_IN: "notin",
    _Tok.EQUALS: "=",
    _Tok.DOUBLE_EQUALS: "==",
    _Tok.NOT_EQUALS: "!=",
    _Tok.GT: "gt",
    _Tok.LT: "lt",
}
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"


def _lex(text: str) -> list[tuple[_Tok, str]]:
    items: list[tuple[_Tok, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            items.append((_Tok.END, ""))
            return items
        if text[i] in _SPECIAL:
            # The longest run of symbols that is still an operator, as the Go lexer scans it.
            j, found = i, None
            while j < n and text[j] in _SPECIAL:
                candidate = text[i : j + 1]
                if candidate in _SYMBOLS:
                    found = candidate
                elif found is not None:
                    break
                j += 1
            if found is None:
                items.append((_Tok.ERROR, f"error expected: keyword found '{text[i:j]}'"))
                i = j
            else:
                items.append((_SYMBOLS[found], found))
                i += len(found)
            continue
        j = i
        while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
            j += 1
        word = text[i:j]
        items.append((_KEYWORDS.get(word, _Tok.IDENT), word))
        i = j


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # in, notin, =, ==, !=, gt, lt, exists, !
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op in ("in", "=", "=="):
            return self.key in labels and labels[self.key] in self.values
        if op in ("notin", "!="):
            return self.key not in labels or labels[self.key] not in self.values
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        if self.key not in labels:
            return False
        try:
            have, want = int(labels[self.key]), int(self.values[0])
        except ValueError:
            return False
        return have > want if op == "gt" else have < want


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, values: bool) -> tuple[_Tok, str]:
        tok, lit = self.items[self.position]
        # In a value position `in` and `notin` are plain words.
        if values and tok in (_Tok.IN, _Tok.NOT_IN):
            tok = _Tok.IDENT
        return tok, lit

    def consume(self, values: bool) -> tuple[_Tok, str]:
        item = self.lookahead(values)
        self.position += 1
        return item

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self.lookahead(True)
            if tok in (_Tok.IDENT, _Tok.NOT):
                try:
                    requirements.append(self.requirement())
                except SelectorParseError as e:
                    raise SelectorParseError(f"unable to parse requirement: {e}") from None
                tok, lit = self.consume(True)
                if tok == _Tok.END:
                    return requirements
                if tok == _Tok.COMMA:
                    tok2, lit2 = self.lookahead(True)
                    if tok2 not in (_Tok.IDENT, _Tok.NOT):
                        raise SelectorParseError(f"found '{lit2}', expected: identifier after ','")
                else:
                    raise SelectorParseError(f"found '{lit}', expected: ',' or 'end of string'")
            elif tok == _Tok.END:
                return requirements
            else:
                raise SelectorParseError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        operator = ""
        tok, key = self.consume(True)
        if tok == _Tok.NOT:
            operator = "!"
            tok, key = self.consume(True)
        if tok != _Tok.IDENT:
            raise SelectorParseError(f"found '{key}', expected: identifier")
        key_errors = qualified_name_errors(key)
        if key_errors:
            raise SelectorParseError(str(FieldError("Invalid", "<nil>", key, "; ".join(key_errors))))
        if self.lookahead(True)[0] in (_Tok.END, _Tok.COMMA) and operator != "!":
            operator = "exists"
        if operator in ("exists", "!"):
            return Requirement(key, operator, ())
        tok, lit = self.consume(False)
        if tok not in _OPERATORS:
            raise SelectorParseError(f"found '{lit}', expected: {_BINARY_OPERATORS}")
        operator = _OPERATORS[tok]
        values = self.set_values() if operator in ("in", "notin") else self.exact_value()
        return _new_requirement(key, operator, sorted(values))

    def set_values(self) -> set[str]:
        tok, lit = self.consume(True)
        if tok != _Tok.OPEN:
            raise SelectorParseError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(True)
        if tok in (_Tok.IDENT, _Tok.COMMA):
            values = self.identifiers()
            if self.consume(True)[0] != _Tok.CLOSE:
                raise SelectorParseError(f"found '{lit}', expected: ')'")
            return values
        if tok == _Tok.CLOSE:
            self.consume(True)
            return {""}
        raise SelectorParseError(f"found '{lit}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self.consume(True)
            if tok == _Tok.IDENT:
                values.add(lit)
                tok2, lit2 = self.lookahead(True)
                if tok2 == _Tok.COMMA:
                    continue
                if tok2 == _Tok.CLOSE:
                    return values
                raise SelectorParseError(f"found '{lit2}', expected: ',' or ')'")
            if tok == _Tok.COMMA:
                # `(,a)`, `(a,,b)` and `(a,)` all hold the empty value.
                if not values:
                    values.add("")
                tok2, _ = self.lookahead(True)
                if tok2 in (_Tok.CLOSE, _Tok.COMMA):
                    values.add("")
                if tok2 == _Tok.CLOSE:
                    return values
                continue
            raise SelectorParseError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        if self.lookahead(True)[0] in (_Tok.END, _Tok.COMMA):
            return {""}
        tok, lit = self.consume(True)
        if tok == _Tok.IDENT:
            return {lit}
        raise SelectorParseError(f"found '{lit}', expected: identifier")


def _new_requirement(key: str, operator: str, values: list[str]) -> Requirement:
    errors: list[FieldError] = []
    if operator in ("gt", "lt"):
        for i, value in enumerate(values):
            try:
                int(value)
            except ValueError:
                errors.append(
                    FieldError(
                        "Invalid", f"values[{i}]", value, "for 'Gt', 'Lt' operators, the value must be an integer"
                    )
                )
    for i, value in enumerate(values):
        problems = label_value_errors(value)
        if problems:
            errors.append(FieldError("Invalid", f"values[{i}][{key}]", value, "; ".join(problems)))
    if errors:
        raise SelectorParseError(aggregate(errors))
    return Requirement(key, operator, tuple(values))


@dataclass(frozen=True)
class LabelSelector:
    """A parsed `labelSelector`; the empty selector matches everything."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse `text`; `SelectorParseError` carries the API server's message."""
        requirements = _Parser(text).parse()
        return cls(tuple(sorted(requirements, key=lambda r: r.key)))

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


FieldGetter = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negated: bool


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            current.append(ch)
            escaped = True
        elif ch == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _split_term(term: str) -> tuple[str, str, str] | None:
    for i in range(len(term)):
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    return None


def _unescape(value: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorParseError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise SelectorParseError(f"invalid field selector: unescaped character in value: {ch}")
        else:
            out.append(ch)
    if escaped:
        raise SelectorParseError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed `fieldSelector` over the fields a resource type supports."""

    terms: tuple[FieldTerm, ...]

    @classmethod
    def parse(cls, text: str, convert: Callable[[str], str]) -> FieldSelector:
        """Parse `text`; `convert` maps a field label to the canonical one or raises SelectorParseError."""
        terms = []
        for part in sorted(_split_unescaped(text, ",")):
            if not part:
                continue
            split = _split_term(part)
            if split is None:
                raise SelectorParseError(f"invalid selector: '{text}'; can't understand '{part}'")
            field, op, raw = split
            terms.append(FieldTerm(field, _unescape(raw), op == "!="))
        return cls(tuple(FieldTerm(convert(t.field), t.value, t.negated) for t in terms))

    @property
    def empty(self) -> bool:
        return not self.terms

    def matches(self, obj: dict[str, Any], getters: Mapping[str, FieldGetter]) -> bool:
        return all((getters[t.field](obj) == t.value) != t.negated for t in self.terms)

    def matches_values(self, values: Mapping[str, str]) -> bool:
        """Match field values computed beforehand (missing fields are empty)."""
        return all((values.get(t.field, "") == t.value) != t.negated for t in self.terms)
