"""Every Kubernetes manifest validates offline against the API schemas; overlays render."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.32"
MANIFESTS = sorted(p for p in (DEPLOY / "base").glob("*.yaml") if p.name != "kustomization.yaml")


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        _validate(doc)


def test_sidecar_is_locked_down() -> None:
    deployment = yaml.safe_load((DEPLOY / "base" / "agent-deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "kubemoot-proxy")
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["KUBEMOOT_LISTEN"].startswith("127.0.0.1:")
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert sidecar["livenessProbe"] and sidecar["readinessProbe"]
    assert sidecar["resources"]["limits"] and sidecar["resources"]["requests"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_overlay_renders_and_validates(overlay: str) -> None:
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120, check=True)
    docs = list(yaml.safe_load_all(done.stdout))
    assert {d["kind"] for d in docs} >= {"Deployment", "Job", "NetworkPolicy",
                                          "ServiceAccount", "ConfigMap"}
    for doc in docs:
        assert doc["metadata"]["namespace"].startswith("crew-")
        _validate(doc)
