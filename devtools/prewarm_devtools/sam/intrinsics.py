"""Evaluates the CloudFormation intrinsic functions `template.yaml` uses, against local resources.

Enough of CloudFormation for the values local mode needs (function environments, event source
properties): `Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If` with conditions, `Fn::Join`, `Fn::Select`,
`Fn::Split`, `Fn::Equals`/`Not`/`And`/`Or`, and `AWS::NoValue`. Anything else raises, naming it,
so a template change that local mode cannot follow fails loudly instead of running half-wired.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.sam.template import TemplateError

NO_VALUE = object()


def check_number(name: str, spec: Mapping[str, Any], value: Any) -> None:
    """Refuses a Number parameter's value as CloudFormation does at deploy: not a number, or outside
    MinValue..MaxValue (`StatusConcurrency=1` is refused there, as Lambda's MaximumConcurrency starts at 2).

    >>> check_number("N", {"MinValue": 2}, "1")
    Traceback (most recent call last):
    ...
    prewarm_devtools.sam.template.TemplateError: Parameter 'N' must be a number not less than 2
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TemplateError(f"Parameter '{name}' must be a number") from None
    if "MinValue" in spec and number < float(spec["MinValue"]):
        raise TemplateError(f"Parameter '{name}' must be a number not less than {spec['MinValue']}")
    if "MaxValue" in spec and number > float(spec["MaxValue"]):
        raise TemplateError(f"Parameter '{name}' must be a number not greater than {spec['MaxValue']}")


@dataclass
class Physical:
    """What a logical resource became locally: its Ref value and attributes (Arn, StreamArn, ...)."""

    ref: str
    attrs: dict[str, str] = field(default_factory=dict)


class Resolver:
    def __init__(
        self,
        template: Mapping[str, Any],
        *,
        parameters: Mapping[str, str],
        physical: Mapping[str, Physical],
        stack_name: str,
        region: str,
        account: str,
    ) -> None:
        self.template = template
        self.physical = physical
        self.pseudo = {
            "AWS::StackName": stack_name,
            "AWS::Region": region,
            "AWS::AccountId": account,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{region}:{account}:stack/{stack_name}/local",
        }
        self.parameters: dict[str, Any] = {}
        for name, spec in template.get("Parameters", {}).items():
            value = parameters.get(name, spec.get("Default"))
            if value is None:
                raise TemplateError(f"parameter {name} has no default: give it a value")
            if spec.get("Type") == "CommaDelimitedList":
                value = [v for v in str(value).split(",") if v] if isinstance(value, str) else list(value)
            if spec.get("Type") == "Number":
                check_number(name, spec, value)
            self.parameters[name] = value
        self._conditions: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            spec = self.template.get("Conditions", {}).get(name)
            if spec is None:
                raise TemplateError(f"condition {name} is not defined")
            self._conditions[name] = bool(self.resolve(spec))
        return self._conditions[name]

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [v for v in (self.resolve(v) for v in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            handler = _FUNCTIONS.get(key)
            if handler is not None:
                return handler(self, arg)
            if key.startswith("Fn::"):
                raise TemplateError(f"local mode does not evaluate {key}")
        return {k: r for k, v in value.items() if (r := self.resolve(v)) is not NO_VALUE}

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self.physical:
            return self.physical[name].ref
        raise TemplateError(f"Ref {name}: no such parameter, or a resource local mode does not create")

    def get_att(self, arg: Any) -> str:
        logical, attr = arg if isinstance(arg, list) else str(arg).split(".", 1)
        res = self.physical.get(logical)
        if res is None or attr not in res.attrs:
            raise TemplateError(f"Fn::GetAtt {logical}.{attr}: not available locally")
        return res.attrs[attr]

    def sub(self, arg: Any) -> str:
        text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in extra:
                return str(extra[name])
            if "." in name:
                return self.get_att(name.split(".", 1))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}!]+)\}", one, text)


def _if(r: Resolver, arg: Any) -> Any:
    name, then, otherwise = arg
    return r.resolve(then if r.condition(name) else otherwise)


def _join(r: Resolver, arg: Any) -> str:
    sep, items = arg
    values = r.resolve(items)
    return str(sep).join(str(v) for v in values)


def _select(r: Resolver, arg: Any) -> Any:
    index, items = arg
    return r.resolve(items)[int(r.resolve(index))]


def _split(r: Resolver, arg: Any) -> list[str]:
    sep, text = arg
    return str(r.resolve(text)).split(sep)


_FUNCTIONS: dict[str, Any] = {
    "Ref": lambda r, a: r.ref(a),
    "Fn::GetAtt": lambda r, a: r.get_att(a),
    "Fn::Sub": lambda r, a: r.sub(a),
    "Fn::If": _if,
    "Fn::Join": _join,
    "Fn::Select": _select,
    "Fn::Split": _split,
    "Fn::Equals": lambda r, a: r.resolve(a[0]) == r.resolve(a[1]),
    "Fn::Not": lambda r, a: not r.resolve(a[0]),
    "Fn::And": lambda r, a: all(r.resolve(x) for x in a),
    "Fn::Or": lambda r, a: any(r.resolve(x) for x in a),
    "Condition": lambda r, a: r.condition(a),
}
