"""deploy/: the Kubernetes example is valid against the Kubernetes schemas, and it hashes
requests on the same keys as the tested nginx configuration."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.cluster import CONFIG, balancer_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents() -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()))


def test_the_kubernetes_example_is_valid() -> None:
    kinds = []
    for doc in documents():
        kubernetes_validate.validate(doc, "1.30", strict=True)
        kinds.append(doc["kind"])
    assert kinds == ["Deployment", "Service", "Ingress"]


def test_the_validator_catches_a_broken_manifest() -> None:
    deployment = copy.deepcopy(documents()[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_readiness_and_affinity_match_the_tested_setup() -> None:
    deployment, _, ingress = documents()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    key = ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"]
    nginx = CONFIG.read_text()
    for variable in ("$http_x_session_id", "$http_authorization", "$remote_addr"):
        assert variable in key and variable in nginx
    assert (
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    )
    assert "proxy_buffering off;" in nginx


def test_the_nginx_config_keeps_everything_but_its_ports() -> None:
    config = balancer_config(8123, ["127.0.0.1:1", "127.0.0.1:2"])
    assert "listen 127.0.0.1:8123;" in config
    assert config.count("  # replica\n") == 2 and "127.0.0.1:9091" not in config
    shipped = [line for line in CONFIG.read_text().splitlines() if "server 127" not in line]
    assert [line for line in config.splitlines() if "server 127" not in line] == [
        line.replace("127.0.0.1:8080", "127.0.0.1:8123") for line in shipped
    ]
