"""Writes gotypes_table.py: what the official Python client's models do not say of the Go types behind
them, read from the Go sources of k8s.io/api and k8s.io/apimachinery.

The Python models give every kind's fields and their nesting; they do not say whether an `int` is an
int32 or an int64, which strings are named Go types (`v1.PullPolicy`), which are quantities or
`[]byte`, which `object` is an IntOrString, nor which `datetime` is a MicroTime. The table holds, for
each model reachable from a served kind, the fields whose Go type differs from the one the Python
type implies by default (`str` string, `int` int32, `datetime` v1.Time, `object` any value), and the
underlying type of each named Go type met, so decoding words its errors as the real server does.

Run it against checkouts of the Kubernetes release the Python client was generated from:

    python -m prewarm_devtools.kubeapi.gotypes_generate K8S_API_DIR APIMACHINERY_DIR "SOURCES" > gotypes_table.py

(SOURCES names the commits, for the table's docstring.) Fields the Python client has and Go has not, or
the other way round, are listed on stderr: the first decode with their default type.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client

from prewarm_devtools.kubeapi.gotypes import (
    MODEL_NAME,
    SERVED_KINDS,
    default_go_type,
    python_type_parts,
)

# Go package path -> the source file (relative to its repository) holding its API types.
API_PACKAGES = {
    "k8s.io/api/core/v1": "core/v1/types.go",
    "k8s.io/api/apps/v1": "apps/v1/types.go",
    "k8s.io/api/rbac/v1": "rbac/v1/types.go",
    "k8s.io/api/scheduling/v1": "scheduling/v1/types.go",
    "k8s.io/api/admissionregistration/v1": "admissionregistration/v1/types.go",
    "k8s.io/api/authorization/v1": "authorization/v1/types.go",
    "k8s.io/api/authentication/v1": "authentication/v1/types.go",
}
META = "k8s.io/apimachinery/pkg/apis/meta/v1"
MACHINERY_FILES = {META: "pkg/apis/meta/v1/types.go"}
# Types with their own UnmarshalJSON, known by their package path and name.
SPECIAL = {
    (META, "Time"): "v1.Time",
    (META, "MicroTime"): "v1.MicroTime",
    (META, "FieldsV1"): "v1.FieldsV1",
    (META, "Duration"): "v1.Duration",
    ("k8s.io/apimachinery/pkg/api/resource", "Quantity"): "resource.Quantity",
    ("k8s.io/apimachinery/pkg/util/intstr", "IntOrString"): "intstr.IntOrString",
    ("k8s.io/apimachinery/pkg/runtime", "RawExtension"): "runtime.RawExtension",
    ("k8s.io/apimachinery/pkg/types", "UID"): "types.UID",
}
BUILTIN = {"string", "bool", "int", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
           "float64", "byte", "any"}

_FIELD = re.compile(r"^\s*(?:(\w+)\s+)?([\w.*\[\]]+(?:\[[\w.*]+\][\w.*\[\]]+)?)\s+`([^`]*)`")
_TYPE = re.compile(r"^type (\w+) (.+?)\s*(?://.*)?$")


@dataclass
class GoField:
    json: str  # "" when embedded inline
    type: str  # as written in the source
    embedded: bool


@dataclass
class GoPackage:
    path: str
    imports: dict[str, str] = field(default_factory=dict)  # alias -> path
    structs: dict[str, list[GoField]] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)  # named non-struct types -> their definition


def parse_package(path: str, source: str) -> GoPackage:
    package = GoPackage(path)
    for alias, imported in re.findall(r'^\s*(\w+ )?"([\w./-]+)"\s*$', source, re.M):
        package.imports[alias.strip() or imported.rsplit("/", 1)[-1]] = imported
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        struct = re.match(r"^type (\w+) struct \{\s*$", line)
        if struct:
            fields: list[GoField] = []
            i += 1
            while not lines[i].startswith("}"):
                found = _FIELD.match(lines[i].split("//")[0] if "`" not in lines[i] else lines[i])
                if found and not lines[i].lstrip().startswith("//"):
                    name, gotype, tags = found.groups()
                    tag = re.search(r'json:"([^"]*)"', tags)
                    json_name = tag.group(1).split(",")[0] if tag else (name or "")
                    if json_name != "-":
                        fields.append(GoField(json_name if name or json_name else "", gotype, name is None))
                i += 1
            package.structs[struct.group(1)] = fields
        else:
            named = _TYPE.match(line)
            if named and not named.group(2).startswith(("struct", "interface", "func", "(")):
                package.named[named.group(1)] = named.group(2)
        i += 1
    return package


class GoSources:
    def __init__(self, packages: dict[str, GoPackage]) -> None:
        self.packages = packages

    def resolve(self, package: GoPackage, ident: str) -> tuple[str, str]:
        """(package path, name) of a type identifier written in `package`."""
        if "." in ident:
            alias, name = ident.split(".", 1)
            return package.imports[alias], name
        return package.path, ident

    def render(self, package: GoPackage, expr: str, top: bool = True) -> str:
        """reflect.Type.String() of a Go type expression (a top-level pointer stripped: decoding reports the
        type pointed to)."""
        if expr.startswith("*"):
            return self.render(package, expr[1:], top) if top else "*" + self.render(package, expr[1:], False)
        if expr.startswith("[]"):
            return "[]" + self.render(package, expr[2:], False)
        if expr.startswith("map["):
            key, value = _split_map(expr)
            return f"map[{self.render(package, key, False)}]{self.render(package, value, False)}"
        if expr in BUILTIN:
            return {"byte": "uint8", "any": "interface {}"}.get(expr, expr)
        path, name = self.resolve(package, expr)
        if (path, name) in SPECIAL:
            return SPECIAL[(path, name)]
        return f"{path.rsplit('/', 1)[-1]}.{name}"

    def underlying(self, package: GoPackage, expr: str) -> str | None:
        """The rendered definition of a named non-struct type, or None."""
        bare = expr.lstrip("*")
        if bare in BUILTIN or bare.startswith(("[]", "map[")):
            return None
        path, name = self.resolve(package, bare)
        if (path, name) in SPECIAL or path not in self.packages:
            return None
        owner = self.packages[path]
        if name in owner.named:
            return self.render(owner, owner.named[name])
        return None

    def fields(self, path: str, struct: str) -> dict[str, tuple[GoPackage, str]]:
        """The struct's JSON fields (embedded inline structs flattened) -> (package written in, type expr)."""
        package = self.packages[path]
        found: dict[str, tuple[GoPackage, str]] = {}
        for f in package.structs[struct]:
            if f.embedded and not f.json:
                inner_path, inner = self.resolve(package, f.type.lstrip("*"))
                found.update(self.fields(inner_path, inner))
            else:
                found[f.json] = (package, f.type)
        return found


