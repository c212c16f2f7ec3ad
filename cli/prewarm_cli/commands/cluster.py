"""`prewarm cluster add|list|remove`: the EKS clusters one stack serves (`prewarm_cli.clusters`)."""

from __future__ import annotations

import functools
import json
import time
from typing import TYPE_CHECKING, Any

import click

from prewarm_cli.commands.install import install_options, rendered_objects
from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK
from prewarm_cli.options import cluster_options, current_store, current_target, target_options

if TYPE_CHECKING:
    from prewarm.adapters.kube import KubeCluster
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm_cli.targets import Target


@click.group("cluster")
def cluster() -> None:
    """Register EKS clusters with the stack: one push warms every cluster that runs the image.

    \b
    The stack's own cluster (its ClusterName) is always served; `add` registers another one, with labels
    that rules select clusters by (spec.clusters), `list` shows how each answers, `remove` undoes `add`.
    """


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    from prewarm.domain.kubernetes import label_map_problems

    labels: dict[str, str] = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: a label is KEY=VALUE, e.g. env=prod", param_hint="'--label'")
        labels[key] = label
    problems = label_map_problems(labels)
    if problems:
        raise click.BadParameter("; ".join(f"{where.lstrip('.') or 'labels'}: {problem}"
                                           for where, problem in problems), param_hint="'--label'")
    return labels


def _name(name: str) -> str:
    from prewarm.domain.clusters import cluster_name_problem

    if problem := cluster_name_problem(name):
        raise click.BadParameter(f"{name!r}: {problem}", param_hint="'NAME'")
    return name


def _region(region: str) -> str:
    from prewarm.domain.push import REGION

    if region and not REGION.fullmatch(region):
        raise click.BadParameter(f"{region!r} is not an AWS Region name such as \"us-east-1\"",
                                 param_hint="'--cluster-region'")
    return region


def _registered_api(target: Target, registered: RegisteredCluster, kubeconfig: str | None,
                    context: str | None) -> KubeCluster:
    """The cluster's API as you: a kubeconfig's user, or an EKS token from your AWS credentials."""
    from prewarm.adapters.kube import KubeCluster

    if kubeconfig:
        return KubeCluster.from_kubeconfig(kubeconfig, context)
    return KubeCluster.for_registered(registered, session=target.session())


@cluster.command("add")
@click.argument("name")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label of the cluster, which rules select clusters by; repeatable. The labels given are the "
                   "cluster's labels (adding again without them removes them).")
@click.option("--cluster-region", default="", metavar="REGION",
              help="The cluster's AWS Region when not the stack's: EKS is asked there, and its nodes pull that "
                   "Region's ECR replica when the registry replicates the pushed repository there.")
@install_options
@cluster_options
@target_options
@click.pass_context
def add(ctx: click.Context, /, name: str, labels: tuple[str, ...], kubeconfig: str | None, context: str | None,
        cluster_region: str, **options: Any) -> int:
    """Register EKS cluster NAME: access entries for the stack's functions, recorded, checked, the agent installed.

    \b
    Reads NAME's endpoint and CA from EKS, gives each function role of the stack an access entry with the
    Kubernetes groups the installed RBAC binds, records the cluster in the stack's table (Installing: its
    agents' hellos are accepted from then on), has the stack's resource sync function GET its /version
    (lambda:InvokeFunction) and refuses a cluster the stack's network cannot reach or older than
    Kubernetes 1.30, installs what `prewarm install` installs (the agents told their cluster), and records it
    Installed. A refusal or a failed install leaves it Failed with why (`cluster list`); adding it again
    finishes the job. Idempotent. Naming the stack's own cluster (its ClusterName) records its labels only.
    """
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm_cli.clusters import reach_from_stack, register_cluster

    _name(name)
    wanted = _labels(labels)
    target = current_target(ctx)
    store = current_store(ctx)
    before = store.get_cluster(name)
    if name == target.env.get("CLUSTER_NAME"):
        added_at = before.added_at if before is not None and before.added_at else time.time()
        store.put_cluster(RegisteredCluster(name, labels=wanted, added_at=added_at))
        click.echo(f"cluster {name} is this stack's own cluster (ClusterName): its labels recorded "
                   f"({_shown_labels(wanted)})")
        return EXIT_OK
    objects = rendered_objects(target, cluster=name, **options)
    registered = register_cluster(target, store, name, wanted, objects, click.echo,
                                  lambda r: _registered_api(target, r, kubeconfig, context), reach_from_stack(target),
                                  region=_region(cluster_region))
    verb = "configured" if before is not None else "added"
    click.echo(f"cluster/{name} {verb} ({registered.endpoint}, labels {_shown_labels(wanted)})")
    return EXIT_OK


def _shown_labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


