"""`prewarm apply`: create or update jobs and rules from manifests, as kubectl apply does."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from prewarm_cli.cluster_choice import chosen_many, cluster_option, own_cluster_name, reach, shown
from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from prewarm_cli.options import current_store, current_target, target_options

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN_NAME = "<stdin>"


class _ClusterSecrets:
    """The cluster's secrets, as you read them, reached only when a manifest asks `pullSecretsOnly`."""

    def __init__(self, open_cluster: Callable[[], Any]) -> None:
        self._open = open_cluster
        self._cluster: Any = None

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self._cluster is None:
            self._cluster = self._open()
        found: dict[str, Any] | None = self._cluster.get_secret(namespace, name)
        return found

    def close(self) -> None:
        if self._cluster is not None and hasattr(self._cluster, "close"):
            self._cluster.close()


@dataclass
class _Document:
    where: str  # `jobs.yaml document 2` (`, item 1` inside a `kind: List`)
    body: Any


def _sources(filenames: Sequence[str], recursive: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    for name in filenames:
        if name == "-":
            yield STDIN_NAME, lambda: sys.stdin.read()
            continue
        path = Path(name)
        if path.is_dir():
            found = path.rglob("*") if recursive else path.iterdir()
            for file in sorted(p for p in found if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES):
                yield str(file), functools.partial(file.read_text, encoding="utf-8")
        else:
            yield name, functools.partial(path.read_text, encoding="utf-8")


def _duplicate_key(node: Any) -> Any:
    """The first mapping key node that repeats an earlier key of its mapping (kubectl refuses those)."""
    import yaml

    seen_nodes: set[int] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in keys:
                        return key
                    keys.add((key.tag, key.value))
                pending += [key, value]
        elif isinstance(current, yaml.SequenceNode):
            pending += current.value
    return None


def _not_an_object(value: Any) -> str:
    from prewarm.domain.kubernetes import describe_value

    problem = f"a manifest must be a mapping with apiVersion and kind (got {describe_value(value)})"
    if isinstance(value, list):
        problem += "; give several objects as documents separated by ---, or as the items of a kind: List"
    return problem


def _documents(source: str, text: str) -> tuple[list[_Document], list[str]]:
    """The documents of one file (a `kind: List` unpacked), and its problems: a document with a duplicate
    key is left out (the others are kept); a YAML syntax error ends the file."""
    import yaml

    documents: list[_Document] = []
    problems: list[str] = []
    number = 0
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
                continue
            number += 1
            where = f"{source} document {number}"
            if (duplicate := _duplicate_key(node)) is not None:
                problems.append(f'{where}: duplicate key "{duplicate.value}" at line {duplicate.start_mark.line + 1}')
                continue
            body = loader.construct_document(node)
            items = body.get("items") if isinstance(body, dict) and body.get("kind") == "List" else None
            parts = ([(f"{where}, item {i}", item) for i, item in enumerate(items, start=1)]
                     if isinstance(items, list) else [(where, body)])
            for part, item in parts:
                if isinstance(item, dict):
                    documents.append(_Document(part, item))
                else:
                    problems.append(f"{part}: {_not_an_object(item)}")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).replace("\n", " ")
        problems.append(f"{source}: invalid YAML{at}: {problem}")
    finally:
        loader.dispose()
    return documents, problems


def _check_rule(ctx: click.Context, body: dict[str, Any], clusters: Sequence[str]) -> None:
    """A rule belongs to the stack and names its clusters itself: `--cluster` with one, or a rule naming a
    cluster the stack does not serve (its pushes would make no job there), is refused naming it."""
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm.domain.kubernetes import JobValidationError
    from prewarm.domain.manifests import parse_manifest
    from prewarm.domain.rules import PrewarmRule

    if body.get("kind") != "PrewarmRule":
        return
    rule = parse_manifest(body)
    if not isinstance(rule, PrewarmRule):
        return
    subject = f"PrewarmRule {rule.metadata.name}"
    if clusters:
        raise JobValidationError([("", "--cluster does not apply to a rule: a rule belongs to the stack and "
                                       "selects its clusters with spec.clusters")], subject=subject)
    selector, own = rule.spec.clusters, own_cluster_name(ctx)
    served = [RegisteredCluster(""), *current_store(ctx).list_clusters()]
    if unknown := selector.unknown_names(served, own) if selector else []:
        raise JobValidationError([("spec.clusters.names", f'cluster "{name}" is not registered with '
                                   f"{current_target(ctx).description}: see `prewarm cluster list`")
                                  for name in unknown], subject=subject)


def _warnings(body: dict[str, Any]) -> list[str]:
    """What an applied manifest should tell its user (an AdvancedCronJob with no time zone), as kubectl's
    `Warning:` lines."""
    if body.get("kind") != "AdvancedCronJob":
        return []
    from prewarm.domain.cronjobs import AdvancedCronJob
    from prewarm.domain.manifests import parse_manifest

    job = parse_manifest(body)
    return job.warnings() if isinstance(job, AdvancedCronJob) else []


