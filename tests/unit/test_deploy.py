"""Every Kubernetes manifest validates offline against the API schemas; overlays render."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.32"


def _resources(kustomization_dir: Path) -> list[Path]:
    """The whole manifests a kustomization lists (patches are partial and validate rendered)."""
    kustomization = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    return [kustomization_dir / r for r in kustomization.get("resources", [])
            if r.endswith(".yaml")]


MANIFESTS = _resources(DEPLOY / "base") + _resources(DEPLOY / "components" / "shared-state")


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["initContainers"] if c["name"] == "kubemoot-proxy")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_manifest_is_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        _validate(doc)


def test_sidecar_is_locked_down() -> None:
    deployment = yaml.safe_load((DEPLOY / "base" / "agent-deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    sidecar = _sidecar(pod)
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["KUBEMOOT_LISTEN"].startswith("127.0.0.1:")
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert sidecar["livenessProbe"] and sidecar["readinessProbe"]
    assert sidecar["resources"]["limits"] and sidecar["resources"]["requests"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


def test_sidecar_is_native_and_listening_before_the_agent_starts() -> None:
    """An init container with restartPolicy Always runs beside the agent, and the kubelet
    starts the agent only after its startupProbe passes: that probe must reach the API's
    own port, where the agent's first call goes."""
    pod = yaml.safe_load((DEPLOY / "base" / "agent-deployment.yaml").read_text())
    pod = pod["spec"]["template"]["spec"]
    sidecar = _sidecar(pod)
    assert sidecar["restartPolicy"] == "Always"
    assert all(c["name"] != "kubemoot-proxy" for c in pod["containers"])
    api_port = {e["name"]: e.get("value") for e in sidecar["env"]}["KUBEMOOT_LISTEN"]
    probe = " ".join(sidecar["startupProbe"]["exec"]["command"])
    assert api_port.rpartition(":")[2] in probe and "127.0.0.1" in probe


def test_ops_service_reaches_the_sidecars_ops_port() -> None:
    deployment = yaml.safe_load((DEPLOY / "base" / "agent-deployment.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "base" / "ops-service.yaml").read_text())
    template = deployment["spec"]["template"]
    ops_port = next(p for p in _sidecar(template["spec"])["ports"] if p["name"] == "ops")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [ops_port["containerPort"]]


SHARED = DEPLOY / "components" / "shared-state"
CONFIG = DEPLOY.parent / "config"


def test_the_binder_reads_the_mounted_documents_without_api_access() -> None:
    deployment = yaml.safe_load((SHARED / "binder-deployment.yaml").read_text())
    assert deployment["spec"]["replicas"] == 1  # one writer counts the generations
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    [binder] = pod["containers"]
    assert binder["args"][0] == "bind"
    mounts = {m["name"]: m["mountPath"] for m in binder["volumeMounts"]}
    assert binder["args"][1:] == ["-f", mounts["documents"]]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["documents"]["configMap"]["name"] == "kubemoot-documents"
    env = {e["name"]: e.get("value") for e in binder["env"]}
    assert env["KUBEMOOT_NATS_URL"].startswith("nats://")
    assert binder["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_documents_configmap_holds_the_shipped_documents() -> None:
    configmap = yaml.safe_load((SHARED / "documents-configmap.yaml").read_text())
    shipped = [CONFIG / "crew" / "agents.yaml", CONFIG / "crew" / "policy.yaml",
               CONFIG / "bundles" / "prod" / "models.yaml",
               CONFIG / "archetypes" / "consent-3.yaml"]
    assert configmap["data"] == {p.name: p.read_text() for p in shipped}


def test_no_patch_addresses_a_list_by_index() -> None:
    """Patches name what they change (strategic merge by name), so reordering a list in the
    base cannot make them change something else."""
    for path in DEPLOY.rglob("kustomization.yaml"):
        for patch in yaml.safe_load(path.read_text()).get("patches", []):
            assert not re.search(r"path:\s*\S*/\d+(/|\s|$)", patch.get("patch", "")), path


def _render(overlay: str) -> list[dict[str, Any]]:
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120, check=True)
    return list(yaml.safe_load_all(done.stdout))


needs_kustomize = pytest.mark.skipif(shutil.which("kubectl") is None,
                                     reason="kubectl (kustomize) not installed")


@needs_kustomize
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_overlay_renders_and_validates(overlay: str) -> None:
    docs = _render(overlay)
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "NetworkPolicy",
                                          "ServiceAccount", "ConfigMap"}
    for doc in docs:
        assert doc["metadata"]["namespace"].startswith("crew-")
        _validate(doc)


@needs_kustomize
def test_dev_overlay_has_no_nats() -> None:
    docs = _render("dev")
    assert "Job" not in {d["kind"] for d in docs}
    agent = next(d for d in docs if d["metadata"]["name"] == "kubectl-agent")
    env = {e["name"]: e.get("value") for e in _sidecar(agent["spec"]["template"]["spec"])["env"]}
    assert "KUBEMOOT_NATS_URL" not in env
    assert env["KUBEMOOT_MODEL_MODEL"] == "phi3:mini"


@needs_kustomize
def test_prod_overlay_shares_state_in_nats() -> None:
    docs = _render("prod")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Job", "kubemoot-init-buckets"), ("Deployment", "kubemoot-publisher"),
            ("Deployment", "kubemoot-binder"), ("ConfigMap", "kubemoot-documents")} <= names
    agent = next(d for d in docs if d["metadata"]["name"] == "kubectl-agent")
    sidecar = _sidecar(agent["spec"]["template"]["spec"])
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["KUBEMOOT_NATS_URL"].startswith("nats://")
    assert env["KUBEMOOT_LISTEN"] == "127.0.0.1:11434"  # the base's entries survive the merge
    assert sidecar["resources"]["limits"]["cpu"] == "2"


