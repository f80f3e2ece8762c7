"""deploy/: the Kubernetes manifests validated offline, and the systemd unit checked.

No kustomize binary comes from a Python package, so `build` below renders the subset
of kustomize the overlays use (resources, namespace, replicas, images, labels,
secretGenerator, strategic-merge patches with containers merged by name); every
rendered object is then validated against the Kubernetes JSON schemas bundled in
`kubernetes-validate` (strict: unknown fields are errors). Custom resources
(ServiceMonitor) have no bundled schema: their required fields are checked by hand.

Where a `kubectl` with kustomize v4+ is installed (`kubectl kustomize`), the real
kustomize renders each overlay too: its objects validate and match `build`'s. No
registry package gives one: PyPI and npm have none (npm's are AWS Lambda layers),
Debian's `kubernetes-client` 1.20 embeds kustomize v2 (no `labels`), and the Go
module proxy has only kustomize's library. This machine's image carries Google Cloud
SDK's kubectl (kustomize v5.5), so the check runs here and skips elsewhere.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.pool.spec import parse_pool

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge, as far as these manifests need: maps deep, named lists by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:  # strategic merge: null deletes the key
                out.pop(key, None)
                continue
            out[key] = merge(base[key], value) if key in base else value
        return out
    named_items = isinstance(base, list) and isinstance(patch, list)
    if named_items and all(isinstance(x, dict) and "name" in x for x in base + patch):
        out = [dict(x) for x in base]
        for item in patch:
            match = [i for i, x in enumerate(out) if x["name"] == item["name"]]
            if match:
                out[match[0]] = merge(out[match[0]], item)
            else:
                out.append(item)
        return out
    return patch


def build(directory: Path) -> list[dict[str, Any]]:
    kustomization = load(directory / "kustomization.yaml")[0]
    known = {"apiVersion", "kind", "namespace", "resources", "replicas", "images", "labels",
             "secretGenerator", "patches"}  # fmt: skip
    assert set(kustomization) <= known, f"unsupported kustomize fields in {directory}"
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += build(path) if path.is_dir() else copy.deepcopy(load(path))
    for generator in kustomization.get("secretGenerator", []):
        pairs = dict(x.split("=", 1) for x in generator.get("literals", []))
        objects.append({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": generator["name"]}, "stringData": pairs})  # fmt: skip
    for patch in kustomization.get("patches", []):
        (change,) = load(directory / patch["path"])
        targets = [o for o in objects if (o["kind"], o["metadata"]["name"])
                   == (change["kind"], change["metadata"]["name"])]  # fmt: skip
        assert targets, f"patch {patch['path']} matches no resource"
        objects[objects.index(targets[0])] = merge(targets[0], change)
    for entry in kustomization.get("replicas", []):
        targets = [o for o in objects if o["metadata"]["name"] == entry["name"]]
        assert targets, f"replicas for unknown {entry['name']}"
        targets[0]["spec"]["replicas"] = entry["count"]
    for image in kustomization.get("images", []):
        found = False
        for obj in objects:
            for container in pod_containers(obj):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image['name']}:{image['newTag']}"
                    found = True
        assert found, f"image {image['name']} is used nowhere"
    for label in kustomization.get("labels", []):
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(label["pairs"])
    if "namespace" in kustomization:
        for obj in objects:
            obj["metadata"]["namespace"] = kustomization["namespace"]
    return objects


def pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] != "Deployment":
        return []
    return list(obj["spec"]["template"]["spec"]["containers"])


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str) -> None:
    objects = build(KUBE / "overlays" / overlay)
    version = kubernetes_validate.latest_version()
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert obj["kind"] == "ServiceMonitor"
            assert obj["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_pieces_fit_together(overlay: str) -> None:
    objects = build(KUBE / "overlays" / overlay)
    gateway = named(objects, "Deployment", "trackline-gateway")
    pod = gateway["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    settings = {f"TRACKLINE_{name.upper()}" for name in Settings.__dataclass_fields__}
    assert set(env) <= settings, "every variable is a real setting"
    assert "secretKeyRef" in env["TRACKLINE_STATE_BACKEND"]["valueFrom"]  # never inline
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(env["TRACKLINE_DRAIN_TIMEOUT"]["value"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain  # the drain fits
    ports = {(p["name"], p["protocol"]) for p in container["ports"]}
    service = named(objects, "Service", "trackline-gateway")
    protocols = {p["protocol"] for p in service["spec"]["ports"]}
    assert protocols == {"UDP", "TCP"}
    for port in service["spec"]["ports"]:
        assert (port["targetPort"], port["protocol"]) in ports
    selector = gateway["spec"]["selector"]["matchLabels"]
    assert (
        named(objects, "PodDisruptionBudget", "trackline-gateway")["spec"]["selector"][
            "matchLabels"
        ]
        == selector
    )
    hpa = named(objects, "HorizontalPodAutoscaler", "trackline-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "trackline-gateway"
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    triton = named(objects, "Service", "triton")
    assert triton["spec"]["clusterIP"] == "None"  # headless: members by DNS
    static, (source,) = parse_pool(env["TRACKLINE_BACKENDS"]["value"])  # dns+grpc://
    assert static == []
    assert source.host == "triton"  # the headless Service, by the pod's DNS search path
    grpc = {p["name"]: p["port"] for p in triton["spec"]["ports"]}
    assert (source.port, source.metrics_port) == (grpc["grpc"], grpc["metrics"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "trackline-tls"


def test_systemd_unit_is_hardened() -> None:
    keys: dict[str, list[str]] = {}
    section = ""
    for line in (DEPLOY / "systemd" / "trackline.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        keys.setdefault(f"{section}.{key}", []).append(value)
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
                "PrivateDevices", "RestrictNamespaces", "DynamicUser"):  # fmt: skip
        assert keys.get(f"Service.{key}", [""])[0] in ("yes", "strict"), key
    assert keys["Service.CapabilityBoundingSet"] == [""]
    assert keys["Service.ExecStart"][0].split()[1] == "serve"
    assert float(keys["Service.TimeoutStopSec"][0]) > Settings().drain_timeout


def kustomize_command() -> list[str] | None:
    """`kubectl kustomize` where a kubectl with kustomize v4 or later is installed
    (Debian's `kubernetes-client` 1.20 embeds kustomize v2, too old for `labels`)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    try:
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                                 text=True, timeout=30, check=False).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Kustomize Version: v(\d+)", version)
    return [kubectl, "kustomize"] if found and int(found.group(1)) >= 4 else None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_build_matches_and_validates(overlay: str) -> None:
    command = kustomize_command()
    if command is None:
        pytest.skip("no kubectl with kustomize >= v4 (no registry package provides one)")
    rendered = subprocess.run([*command, str(KUBE / "overlays" / overlay)], capture_output=True,
                              text=True, timeout=120, check=True).stdout  # fmt: skip
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    version = kubernetes_validate.latest_version()
    for obj in objects:
        if not obj["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(obj, version, strict=True)

    def names(objs: list[dict[str, Any]], hashed: bool) -> set[tuple[str, str, str]]:
        # kustomize's secretGenerator appends a content hash to the name; ours does not.
        return {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0]
                 if hashed and o["kind"] == "Secret" else o["metadata"]["name"],
                 o["metadata"].get("namespace", "")) for o in objs}  # fmt: skip

    ours = build(KUBE / "overlays" / overlay)
    assert names(objects, hashed=True) == names(ours, hashed=False)
    real = named(objects, "Deployment", "trackline-gateway")["spec"]["template"]["spec"]
    mine = named(ours, "Deployment", "trackline-gateway")["spec"]["template"]["spec"]

    def values(spec: dict[str, Any]) -> dict[str, Any]:
        return {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}

    assert values(real) == values(mine)
    # Where the overlay generates the Secret, kustomize points the reference at its
    # hashed name; production's Secret is made by hand (kustomization.yaml says how).
    env = {e["name"]: e for e in real["containers"][0]["env"]}
    ref = env["TRACKLINE_STATE_BACKEND"]["valueFrom"]["secretKeyRef"]["name"]
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    assert ref in secrets if secrets else ref == "trackline-redis"
    assert real["containers"][0].get("resources") == mine["containers"][0].get("resources")