@click.command()
@click.option("-f", "--filename", "filenames", multiple=True, required=True,
              type=click.Path(exists=True, allow_dash=True), metavar="FILE|DIR|-",
              help="Manifests to apply: a file, a directory of .yaml/.yml/.json files, or - for stdin. Repeatable.")
@click.option("-R", "--recursive", is_flag=True, help="Also read the directories' subdirectories.")
@click.option("--as-resource", is_flag=True,
              help="Create or update the prewarm.dev/v1alpha1 resources in the stack's cluster instead of the table "
                   "(the stack's sync_resources applies them within a minute).")
@click.option("--kubeconfig", metavar="PATH", envvar="PREWARM_KUBECONFIG",
              help="With --as-resource, or to check the secrets of a pullSecretsOnly job: reach the cluster as "
                   "this kubeconfig's user.")
@cluster_option(multiple=True)
@target_options
@click.pass_context
def apply(ctx: click.Context, filenames: tuple[str, ...], recursive: bool, as_resource: bool,
          kubeconfig: str | None, clusters: tuple[str, ...]) -> int:
    """Create or update jobs, rules, warm snapshots and cron jobs from manifests, as `kubectl apply` does.

    \b
    Kinds: ImagePullJob, ImageListPullJob (apps.kruise.io/v1alpha1 or v1beta1, prewarm.dev/v1alpha1),
    AdvancedCronJob (apps.kruise.io/v1beta1, prewarm.dev/v1alpha1), PrewarmRule and WarmSnapshot
    (prewarm.dev/v1alpha1); multi-document YAML and `kind: List` are read.
    Valid documents are applied even when others are invalid; invalid ones are reported, each
    naming the file, the document and the field, and the exit code is then 2. A job or rule with
    pullSecretsOnly is applied only when each of its pullSecrets exists in its namespace (read as you).
    Jobs go to the stack's own cluster, or to each `--cluster` named (one job per cluster); rules belong
    to the stack and serve the clusters their spec.clusters selects: `--cluster` with a rule, or a rule
    naming a cluster the stack does not serve, is refused.
    """
    from prewarm.domain.kubernetes import JobValidationError
    from prewarm.domain.sources import SourceConflictError
    from prewarm.domain.warm_budgets import WarmBudgetExceededError
    from prewarm.services.jobs import apply_manifest
    from prewarm.services.ports import ClusterError, StoreError

    targets = chosen_many(ctx, clusters)
    write: Callable[[dict[str, Any]], str]
    notes: list[str] = []
    if as_resource:
        from prewarm_cli.resources import ResourceWriter

        writers = [ResourceWriter(functools.partial(reach, ctx, c, kubeconfig)) for c in targets]

        def write(body: dict[str, Any]) -> str:
            _check_rule(ctx, body, clusters)
            return "\n".join(w.apply(body) for w in writers)
    else:
        from prewarm.adapters.ecr import EcrImages

        # Sizes for the namespaces' warm budgets, read from ECR only where a namespace has one.
        sizes = EcrImages(client=current_target(ctx).client("ecr"))
        secrets = {c: _ClusterSecrets(functools.partial(reach, ctx, c, kubeconfig)) for c in targets}
        for reader in secrets.values():
            ctx.call_on_close(reader.close)

        def write(body: dict[str, Any]) -> str:
            _check_rule(ctx, body, clusters)
            lines = []
            for cluster in targets if body.get("kind") != "PrewarmRule" else targets[:1]:
                applied = apply_manifest(current_store(ctx), body, now=time.time(), secrets=secrets[cluster],
                                         cluster=cluster, sizes=sizes)
                where = f" (cluster {shown(ctx, cluster)})" if len(targets) > 1 or cluster else ""
                lines.append(applied.describe() + where)
                if applied.note:  # what the namespace's warm budget says of it: trimmed images, sizes unknown
                    notes.append(f"{applied.kind} {applied.namespace}/{applied.name}: {applied.note}")
            return "\n".join(lines)

    invalid = failed = applied = 0
    for source, read in _sources(filenames, recursive):
        try:
            text = read()
        except (OSError, UnicodeDecodeError) as e:
            click.echo(f"error: {source}: cannot read: {getattr(e, 'strerror', None) or e}", err=True)
            invalid += 1
            continue
        documents, problems = _documents(source, text)
        for doc in documents:
            notes.clear()
            try:
                outcome = write(doc.body)
            except JobValidationError as e:
                subject = f" ({e.subject})" if e.subject else ""
                for problem in e.errors:
                    click.echo(f"error: {doc.where}{subject}: {problem}", err=True)
                invalid += 1
            except (StoreError, SourceConflictError, ClusterError, WarmBudgetExceededError) as e:
                click.echo(f"error: {doc.where}: {e}", err=True)
                failed += 1
            else:
                click.echo(outcome)
                for warning in [*_warnings(doc.body), *notes]:
                    click.echo(f"Warning: {doc.where}: {warning}", err=True)
                applied += 1
        for file_problem in problems:
            click.echo(f"error: {file_problem}", err=True)
            invalid += 1
    if not (applied or invalid or failed):
        raise click.UsageError("no objects passed to apply")
    return EXIT_USAGE if invalid else EXIT_FAILURE if failed else EXIT_OK


# --- get -----------------------------------------------------------------------------------------

