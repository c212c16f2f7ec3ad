"""The refresher's configuration: every field, its defaults, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prewarm.domain.refresh import CredentialsConfig, CredentialsConfigError

SAMPLE = Path(__file__).resolve().parents[3] / "samplefiles" / "credentials.json"


def parse(doc: object) -> CredentialsConfig:
    return CredentialsConfig.parse(json.dumps(doc), "CREDENTIALS_CONFIG")


def test_sample_configuration_is_valid_and_uses_every_field() -> None:
    # Given the sample in samplefiles/
    config = CredentialsConfig.parse(SAMPLE.read_text(), str(SAMPLE))
    # Then every kind of registry and every namespace field is represented
    assert [r.host for r in config.registries] == [
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        "210987654321.dkr.ecr.us-west-2.amazonaws.com",
        "public.ecr.aws",
    ]
    assert config.registries[1].hosts[1:] == ("registry.example.com",)
    assert config.registries[2].role_arn == "arn:aws:iam::210987654321:role/prewarm-ecr-pull"
    assert config.namespaces is not None and config.namespaces.exclude == ("team-sandbox-*",)
    assert config.namespaces.label_selector is not None
    assert config.service_accounts == ("default", "builder")


def test_defaults_secret_name_and_default_service_account_and_no_namespaces() -> None:
    config = parse({"registries": [{"account": "111122223333", "region": "eu-central-1"}]})
    assert config.secret_name == "prewarm-ecr"
    assert config.service_accounts == ("default",)
    assert config.namespaces is None  # agents' Secrets Manager copies only


def test_a_namespace_list_is_short_for_include_and_an_object_defaults_include_to_everything() -> None:
    listed = parse({"registries": [{"public": True}], "namespaces": ["team-*"]}).namespaces
    assert listed is not None and listed.include == ("team-*",)
    targets = parse({"registries": [{"public": True}], "namespaces": {"exclude": ["kube-*"]}}).namespaces
    assert targets is not None and targets.include == ("*",)


def test_empty_service_accounts_means_no_patching() -> None:
    assert parse({"registries": [{"public": True}], "serviceAccounts": []}).service_accounts == ()


@pytest.mark.parametrize(
    ("region", "host"),
    [
        ("us-east-1", "111122223333.dkr.ecr.us-east-1.amazonaws.com"),
        ("cn-north-1", "111122223333.dkr.ecr.cn-north-1.amazonaws.com.cn"),
        ("us-gov-west-1", "111122223333.dkr.ecr.us-gov-west-1.amazonaws.com"),
    ],
)
def test_private_registry_host_follows_the_partition(region: str, host: str) -> None:
    config = parse({"registries": [{"account": "111122223333", "region": region}]})
    assert config.registries[0].host == host
    assert config.registries[0].token_region == region


def test_public_registry_gets_its_token_in_us_east_1() -> None:
    (registry,) = parse({"registries": [{"public": True}]}).registries
    assert (registry.host, registry.token_region) == ("public.ecr.aws", "us-east-1")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "registries: Field required"),
        ({"registries": []}, "registries: give at least one registry"),
        ({"registries": [{"account": "1234", "region": "us-east-1"}]},
         "registries[0].account: must be a 12-digit AWS account ID, got '1234'"),
        ({"registries": [{"account": "111122223333", "region": "Europe"}]},
         "registries[0].region: must be an AWS region such as 'us-east-1', got 'Europe'"),
        ({"registries": [{"account": "111122223333"}]},
         "registries[0]: region required for a private registry (or set public: true for ECR Public)"),
        ({"registries": [{"public": True, "region": "us-east-1"}]},
         "registries[0]: a public registry (public: true) takes no account or region"),
        ({"registries": [{"public": True, "roleArn": "pull-role"}]},
         "registries[0].roleArn: must be an IAM role ARN"),
        ({"registries": [{"public": True, "extraHosts": ["ok.example.com", "Bad_Host"]}]},
         "registries[0].extraHosts[1]: must be a lower-case registry host or host:port, got 'Bad_Host'"),
        ({"registries": [{"public": True}, {"public": True}]},
         "registries[1]: host 'public.ecr.aws' is already given by registries[0]"),
        ({"registries": [{"public": True, "acount": "1"}]}, "registries[0].acount: unknown field"),
        ({"registries": [{"public": True}], "namespaces": {"include": ["Team-A"]}},
         "namespaces.include[0]: 'Team-A' is not a namespace pattern"),
        ({"registries": [{"public": True}], "namespaces": {"include": []}},
         "namespaces.include: selects no namespace"),
        ({"registries": [{"public": True}], "namespaces": {"exclude": ["ok", "a/b"]}},
         "namespaces.exclude[1]: 'a/b' is not a namespace pattern"),
        ({"registries": [{"public": True}], "namespaces": {"labelSelector": {"matchLabels": {"team": "a b"}}}},
         "namespaces.labelSelector.matchLabels"),
        ({"registries": [{"public": True}], "secretName": "Prewarm_ECR"}, 'secretName: "Prewarm_ECR" must consist'),
        ({"registries": [{"public": True}], "serviceAccounts": ["default", ""]},
         "serviceAccounts[1]: must not be empty"),
    ],
)
def test_errors_name_the_field_at_fault(doc: dict[str, object], message: str) -> None:
    with pytest.raises(CredentialsConfigError) as raised:
        parse(doc)
    assert str(raised.value).startswith("CREDENTIALS_CONFIG: ")
    assert message in str(raised.value)


def test_several_errors_are_reported_together() -> None:
    with pytest.raises(CredentialsConfigError) as raised:
        parse({"registries": [{"account": "1", "region": "us-east-1"}], "secretName": "A"})
    assert "registries[0].account" in str(raised.value) and "secretName" in str(raised.value)


def test_text_that_is_not_json_names_the_source() -> None:
    with pytest.raises(CredentialsConfigError, match=r"^CREDENTIALS_CONFIG_PARAMETER /prewarm/creds: Invalid JSON"):
        CredentialsConfig.parse("registries: []", "CREDENTIALS_CONFIG_PARAMETER /prewarm/creds")