def _split_map(expr: str) -> tuple[str, str]:
    depth, i = 0, len("map[")
    while True:
        depth += {"[": 1, "]": -1}.get(expr[i], 0)
        if depth < 0:
            return expr[4:i], expr[i + 1:]
        i += 1


def load_sources(api_dir: Path, machinery_dir: Path) -> GoSources:
    packages = {p: parse_package(p, (api_dir / f).read_text()) for p, f in API_PACKAGES.items()}
    packages.update({p: parse_package(p, (machinery_dir / f).read_text()) for p, f in MACHINERY_FILES.items()})
    return GoSources(packages)



def generate(sources: GoSources) -> tuple[dict[str, dict[str, str]], dict[str, str], list[str]]:
    """(model -> {json field: Go type} where it differs from the default, named type -> underlying, notes)."""
    fields_out: dict[str, dict[str, str]] = {}
    named_out: dict[str, str] = {}
    notes: list[str] = []
    todo = [(model, path, kind) for (_, kind), (model, path) in SERVED_KINDS.items()]
    seen: set[str] = set()
    while todo:
        model, path, struct = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        expected = MODEL_NAME.match(model)
        if not expected or expected.group(3) != struct:
            notes.append(f"{model}: Go struct {struct} is not what its name says")
        cls = getattr(kubernetes.client, model)
        go_fields = sources.fields(path, struct)
        by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
        for json_name in go_fields.keys() - by_json.keys():
            notes.append(f"{model}.{json_name}: in Go, not in the Python client")
        for json_name, attr in by_json.items():
            if json_name not in go_fields:
                notes.append(f"{model}.{json_name}: in the Python client, not in Go")
                continue
            package, expr = go_fields[json_name]
            python_type = cls.openapi_types[attr]
            rendered = sources.render(package, expr)
            if rendered != default_go_type(python_type):
                fields_out.setdefault(model, {})[json_name] = rendered
            _collect_named(sources, package, expr, named_out)
            nested_model, nested_expr = _nested_struct(python_type, expr)
            if nested_model:
                nested_path, nested_struct = sources.resolve(package, nested_expr)
                todo.append((nested_model, nested_path, nested_struct))
    return fields_out, named_out, notes


def _collect_named(sources: GoSources, package: GoPackage, expr: str, out: dict[str, str]) -> None:
    expr = expr.lstrip("*")
    if expr.startswith("[]"):
        _collect_named(sources, package, expr[2:], out)
    elif expr.startswith("map["):
        key, value = _split_map(expr)
        _collect_named(sources, package, key, out)
        _collect_named(sources, package, value, out)
    else:
        definition = sources.underlying(package, expr)
        if definition is not None:
            out[sources.render(package, expr)] = definition
            path, name = sources.resolve(package, expr)
            _collect_named(sources, sources.packages[path], sources.packages[path].named[name], out)


def _nested_struct(python_type: str, expr: str) -> tuple[str | None, str]:
    """The model a field's (innermost) element is, and the Go expression of that element."""
    parts = python_type_parts(python_type)
    expr = expr.lstrip("*")
    while parts[0] in ("list", "dict"):
        if expr.startswith("[]"):
            expr = expr[2:].lstrip("*")
        elif expr.startswith("map["):
            expr = _split_map(expr)[1].lstrip("*")
        parts = parts[1]
    return (parts[1] if parts[0] == "model" else None), expr


def render_table(fields: dict[str, dict[str, str]], named: dict[str, str], source: str) -> str:
    lines = [
        '"""Generated by gotypes_generate.py from the Go sources of k8s.io/api and k8s.io/apimachinery: do not',
        'edit. What the Python client\'s models do not say of the Go types behind them (see gotypes.py).',
        "",
        *textwrap.wrap(f"Sources: {source}.", 100),
        '"""',
        "",
        "#: Per model, the JSON fields whose Go type is not the one its Python type implies.",
        "FIELD_TYPES: dict[str, dict[str, str]] = {",
    ]
    for model in sorted(fields):
        lines.append(f"    {model!r}: {{")
        lines.extend(f"        {k!r}: {v!r}," for k, v in sorted(fields[model].items()))
        lines.append("    },")
    lines += ["}", "", "#: The definition of each named Go type met (reflect's name -> its underlying type).",
              "NAMED_TYPES: dict[str, str] = {"]
    lines.extend(f"    {k!r}: {v!r}," for k, v in sorted(named.items()))
    lines += ["}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    sources = load_sources(Path(argv[0]), Path(argv[1]))
    fields, named, notes = generate(sources)
    for note in notes:
        print(note, file=sys.stderr)
    sys.stdout.write(render_table(fields, named, argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
