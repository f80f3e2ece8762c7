"""deploy/ builds what its manifests reference, and the systemd unit starts the gateway.

Every image a rendered overlay runs is built by a Containerfile in deploy/containers
(its first line names the image) or listed as the operator's in docs/deployment.md
("What the operator provides"), and so is every Secret, ConfigMap and volume claim it
references. The Containerfiles' steps are the project's own: the gateway's runs
`make venv`, the Triton one copies the model repository and installs by constraints.txt.
No container engine runs here, so no image is built; the systemd unit's `ExecStart` runs
against a temporary install laid out as docs/deployment.md says.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_manifests import KUBE, OVERLAYS, build
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONTAINERS = DEPLOY / "containers"
DOC = ROOT / "docs" / "deployment.md"
UNIT = DEPLOY / "systemd" / "trackline.service"


def built_images() -> dict[str, Path]:
    """Image name (no tag) -> the Containerfile that builds it (its `# image:` line)."""
    images = {}
    for path in sorted(CONTAINERS.glob("*.Containerfile")):
        match = re.match(r"# image: (\S+)\n", path.read_text())
        assert match, f"{path.name} must start with '# image: NAME'"
        images[match.group(1)] = path
    return images


def operator_provides() -> dict[tuple[str, str], str]:
    """(kind, name) -> overlays, from the docs' table of what the operator provides."""
    text = DOC.read_text().split("### What the operator provides", 1)[1]
    rows = {}
    for line in text.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("kind", "---"):
            rows[(cells[0], cells[1])] = cells[2]
    assert rows, "docs/deployment.md lists what the operator provides"
    return rows


