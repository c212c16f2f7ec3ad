"""The agent's environment: defaults, derived values, and errors that name the variable."""

from __future__ import annotations

import pytest

from prewarm_agent.settings import AgentSettings, AgentSettingsError, EcrCredentials

REQUIRED = {
    "NODE_NAME": "ip-10-0-1-5.ec2.internal",
    "NODE_QUEUE_PREFIX": "prewarm-node",
    "STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status",
    "AWS_REGION": "us-west-2",
}


def test_defaults_are_those_documented() -> None:
    settings = AgentSettings.from_env(REQUIRED)

    assert settings.cri_socket == "/run/containerd/containerd.sock"
    assert (settings.max_concurrent_pulls, settings.disk_threshold_percent) == (2, 85.0)
    assert (settings.node_queue_visibility_seconds, settings.heartbeat_interval_seconds) == (120, 40.0)
    assert settings.progress_interval_seconds == 5.0
    assert (settings.http_bind_address, settings.http_port) == ("0.0.0.0", 9102)
    assert settings.shutdown_grace_seconds == 25.0
    assert settings.registry_allowlist == ()
    assert settings.aws_endpoint_url is None
    assert settings.kube_token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert settings.log_level == "INFO"
    assert (settings.ecr_credentials, settings.secret_prefix) == (EcrCredentials.SHARED, "")


def test_missing_variables_are_all_named() -> None:
    with pytest.raises(AgentSettingsError) as caught:
        AgentSettings.from_env({"NODE_NAME": "n"})

    message = str(caught.value)
    for name in ("NODE_QUEUE_PREFIX", "STATUS_QUEUE_URL", "AWS_REGION"):
        assert f"{name}: Field required" in message
    assert "NODE_NAME" not in message


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("MAX_CONCURRENT_PULLS", "0", "MAX_CONCURRENT_PULLS: Input should be greater than or equal to 1"),
        ("DISK_THRESHOLD_PERCENT", "150", "DISK_THRESHOLD_PERCENT: Input should be less than or equal to 100"),
        ("NODE_QUEUE_VISIBILITY_SECONDS", "2",
         "NODE_QUEUE_VISIBILITY_SECONDS: Input should be greater than or equal to 3"),
        ("HTTP_PORT", "http", "HTTP_PORT: Input should be a valid integer"),
        ("NODE_QUEUE_PREFIX", "prewarm.node", "NODE_QUEUE_PREFIX: String should match pattern"),
        ("LOG_LEVEL", "chatty", "LOG_LEVEL: Value error, 'chatty' is not a log level"),
        ("REGISTRY_ALLOWLIST", "https://quay.io", "'https://quay.io' must be a registry host glob"),
        ("HEARTBEAT_INTERVAL_SECONDS", "120", "HEARTBEAT_INTERVAL_SECONDS (120) must be shorter than"),
        ("ECR_CREDENTIALS", "instance-role", "ECR_CREDENTIALS: Input should be 'shared', 'role' or 'copies'"),
        ("ECR_CREDENTIALS", "copies", "ECR_CREDENTIALS=copies reads the registry copies under SECRET_PREFIX"),
        ("SECRET_PREFIX", "prewarm//prod", "SECRET_PREFIX: String should match pattern"),
    ],
)
def test_a_wrong_value_names_its_variable(name: str, value: str, expected: str) -> None:
    with pytest.raises(AgentSettingsError) as caught:
        AgentSettings.from_env({**REQUIRED, name: value})

    assert expected in str(caught.value)


def test_in_cluster_api_endpoint_comes_from_the_service_environment() -> None:
    settings = AgentSettings.from_env({**REQUIRED, "KUBERNETES_SERVICE_HOST": "10.100.0.1",
                                       "KUBERNETES_SERVICE_PORT": "443"})

    assert settings.kube_api_endpoint == "https://10.100.0.1:443"


def test_an_ipv6_service_host_is_bracketed() -> None:
    settings = AgentSettings.from_env({**REQUIRED, "KUBERNETES_SERVICE_HOST": "fd00::1"})

    assert settings.kube_api_endpoint == "https://[fd00::1]:443"


def test_an_explicit_api_endpoint_wins() -> None:
    settings = AgentSettings.from_env({**REQUIRED, "KUBERNETES_SERVICE_HOST": "10.100.0.1",
                                       "KUBE_API_ENDPOINT": "http://127.0.0.1:8080"})

    assert settings.kube_api_endpoint == "http://127.0.0.1:8080"


def test_allowlist_is_split_trimmed_and_lowercased() -> None:
    settings = AgentSettings.from_env({**REQUIRED, "REGISTRY_ALLOWLIST": " *.dkr.ecr.*.amazonaws.com, Quay.io ,,"})

    assert settings.registry_allowlist == ("*.dkr.ecr.*.amazonaws.com", "quay.io")


def test_an_empty_endpoint_url_means_the_real_aws() -> None:
    assert AgentSettings.from_env({**REQUIRED, "AWS_ENDPOINT_URL": ""}).aws_endpoint_url is None


def test_the_bearer_token_is_not_in_the_repr() -> None:
    settings = AgentSettings.from_env({**REQUIRED, "KUBE_BEARER_TOKEN": "test-very-secret"})

    assert "test-very-secret" not in repr(settings)