@cluster.command("list")
@click.option("--check", is_flag=True,
              help="Reach each cluster's API now (as you), instead of showing how the schedules last found it.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@cluster_options
@target_options
@click.pass_context
def list_clusters(ctx: click.Context, check: bool, output: str, kubeconfig: str | None, context: str | None) -> int:
    """The clusters the stack serves, its own first: setup, API reachability, agents and last sync.

    \b
    SETUP is how far `cluster add` got (Installing, Failed with why, Installed; - for the stack's own); API is
    how the sweep and the resource sync last reached the cluster (every minute), or with --check how it
    answers you now; AGENTS are the nodes whose agent registered; exit 1 when a cluster is unreachable or
    its setup failed.
    """
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm_cli.clusters import check_now, recorded_health
    from prewarm_cli.output import human_age, table

    target = current_target(ctx)
    own_name = target.env.get("CLUSTER_NAME", "")
    store = current_store(ctx)
    found = recorded_health(store, own_name)
    now = time.time()
    if check:
        for health in found:
            if health.own:
                check_now(health, lambda: target.cluster(kubeconfig, context), now=now)
            else:
                registered = RegisteredCluster(health.name, health.endpoint, _ca_of(store, health.name))
                check_now(health, functools.partial(_registered_api, target, registered, None, None), now=now)
    if output == "json":
        click.echo(json.dumps([h.to_json() for h in found], indent=2))
    else:
        def api(reachable: bool | None) -> str:
            return "unknown" if reachable is None else "reachable" if reachable else "unreachable"

        def ago(epoch: float | None) -> str:
            return "-" if epoch is None else human_age(max(0.0, now - epoch)) + " ago"

        headers = ["NAME", "LABELS", "SETUP", "API", "AGENTS", "CHECKED", "LAST SYNC", "MESSAGE"]
        if check:
            headers.insert(5, "AGENT PODS")
        rows = []
        for h in found:
            message = "; ".join(filter(None, (_setup_message(h), h.reason or (
                "not reached by the schedules yet: --check reaches it" if h.reachable is None else ""))))
            row: list[object] = [h.name + (" (own)" if h.own else ""), _shown_labels(h.labels), h.setup or "-",
                                 api(h.reachable), h.agents, ago(h.checked_at), ago(h.last_sync), message]
            if check:
                row.insert(5, h.agent_pods)
            rows.append(row)
        click.echo(table(headers, rows))
    return EXIT_FAILURE if any(h.failed for h in found) else EXIT_OK


def _setup_message(health: Any) -> str:
    from prewarm.domain.clusters import ClusterSetup

    if health.setup == ClusterSetup.FAILED:
        return f"cluster add failed: {health.setup_message}: `prewarm cluster add {health.name}` again"
    if health.setup == ClusterSetup.INSTALLING:
        return (f"cluster add under way (or interrupted: `prewarm cluster add {health.name}` again finishes it)")
    return ""


def _ca_of(store: Any, name: str) -> str:
    registered = store.get_cluster(name)
    return registered.ca_data if registered is not None else ""


@cluster.command("remove")
@click.argument("name")
@cluster_options
@target_options
@click.pass_context
def remove(ctx: click.Context, name: str, kubeconfig: str | None, context: str | None) -> int:
    """Undo `cluster add NAME`: its jobs deleted, the agent uninstalled, access entries deleted, forgotten.

    \b
    A cluster whose API cannot be reached is still removed from the stack (what was installed in it stays;
    `prewarm uninstall --kubeconfig ...` removes it later). Naming the stack's own cluster forgets its labels.
    """
    from prewarm.services.ports import ClusterError
    from prewarm_cli.clusters import forget_nodes, function_roles, mark_jobs_for_deletion, revoke_access
    from prewarm_cli.install.apply import uninstall

    _name(name)
    target = current_target(ctx)
    store = current_store(ctx)
    registered = store.get_cluster(name)
    if name == target.env.get("CLUSTER_NAME"):
        forgotten = store.delete_cluster(name)
        click.echo(f"cluster {name} is this stack's own cluster (ClusterName): it stays served"
                   + ("; its labels were removed" if forgotten else "; it had no labels"))
        return EXIT_OK
    if registered is None:
        click.echo(f'error: cluster "{name}" is not registered with {target.description}', err=True)
        return EXIT_FAILURE
    marked = mark_jobs_for_deletion(store, name, now=time.time())
    click.echo(f"{len(marked)} job{'s' if len(marked) != 1 else ''} of cluster {name} marked for deletion")
    code = EXIT_OK
    try:
        with _registered_api(target, registered, kubeconfig, context) as api:
            changes = uninstall(api, report=lambda change: click.echo(str(change)))
        if not changes:
            click.echo("nothing that prewarm installed was in the cluster")
    except ClusterError as e:
        click.echo(f"warning: cluster {name} was not reached, what was installed in it stays: {e}", err=True)
        code = EXIT_FAILURE
    revoke_access(target.client("eks"), name, function_roles(target.env), click.echo)
    # Forgotten first: an agent still running says hello to a cluster the stack no longer serves, which
    # record_status drops, so its node is not registered again after the nodes are forgotten.
    store.delete_cluster(name)
    nodes = forget_nodes(store, target.queues(), name)
    click.echo(f"cluster/{name} removed ({nodes} node registration{'s' if nodes != 1 else ''} forgotten)")
    return code
