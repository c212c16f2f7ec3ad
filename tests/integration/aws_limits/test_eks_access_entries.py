"""EKS in front of moto for the clusters the layer serves: DescribeCluster answers the embedded API's
endpoint and CA, the access-entry API answers as EKS does (its errors included), and each entry takes
effect in the embedded API, which authenticates EKS tokens by it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from prewarm.adapters.eks_auth import EksTokenSource
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import MotoServer
from tests.support.kube import call

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::123456789012:role/pw-SweepRole"
KEY = "AKIASWEEP"


@pytest.fixture(scope="module")
def aws() -> Iterator[MotoServer]:
    with MotoServer(limits=True) as server:
        yield server


@pytest.fixture
def served(aws: MotoServer) -> Iterator[KubeApiServer]:
    """Cluster "east", an embedded API the layer serves; the role's key is known to its STS side."""
    assert aws.layer is not None
    with KubeApiServer(tls=True, cluster_name="east", aws_principals={KEY: ROLE}) as api:
        aws.layer.eks.serve("east", api.url, base64.b64encode(api.ca_pem.encode()).decode(), api)
        yield api
        aws.layer.eks.forget("east")


def error(call_: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        call_(**kwargs)
    return caught.value.response["Error"]["Code"], caught.value.response["Error"]["Message"]


def status_as_role(api: KubeApiServer) -> int:
    session = boto3.Session(aws_access_key_id=KEY, aws_secret_access_key="local", region_name="us-west-2")
    with api.api_client(EksTokenSource("east", session)()) as client:
        return call(client, "GET", "/api/v1/nodes").status


def test_describe_cluster_answers_the_embedded_apis_endpoint_and_ca(aws: MotoServer, served: KubeApiServer) -> None:
    cluster = aws.client("eks").describe_cluster(name="east")["cluster"]
    assert (cluster["endpoint"], cluster["status"]) == (served.url, "ACTIVE")
    assert base64.b64decode(cluster["certificateAuthority"]["data"]).decode() == served.ca_pem
    assert cluster["accessConfig"]["authenticationMode"] == "API"
    # A cluster nobody serves or created is EKS's ResourceNotFoundException
    assert error(aws.client("eks").describe_cluster, name="west")[0] == "ResourceNotFoundException"


def test_access_entries_are_created_listed_updated_and_deleted_as_eks_does(
    aws: MotoServer, served: KubeApiServer
) -> None:
    eks = aws.client("eks")
    # Without an entry the role's token is refused by the cluster
    assert status_as_role(served) == 401
    created = eks.create_access_entry(clusterName="east", principalArn=ROLE, kubernetesGroups=["prewarm-control-plane"],
                                      type="STANDARD")["accessEntry"]
    assert (created["principalArn"], created["kubernetesGroups"], created["type"]) == (
        ROLE, ["prewarm-control-plane"], "STANDARD")
    assert created["username"] == "arn:aws:sts::123456789012:assumed-role/pw-SweepRole/{{SessionName}}"
    # The entry takes effect: the token is now the role's session, which RBAC (no binding) refuses
    assert status_as_role(served) == 403
    # A second entry for the principal is ResourceInUseException
    code, message = error(eks.create_access_entry, clusterName="east", principalArn=ROLE, kubernetesGroups=["x"])
    assert (code, message) == ("ResourceInUseException",
                               "The specified access entry resource is already in use on this cluster.")
    assert eks.describe_access_entry(clusterName="east", principalArn=ROLE)["accessEntry"]["kubernetesGroups"] == [
        "prewarm-control-plane"]
    assert eks.list_access_entries(clusterName="east")["accessEntries"] == [ROLE]
    updated = eks.update_access_entry(clusterName="east", principalArn=ROLE, kubernetesGroups=["a", "b"])
    assert updated["accessEntry"]["kubernetesGroups"] == ["a", "b"]
    eks.delete_access_entry(clusterName="east", principalArn=ROLE)
    assert status_as_role(served) == 401
    # Deleted, it is ResourceNotFoundException for describe and delete alike
    assert error(eks.describe_access_entry, clusterName="east", principalArn=ROLE)[0] == "ResourceNotFoundException"
    assert error(eks.delete_access_entry, clusterName="east", principalArn=ROLE)[0] == "ResourceNotFoundException"


def test_eks_refuses_entries_it_would_refuse(aws: MotoServer, served: KubeApiServer) -> None:
    eks = aws.client("eks")
    # An unknown cluster
    code, message = error(eks.create_access_entry, clusterName="nowhere", principalArn=ROLE)
    assert (code, message) == ("ResourceNotFoundException", "No cluster found for name: nowhere.")
    # A group EKS keeps to itself, and a principal that is not an IAM role or user
    code, message = error(eks.create_access_entry, clusterName="east", principalArn=ROLE,
                          kubernetesGroups=["system:masters"])
    assert code == "InvalidParameterException" and "system:masters" in message
    assert error(eks.create_access_entry, clusterName="east",
                 principalArn="arn:aws:sts::123456789012:assumed-role/r/s")[0] == "InvalidParameterException"
    assert eks.list_access_entries(clusterName="east")["accessEntries"] == []