def test_no_service_link_looks_like_a_setting() -> None:
    """Kubernetes gives every container `<SERVICE>_SERVICE_HOST`, `<SERVICE>_PORT`... for each
    Service in its namespace: a Service named kubemoot or kubemoot-* would put KUBEMOOT_*
    names beside the settings. The sidecar ignores those shapes; a pod that shares a
    namespace with such a Service should also set enableServiceLinks: false."""
    docs = [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]
    services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
    assert services
    prefixes = [name.upper().replace("-", "_") for name in services]
    assert not [p for p in prefixes if p == "KUBEMOOT" or p.startswith("KUBEMOOT_")]


def _mounted(pod: dict[str, Any], container: dict[str, Any], docs: list[dict[str, Any]],
             root: Path) -> dict[str, str]:
    """Each ConfigMap a container mounts, written under `root` at its mount path: what the
    settings naming a file there read. Returns mount path -> where it was written."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    out = {}
    for mount in container.get("volumeMounts", []):
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue  # (a Secret: the NATS credentials, not in the manifests)
        where = root / mount["mountPath"].strip("/")
        where.mkdir(parents=True, exist_ok=True)
        for key, text in maps[source["name"]]["data"].items():
            (where / key).write_text(text)
        out[mount["mountPath"]] = str(where)
    return out


@needs_kustomize
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_rendered_kubemoot_container_has_settings_it_can_start_with(
        overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every KUBEMOOT_* name a rendered container sets is a setting, and its values (with
    the ConfigMaps it mounts) load; `bind` and `candidates` read the mounted documents."""
    from proxy.operator import candidates
    from proxy.settings import load_settings, unknown_settings

    docs = _render(overlay)
    checked = 0
    for doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        for container in (pod or {}).get("initContainers", []) + (pod or {}).get(
                "containers", []):
            if not container["image"].startswith("kubemoot-proxy"):
                continue
            mounts = _mounted(pod, container, docs, tmp_path / doc["metadata"]["name"])
            env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            env.pop("KUBEMOOT_NATS_CREDS", None)  # a Secret's file, not in the manifests
            for name, value in env.items():
                for path, where in sorted(mounts.items(), key=lambda m: -len(m[0])):
                    value = value.replace(path, where)
                env[name] = value
            assert not unknown_settings(environ=env), (doc["metadata"]["name"], env)
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            load_settings()
            for name in env:
                monkeypatch.delenv(name)
            args = container.get("args", [])
            if args[:1] == ["bind"]:
                assert candidates.load([mounts[args[2]]], references=False).agents
            checked += 1
    assert checked == (1 if overlay == "dev" else 4)  # the sidecar; publisher, binder, Job
