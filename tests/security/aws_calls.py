"""Which AWS API calls each Lambda function and the node agent can make, read from the code.

A static call graph, from an entry point (a function's `app.py`, the agent's `main`) through bootstrap,
services and adapters, resolved with the annotations the code already carries: a parameter annotated
with a port (`JobStore`, `TaskQueues`, ...) reaches the methods of that name of every class that
implements the port; `self.x` reaches what `__init__` (or a property) stored there. Functions passed as
callbacks (`_spawn(receiver.consume)`) count as called. In every function reached, a boto3 operation
is what it calls or passes on as `client.<operation>`, or names as a string (`getattr(client, op)`,
`get_paginator("list_secrets")`) in an adapter, the agent, or a module that holds a boto3 client.

`reachable_operations(entry)` gives the operations with where each is; `iam_actions(op)` the IAM
actions one needs (the exceptions to `service:PascalCase` are listed there, each with its source).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "prewarm": ROOT / "layers" / "shared" / "python" / "prewarm",
    "prewarm_agent": ROOT / "agent" / "prewarm_agent",
}
# The AWS services the product talks to (botocore names), with their IAM prefixes.
SERVICES = {"sqs": "sqs", "dynamodb": "dynamodb", "secretsmanager": "secretsmanager", "ecr": "ecr",
            "ecr-public": "ecr-public", "sts": "sts", "eks": "eks", "ssm": "ssm", "ec2": "ec2",
            "scheduler": "scheduler"}
# Where an operation's name as a string is the operation: the adapters (`self._call(what, "get_item")`)
# and the agent, besides every module that holds a client.
_NAMING_MODULES = ("prewarm.adapters.", "prewarm_agent.")
# Receivers that are boto3 clients: `self.client`, `self._sts`, `client`, `sqs`, `session.client("eks")`.
_CLIENT_NAMES = ("client", "sqs", "sts", "ec2")
# TransactWriteItems has no action of its own: each item needs the action of its kind ("Using IAM
# with DynamoDB transactions", DynamoDB Developer Guide).
TRANSACT_ITEM_ACTIONS = {"Put": "dynamodb:PutItem", "Update": "dynamodb:UpdateItem",
                         "Delete": "dynamodb:DeleteItem", "ConditionCheck": "dynamodb:ConditionCheckItem"}


@dataclass(frozen=True)
class Operation:
    """One boto3 operation the code reaches: service, snake_case name, and where."""

    service: str
    name: str
    where: str
    tagged: bool = False  # create_queue(tags=...): tag-on-create
    items: frozenset[str] = frozenset()  # transact_write_items: the item kinds the reached code builds


@cache
def _operations() -> dict[str, set[str]]:
    """snake_case operation → the services (of `SERVICES`) that have it."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    found: dict[str, set[str]] = {}
    for service in SERVICES:
        for name in session.get_service_model(service).operation_names:
            found.setdefault(xform_name(name), set()).add(service)
    return found


def _pascal(service: str, snake: str) -> str:
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model(service)
    (name,) = [n for n in model.operation_names if xform_name(n) == snake]
    return name


