"""`prewarm doctor`'s "registry pulls": whether the token each configured registry's credentials carry
may pull from it.

An ECR token carries the pull permissions of the principal that asked for it: `refresh_ecr_credentials`'
role, or the registry's `roleArn`. Pods pull with it through the pull secrets, agents through the shared
copies. The check asks IAM's policy simulator (`iam:SimulatePrincipalPolicy`, as you) whether that
principal may `ecr:BatchGetImage` (manifests) and `ecr:GetDownloadUrlForLayer` (layers) on the
repositories the stack's jobs warm from the registry, or on the registry's repositories as a whole
(`repository/*`) when no job names one, and names each permission missing. It needs no image to exist
and no network path to the registry; it does not see repository policies, SCPs or permission
boundaries, which may still refuse what it allows. ECR Public needs no permission to pull.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.refresh import CredentialsConfig, RegistryConfig
from prewarm.domain.registries import parse_ecr_registry
from prewarm_cli.doctor.checks import CheckResult, skipped
from prewarm_cli.output import listed

NAME = "registry pulls"
# What a pull with an ECR token needs of its principal (the managed policy AmazonEC2ContainerRegistryPullOnly).
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")


def repository_arns(registry: RegistryConfig, images: Iterable[str]) -> list[str]:
    """The repositories of `images` the registry serves (any of its hosts), else all of its repositories."""
    assert registry.account and registry.region
    found = parse_ecr_registry(registry.host)
    partition = found.partition if found is not None else "aws"
    base = f"arn:{partition}:ecr:{registry.region}:{registry.account}:repository/"
    names = []
    for image in images:
        try:
            ref = parse_image(image)
        except InvalidImageReference:
            continue
        if ref.registry in registry.hosts:
            names.append(ref.repository)
    return [base + name for name in dict.fromkeys(names)] or [base + "*"]


def check_registry_pulls(config: CredentialsConfig | None, *, iam: Any, refresher_role_arn: str,
                         images: Sequence[str], secret_name: str | None = None) -> CheckResult:
    """Each private registry of `config`: may its token's principal pull (see the module docstring)?"""
    if config is None:
        return CheckResult(NAME, True, "none configured (the stack has no CredentialsConfig)")
    private = [r for r in config.registries if not r.public]
    if not private:
        return CheckResult(NAME, True, "only ECR Public, which needs no permission to pull")
    if not refresher_role_arn and any(r.role_arn is None for r in private):
        return skipped(NAME, "the stack names no RefreshEcrCredentialsRoleArn, whose tokens the registries carry")
    problems, fixes, fine = [], [], []
    for registry in private:
        principal = registry.role_arn or refresher_role_arn
        resources = repository_arns(registry, images)
        answer = iam.simulate_principal_policy(PolicySourceArn=principal, ActionNames=list(PULL_ACTIONS),
                                               ResourceArns=resources)
        missing: dict[str, list[str]] = {}
        for result in answer.get("EvaluationResults") or ():
            if result.get("EvalDecision") != "allowed":
                missing.setdefault(result["EvalActionName"], []).append(result.get("EvalResourceName", "*"))
        if not missing:
            fine.append(f"{registry.host} as {principal}")
            continue
        denied = "; ".join(f"{action} on {listed(sorted(where))}" for action, where in sorted(missing.items()))
        problems.append(f"{registry.host}: its token's principal {principal} may not {denied}, so the registry "
                        "refuses its pulls (403)")
        actions = ", ".join(sorted(missing))
        fixes.append(f"grant {actions} on the registry's repositories to the registry's roleArn {principal}"
                     if registry.role_arn else
                     f"grant {actions} to refresh_ecr_credentials' role (template.yaml RefreshEcrCredentialsRole, "
                     "statement RegistryPulls; redeploy the stack)")
    if problems:
        who = (f"pods pulling with the pull secret {secret_name} and " if secret_name else "") + \
            "agents pulling with the shared credentials get 403 Forbidden"
        return CheckResult(NAME, False, "; ".join(problems) + f" ({who})",
                           "; ".join(dict.fromkeys(fixes)) + " (docs/credentials.md)")
    return CheckResult(NAME, True, f"each registry's token may pull: {listed(fine)}")
