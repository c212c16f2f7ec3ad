"""A second Region's ECR registry for local mode (`prewarm local up --clusters 2 --replica-region R`).

The registry that plays ECR in `REGION` replicates every repository to `R`, as a registry's replication
configuration does (moto records it, so `DescribeRegistry` answers it). The replica is a registry of its
own, answering for `<account>.dkr.ecr.R.amazonaws.com`: an image is there only once replicated, so a pull
that races replication fails as on ECR. Replicating copies the image into it and into moto's ECR of `R`, and
returns ECR's "ECR Replication Action" event, which the caller delivers as EventBridge would. The rule in
`R` that forwards it to the stack's bus on AWS is put in moto as an operator puts it (docs/operations.md,
"Replicas"), so that `prewarm doctor` finds it.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Any

from prewarm_devtools.account import ACCOUNT, REGION
from prewarm_devtools.localecr import PushedToEcr, ecr_host, store_image


class LocalReplica:
    """Region `region`'s registry, and the replication into it of what is pushed to `REGION`'s."""

    def __init__(self, region: str, base_dir: Path, aws: Any) -> None:
        self.region = region
        self.base_dir = base_dir
        self.aws = aws
        self.registry: Any = None

    @property
    def host(self) -> str:
        return ecr_host(region=self.region)

    def start(self) -> LocalReplica:
        from prewarm_devtools.aws_limits.ecr import moto_token_door
        from prewarm_devtools.node.registry import LocalRegistry

        ecr = self.aws.client("ecr")
        ecr.put_replication_configuration(replicationConfiguration={"rules": [
            {"destinations": [{"region": self.region, "registryId": ACCOUNT}]}]})
        # The forwarding rule of docs/operations.md ("Clusters in other Regions"), with its role.
        iam, role = self.aws.client("iam"), "prewarm-ecr-replication-forwarding"
        with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
            iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                        "Principal": {"Service": "events.amazonaws.com"}}]}))
        stack_bus = f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/default"
        iam.put_role_policy(RoleName=role, PolicyName="forward", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "events:PutEvents",
                                                    "Resource": stack_bus}]}))
        events = self.aws.client("events", region_name=self.region)
        events.put_rule(Name="prewarm-ecr-replication", EventPattern=json.dumps(
            {"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]}))
        events.put_targets(Rule="prewarm-ecr-replication", Targets=[{
            "Id": "stack-bus", "Arn": stack_bus,
            "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/{role}"}])
        token = self.aws.client("ecr", region_name=self.region).get_authorization_token()["authorizationData"][0]
        user, _, password = base64.b64decode(token["authorizationToken"]).decode().partition(":")
        layer = self.aws.layer
        door = (functools.partial(layer.ecr.registry_refusal, account=ACCOUNT, region=self.region)
                if layer is not None else moto_token_door(ACCOUNT))
        self.registry = LocalRegistry(self.base_dir / f"registry-{self.region}", door=door,
                                      client_auth=(user, password), realm=self.host).start()
        return self

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.stop()
            self.registry = None

    def replicate(self, pushed: PushedToEcr) -> dict[str, Any]:
        """Copies `pushed` into this Region (its registry, moto's ECR there) and returns ECR's event."""
        assert self.registry is not None
        return replicate_image(self.registry.url, self.aws.client("ecr", region_name=self.region), pushed)


def replicate_image(registry_url: str, ecr: Any, pushed: PushedToEcr) -> dict[str, Any]:
    """Copies `pushed` into the registry at `registry_url` and the ECR of `ecr`'s Region (a client of moto
    there, whose token the registry admits), and returns ECR's "ECR Replication Action" event."""
    assert pushed.image is not None
    region = ecr.meta.region_name
    copied = store_image(registry_url, ecr, pushed.repository, pushed.tag, pushed.image)
    if copied != pushed.digest:
        raise RuntimeError(f"the replica of {pushed.reference} has digest {copied}")
    return {
        "version": "0", "id": f"local-replica-{pushed.digest[7:19]}", "detail-type": "ECR Replication Action",
        "source": "aws.ecr", "account": ACCOUNT, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": region, "resources": [f"arn:aws:ecr:{region}:{ACCOUNT}:repository/{pushed.repository}"],
        "detail": {"result": "SUCCESS", "repository-name": pushed.repository, "image-digest": pushed.digest,
                   "source-account": ACCOUNT, "action-type": "REPLICATE", "source-region": REGION,
                   **({"image-tag": pushed.tag} if pushed.tag else {})},
    }