def iam_actions(op: Operation) -> set[str]:
    """The IAM actions `op` needs."""
    prefix = SERVICES[op.service]
    special: dict[tuple[str, str], set[str]] = {
        # The batch calls are authorised as their single-message actions (SQS API reference, each batch call).
        ("sqs", "delete_message_batch"): {"sqs:DeleteMessage"},
        ("sqs", "change_message_visibility_batch"): {"sqs:ChangeMessageVisibility"},
        ("sqs", "send_message_batch"): {"sqs:SendMessage"},
        # ECR Public's token is an STS bearer token (ECR Public user guide, "Registry authentication").
        ("ecr-public", "get_authorization_token"): {"ecr-public:GetAuthorizationToken", "sts:GetServiceBearerToken"},
        # A schedule's target role is passed to Scheduler (EventBridge Scheduler user guide, "Set up the
        # execution role": the caller needs iam:PassRole on it).
        ("scheduler", "create_schedule"): {"scheduler:CreateSchedule", "iam:PassRole"},
        ("scheduler", "update_schedule"): {"scheduler:UpdateSchedule", "iam:PassRole"},
        # GetCallerIdentity needs no permission (STS API reference); the EKS token only presigns it.
        ("sts", "get_caller_identity"): set(),
        # A builder: its instance profile's role is passed, its tags given at launch, its AMI may be a
        # resolve:ssm: parameter (EC2 user guide, "Launch permissions", "Tag your resources", "Use a Systems
        # Manager parameter instead of an AMI ID").
        ("ec2", "run_instances"): {"ec2:RunInstances", "iam:PassRole", "ec2:CreateTags", "ssm:GetParameters"},
        ("ec2", "create_snapshot"): {"ec2:CreateSnapshot", "ec2:CreateTags"},
    }
    if (op.service, op.name) in special:
        return special[(op.service, op.name)]
    if (op.service, op.name) == ("dynamodb", "transact_write_items"):
        if not op.items:
            raise AssertionError(f"{op.where}: transact_write_items, but the reached code builds no "
                                 "Put/Update/Delete/ConditionCheck item")
        return {TRANSACT_ITEM_ACTIONS[k] for k in op.items}
    actions = {f"{prefix}:{_pascal(op.service, op.name)}"}
    if op.tagged:
        # Tags given to CreateQueue need sqs:TagQueue too (SQS developer guide, "Tagging your queues").
        actions.add("sqs:TagQueue")
    return actions


# --- the index: modules, functions, classes ---------------------------------------------------------


@dataclass
class Func:
    qname: str
    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None


@dataclass
class Cls:
    qname: str
    module: str
    node: ast.ClassDef
    bases: list[str] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)

    @property
    def is_protocol(self) -> bool:
        return any(isinstance(b, ast.Name) and b.id == "Protocol" for b in self.node.bases)


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)
    services: set[str] = field(default_factory=set)
    uses_boto: bool = False