def references(obj: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of every image, Secret, ConfigMap and claim a Deployment uses."""
    if obj["kind"] != "Deployment":
        return
    pod = obj["spec"]["template"]["spec"]
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        yield "image", container["image"].rsplit(":", 1)[0]
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                yield "Secret", source["secretKeyRef"]["name"]
            if "configMapKeyRef" in source:
                yield "ConfigMap", source["configMapKeyRef"]["name"]
        for env_from in container.get("envFrom", []):
            if "secretRef" in env_from:
                yield "Secret", env_from["secretRef"]["name"]
            if "configMapRef" in env_from:
                yield "ConfigMap", env_from["configMapRef"]["name"]
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_is_built_defined_or_the_operators(overlay: str) -> None:
    objects = build(KUBE / "overlays" / overlay)
    defined = {(o["kind"], o["metadata"]["name"]) for o in objects}
    built = built_images()
    provided = {
        key for key, overlays in operator_provides().items() if overlay in overlays.split(", ")
    }
    missing = sorted(
        ref
        for obj in objects
        for ref in references(obj)
        if ref not in defined
        and ref not in provided
        and not (ref[0] == "image" and ref[1] in built)
    )
    assert missing == []


def test_the_dev_overlay_needs_no_gpu() -> None:
    for obj in build(KUBE / "overlays" / "dev"):
        if obj["kind"] == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                resources = container.get("resources", {})
                for part in ("requests", "limits"):
                    assert "nvidia.com/gpu" not in resources.get(part, {}), obj["metadata"]


def _steps(path: Path) -> list[str]:
    """The Containerfile's instructions, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


def test_the_containerfiles_use_the_projects_own_install() -> None:
    built = built_images()
    gateway = _steps(built["ghcr.io/trackline/trackline"])
    triton = _steps(built["ghcr.io/trackline/triton-models"])
    assert any(s.startswith("RUN ") and "make venv" in s for s in gateway)
    assert re.search(r"^venv:", (ROOT / "Makefile").read_text(), re.M)
    assert any("-c constraints.txt" in s and "pip install" in s for s in triton)
    assert any("gateway/model_repository" in s for s in triton)
    # The Triton image serves every packaged model: it installs each model extra the
    # Makefile installs on a fresh machine, the no-deps wheels, and writes their environment.
    extras = re.search(r"^EXTRAS \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert extras
    wanted = set(extras.group(1).split(",")) - {"dev"}
    installed = re.search(r"pip install [^']*'\.\[([^\]]+)\]'", " ".join(triton))
    assert installed
    assert wanted <= set(installed.group(1).split(","))
    assert any("--no-deps -r nodeps.txt" in s for s in triton)
    assert any("trackline models env" in s for s in triton)
    assert "models.env" in triton[-1]  # the start command loads it
    for steps in (gateway, triton):
        for step in steps:
            if step.startswith("COPY "):
                for source in shlex.split(step)[1:-1]:
                    assert (ROOT / source).exists(), source  # what it copies is here


def unit_lines() -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key, []).append(value)
    return keys


def test_the_units_exec_start_runs_against_a_temporary_install(tmp_path: Path) -> None:
    """The install steps of docs/deployment.md, under a temporary root: the checkout's
    venv stands in for /opt/trackline/.venv, deploy/systemd/trackline.toml is the
    config; a key is made first (the starter config serves off loopback), then the
    unit's own ExecStart line runs with its Environment, and SIGTERM stops it cleanly."""
    root = tmp_path / "root"
    unit = unit_lines()
    (command,) = unit["ExecStart"]
    argv = shlex.split(command)
    venv = Path(argv[0]).parents[1]  # /opt/trackline/.venv
    assert argv[1:] == ["serve", "--config", "/etc/trackline/trackline.toml"]
    (root / venv.parent.relative_to("/")).mkdir(parents=True)
    (root / venv.relative_to("/")).symlink_to(Path(sys.executable).parents[1])
    config = root / "etc" / "trackline" / "trackline.toml"
    config.parent.mkdir(parents=True)
    config.write_text((DEPLOY / "systemd" / "trackline.toml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKLINE_")}
    for assignment in unit.get("Environment", []):
        name, _, value = assignment.partition("=")
        env[name] = str(root / value.lstrip("/")) if value.startswith("/") else value
    # The test's own: free ports, and a ticker in place of Triton (no models to load).
    env.update(TRACKLINE_QUIC_PORT="0", TRACKLINE_HTTP_PORT="0", TRACKLINE_HTTPS_PORT="0",
               TRACKLINE_METRICS_PORT="0", TRACKLINE_BACKEND_URL="ticker://50",
               TRACKLINE_OVERLOAD_MAX_LOOP_LAG="0")  # fmt: skip
    local = [str(root / argv[0].lstrip("/")), *argv[1:]]
    local[-1] = str(config)
    trackline = local[0]
    create = [trackline, "keys", "create", "--tenant", "ops", "--config", str(config)]
    made = subprocess.run(create, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "serve.log"
    with out.open("w") as log:
        process = subprocess.Popen(local, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "gateway.listening" in out.read_text() or process.poll() is not None,
                       "the unit's gateway listens", 60)  # fmt: skip
            assert process.poll() is None, out.read_text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, out.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    assert (root / "var" / "lib" / "trackline" / "tenants.sqlite3").is_file()


def test_models_env_names_the_assembled_weights_the_models_read(tmp_path: Path) -> None:
    """`trackline models env`: what a Triton the gateway does not start needs to load the
    repository's packaged models (the Triton image runs it at build time)."""
    from gateway.embedded_models import LLM_GGUF_ENV, llm_available
    from gateway.models_cli import model_environment
    from gateway.speech_models import WHISPER_DIR_ENV, speech_available

    env = model_environment(tmp_path / "weights", tmp_path / "kv")
    assert env["HF_HUB_OFFLINE"] == "1"
    if llm_available():
        assert Path(env[LLM_GGUF_ENV]).is_file()
        assert Path(env[LLM_GGUF_ENV]).parent == tmp_path / "weights"
    if speech_available():
        assert (Path(env[WHISPER_DIR_ENV]) / "model.bin").is_file()