def _imports(nodes: Iterator[ast.AST], package: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if not node.level else f"{package}.{node.module}"
            for alias in node.names:
                found[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                found[alias.asname or top] = alias.name if alias.asname else top
    return found


class Index:
    def __init__(self, files: dict[str, Path]) -> None:
        self.modules: dict[str, Module] = {}
        self.funcs: dict[str, Func] = {}
        self.classes: dict[str, Cls] = {}
        self.local_imports: dict[str, dict[str, str]] = {}
        self._attributes: dict[str, dict[str, frozenset[str]]] = {}
        for name, path in files.items():
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            imports = _imports(_top_level(tree.body), name.rpartition(".")[0])
            module = self.modules[name] = Module(name, path, tree, imports)
            self._scan_module(module)
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self._add_func(f"{name}.{node.name}", name, node, None)
                elif isinstance(node, ast.ClassDef):
                    self._add_class(name, node)
        for cls in self.classes.values():
            cls.bases = [b for b in (self._resolve_expr(cls.module, None, base) for base in cls.node.bases) if b]

    def _scan_module(self, module: Module) -> None:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Constant) and node.value in SERVICES and isinstance(node.value, str):
                module.services.add(node.value)
            if isinstance(node, ast.Attribute) and _is_client(node.value):
                module.uses_boto = True

    def _add_func(self, qname: str, module: str, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None) -> None:
        self.funcs[qname] = Func(qname, module, node, cls)
        self.local_imports[qname] = _imports(ast.walk(node), module.rpartition(".")[0])

    def _add_class(self, module: str, node: ast.ClassDef) -> None:
        qname = f"{module}.{node.name}"
        cls = self.classes[qname] = Cls(qname, module, node)
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                cls.methods[item.name] = f"{qname}.{item.name}"
                self._add_func(f"{qname}.{item.name}", module, item, qname)

    # --- names and types ---------------------------------------------------------------------------

    def resolve(self, qname: str, depth: int = 0) -> str | None:
        """A qualified name as the function, class or module it names, following re-exports."""
        if qname in self.funcs or qname in self.classes or qname in self.modules or depth > 5:
            return qname if depth <= 5 else None
        module, _, attr = qname.rpartition(".")
        if module in self.modules and attr in self.modules[module].imports:
            return self.resolve(self.modules[module].imports[attr], depth + 1)
        if f"{qname}.__init__" in self.modules:
            return f"{qname}.__init__"
        return None

    def _resolve_name(self, module: str, func: str | None, name: str) -> str | None:
        if func is not None and name in self.local_imports.get(func, {}):
            return self.resolve(self.local_imports[func][name])
        mod = self.modules[module]
        if name in mod.imports:
            return self.resolve(mod.imports[name])
        return self.resolve(f"{module}.{name}")

    def _resolve_expr(self, module: str, func: str | None, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return self._resolve_name(module, func, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self._resolve_expr(module, func, expr.value)
            if base is not None and base in self.modules:
                return self.resolve(f"{base}.{expr.attr}")
        return None

    def annotation_types(self, module: str, func: str | None, ann: ast.expr | None) -> set[str]:
        if ann is None:
            return set()
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return set()
        if isinstance(ann, ast.BinOp):
            return self.annotation_types(module, func, ann.left) | self.annotation_types(module, func, ann.right)
        if isinstance(ann, ast.Subscript):
            return self.annotation_types(module, func, ann.slice) if _name(ann.value) == "Optional" else set()
        resolved = self._resolve_expr(module, func, ann)
        return {resolved} if resolved in self.classes else set()

    def mro(self, cls: str) -> Iterator[Cls]:
        seen: set[str] = set()
        todo = [cls]
        while todo:
            name = todo.pop(0)
            if name in seen or name not in self.classes:
                continue
            seen.add(name)
            yield self.classes[name]
            todo += self.classes[name].bases

    def implementers(self, cls: str) -> list[str]:
        """A concrete class itself; for a port (Protocol), every indexed class with all its methods."""
        if not self.classes[cls].is_protocol:
            return [cls]
        wanted = {m for c in self.mro(cls) if c.is_protocol for m in c.methods}
        return [c.qname for c in self.classes.values() if not c.is_protocol
                and wanted <= {m for k in self.mro(c.qname) for m in k.methods}]

    def method(self, cls: str, name: str) -> list[str]:
        found = []
        for impl in self.implementers(cls):
            for klass in self.mro(impl):
                if name in klass.methods:
                    found.append(klass.methods[name])
                    break
        return found

    def attribute_types(self, cls: str) -> dict[str, frozenset[str]]:
        """`self.x` → the classes stored there, by every method of the class and its bases."""
        if cls not in self._attributes:
            self._attributes[cls] = {}  # while it is worked out, a use of it inside finds nothing yet
            self._attributes[cls] = self._attribute_types(cls)
        return self._attributes[cls]

    def _attribute_types(self, cls: str) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for klass in self.mro(cls):
            for item in klass.node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out.setdefault(item.target.id, set()).update(
                        self.annotation_types(klass.module, None, item.annotation))
            for qname in klass.methods.values():
                func = self.funcs[qname]
                if any(_name(d) == "property" for d in func.node.decorator_list):
                    out.setdefault(func.node.name, set()).update(
                        self.annotation_types(func.module, qname, func.node.returns))
                env = self.local_types(qname, with_self_attrs=False)
                for node in ast.walk(func.node):
                    targets: list[ast.expr] = []
                    value: ast.expr | None = None
                    if isinstance(node, ast.Assign):
                        targets, value = node.targets, node.value
                    elif isinstance(node, ast.AnnAssign):
                        targets, value = [node.target], node.value
                        if _is_self_attr(node.target):
                            out.setdefault(node.target.attr, set()).update(  # type: ignore[attr-defined]
                                self.annotation_types(func.module, qname, node.annotation))
                    for target in targets:
                        if _is_self_attr(target) and value is not None:
                            out.setdefault(target.attr, set()).update(  # type: ignore[attr-defined]
                                self.expr_types(qname, value, env))
        return {k: frozenset(v) for k, v in out.items()}

    def local_types(self, qname: str, *, with_self_attrs: bool = True) -> dict[str, set[str]]:
        func = self.funcs[qname]
        env: dict[str, set[str]] = {}
        args = func.node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            env[arg.arg] = self.annotation_types(func.module, qname, arg.annotation)
        if func.cls is not None and args.args:
            env[args.args[0].arg] = {func.cls}
        for _ in range(2):  # a second pass picks up names assigned from names typed in the first
            for node in ast.walk(func.node):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            env.setdefault(target.id, set()).update(self.expr_types(qname, node.value, env,
                                                                                    with_self_attrs))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    env.setdefault(node.target.id, set()).update(
                        self.annotation_types(func.module, qname, node.annotation))
                elif isinstance(node, ast.NamedExpr):
                    env.setdefault(node.target.id, set()).update(self.expr_types(qname, node.value, env,
                                                                                 with_self_attrs))
                elif isinstance(node, ast.For | ast.comprehension):
                    # Each name a loop unpacks may be any class its iterable holds (an over-approximation).
                    held = self._element_types(qname, node.iter, env, with_self_attrs)
                    for target in ast.walk(node.target):
                        if isinstance(target, ast.Name):
                            env.setdefault(target.id, set()).update(held)
        return env

    def _element_types(self, qname: str, iterable: ast.expr, env: dict[str, set[str]],
                       with_self_attrs: bool) -> set[str]:
        func = self.funcs[qname]
        if isinstance(iterable, ast.List | ast.Tuple | ast.Set):
            out: set[str] = set()
            for elt in iterable.elts:
                parts = elt.elts if isinstance(elt, ast.Tuple) else [elt]
                for part in parts:
                    out |= self.expr_types(qname, part, env, with_self_attrs)
            return out
        if isinstance(iterable, ast.Name):
            for node in ast.walk(func.node):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                        and node.target.id == iterable.id:
                    return {t for n in ast.walk(node.annotation) if isinstance(n, ast.Name | ast.Attribute)
                            for t in self.annotation_types(func.module, qname, n)}
        return set()

    def expr_types(self, qname: str, expr: ast.expr, env: dict[str, set[str]],
                   with_self_attrs: bool = True) -> set[str]:
        func = self.funcs[qname]
        if isinstance(expr, ast.Name):
            if expr.id in env:
                return set(env[expr.id])
            resolved = self._resolve_name(func.module, qname, expr.id)
            return {resolved} if resolved in self.classes else set()
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.expr_types(qname, v, env, with_self_attrs) for v in expr.values))
        if isinstance(expr, ast.IfExp):
            return self.expr_types(qname, expr.body, env, with_self_attrs) | self.expr_types(
                qname, expr.orelse, env, with_self_attrs)
        if isinstance(expr, ast.Call):
            targets = self.call_targets(qname, expr.func, env, with_self_attrs)
            out: set[str] = set()
            for target in targets:
                if target in self.classes:
                    out.add(target)
                elif target in self.funcs:
                    callee = self.funcs[target]
                    out |= self.annotation_types(callee.module, target, callee.node.returns)
            return out
        if isinstance(expr, ast.Attribute) and with_self_attrs:
            out = set()
            for cls in self.expr_types(qname, expr.value, env, with_self_attrs):
                out |= set(self.attribute_types(cls).get(expr.attr, ()))
            return out
        return set()

    def call_targets(self, qname: str, expr: ast.expr, env: dict[str, set[str]],
                     with_self_attrs: bool = True) -> set[str]:
        """The functions and classes an expression names (what calling it runs)."""
        func = self.funcs[qname]
        if isinstance(expr, ast.Name):
            if env.get(expr.id):
                return set()
            resolved = self._resolve_name(func.module, qname, expr.id)
            return {resolved} if resolved in self.funcs or resolved in self.classes else set()
        if isinstance(expr, ast.Attribute):
            direct = self._resolve_expr(func.module, qname, expr)
            if direct in self.funcs or direct in self.classes:
                return {direct}
            out: set[str] = set()
            for cls in self.expr_types(qname, expr.value, env, with_self_attrs):
                out.update(self.method(cls, expr.attr))
            return out
        return set()


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements outside functions and classes, into `if TYPE_CHECKING:` and `try:` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _top_level([*node.body, *node.orelse, *getattr(node, "handlers", [])])
        elif isinstance(node, ast.ExceptHandler):
            yield from _top_level(node.body)


def _name(expr: ast.expr) -> str:
    return expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else ""


def _is_self_attr(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"


def _is_client(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Call):
        return _name(expr.func) == "client"
    name = _name(expr).lstrip("_").lower()
    return any(name == c or name.endswith(c) for c in _CLIENT_NAMES)


def _client_service(func: ast.AST, receiver: ast.expr) -> set[str]:
    """The service of a client built in the function: `client = factory("ecr-public", ...)` before its use."""
    if isinstance(receiver, ast.Call):
        return {a.value for a in receiver.args[:1] if isinstance(a, ast.Constant) and a.value in SERVICES}
    if not isinstance(receiver, ast.Name):
        return set()
    built = [(node.lineno, a.value) for node in ast.walk(func) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == receiver.id for t in node.targets)
             and isinstance(node.value, ast.Call)
             for a in node.value.args[:1] if isinstance(a, ast.Constant) and a.value in SERVICES
             and node.lineno <= receiver.lineno]
    return {max(built)[1]} if built else set()


def index_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for package, base in SOURCES.items():
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            if parts and parts[-1] == "__init__":  # a package's own module is named as the package
                parts = parts[:-1]
            files[".".join((package, *parts))] = path
    for app in (ROOT / "functions").glob("*/app.py"):
        files[f"functions.{app.parent.name}.app"] = app
    return files


@cache
def index() -> Index:
    return Index(index_files())


def reached_functions(entries: list[str]) -> set[str]:
    """Every function reachable from the entries (calls, constructors, and functions passed on)."""
    idx = index()
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        qname = todo.pop()
        if qname in seen:
            continue
        if qname in idx.classes:
            todo += [m for m in (idx.method(qname, "__init__") + idx.method(qname, "__post_init__"))]
            seen.add(qname)
            continue
        if qname not in idx.funcs:
            continue
        seen.add(qname)
        env = idx.local_types(qname)
        for node in ast.walk(idx.funcs[qname].node):
            if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
                todo += list(idx.call_targets(qname, node, env))
    return seen


def reachable_operations(entries: list[str]) -> list[Operation]:
    """The boto3 operations the functions reachable from `entries` call, pass on or name."""
    idx = index()
    ops = _operations()
    found: list[Operation] = []
    reached = sorted(reached_functions(entries))
    # The transaction items the reached code builds ({"Update": ...}), whichever function sends them.
    items = frozenset(k.value for q in reached if q in idx.funcs for node in ast.walk(idx.funcs[q].node)
                      if isinstance(node, ast.Dict) for k in node.keys
                      if isinstance(k, ast.Constant) and k.value in TRANSACT_ITEM_ACTIONS)
    for qname in reached:
        if qname not in idx.funcs:
            continue
        func = idx.funcs[qname]
        module = idx.modules[func.module]
        where = f"{module.path.relative_to(ROOT)}:{qname.rpartition('.')[2]}"

        def add(name: str, line: int, *, tagged: bool = False, module: Module = module, where: str = where,
                hint: set[str] | None = None) -> None:
            candidates = ops[name]
            narrowed = candidates & (hint or set()) or candidates & module.services or candidates
            if len(narrowed) > 1:
                raise AssertionError(f"{where}:{line}: cannot tell which service's {name} this is: {narrowed}")
            for service in narrowed:
                found.append(Operation(service, name, f"{where}:{line}", tagged, items))

        for node in ast.walk(func.node):
            if isinstance(node, ast.Attribute) and node.attr in ops and _is_client(node.value):
                parent_call = next((c for c in ast.walk(func.node) if isinstance(c, ast.Call) and c.func is node), None)
                tagged = parent_call is not None and any(k.arg == "tags" for k in parent_call.keywords)
                add(node.attr, node.lineno, tagged=tagged, hint=_client_service(func.node, node.value))
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ops
                  and (module.uses_boto or module.name.startswith(_NAMING_MODULES))):
                add(node.value, node.lineno)
    return found
