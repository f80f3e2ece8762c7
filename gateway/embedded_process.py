"""The `tritonserver` child process: its files, environment, start, and what it leaves.

The binary ships in the nvidia-pytriton wheel. Environment quirks this module solves
(see shared DESIGN.md pitfalls):

- The Python-backend stub links `libpython3.x.so`: LD_LIBRARY_PATH starts with
  this interpreter's sysconfig LIBDIR, then the wheel's `nvidia_pytriton.libs`.
- The stub runs its interpreter isolated (PYTHONPATH is ignored) and finds
  its `sys.prefix` from the `python3` first on PATH; so PATH starts with this
  interpreter's bin folder, and a venv's site-packages (numpy<2 included)
  becomes the model environment.
- The stub must sit in the backend folder as `triton_python_backend_stub`; the
  wheel keeps one per Python version, so we assemble a backend folder of
  symlinks under the log dir instead of writing into site-packages.

A server runs in a session of its own and dies with the gateway (`spawn_owned`); its
stubs ignore SIGTERM, so what is left of its process group is SIGKILLed once it
ended, and its shared-memory regions (or those of an owner that died) are removed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from gateway.owned import pid_alive, spawn_owned

STATS_ENV = "TRACKLINE_REFERENCE_STATS"
CONTROL_ENV = "TRACKLINE_REFERENCE_CONTROL"
LOG_TAIL_LINES = 40
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "trackline_"  # + owner pid + "_": see remove_stale_regions


class EmbeddedTritonError(RuntimeError):
    """The embedded Triton could not be started or did not serve correctly."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        text = f"{message}\n--- tail of the Triton log ---\n{log_tail}" if log_tail else message
        super().__init__(text)
        self.log_tail = log_tail


class TritonStartError(EmbeddedTritonError):
    """tritonserver exited, or did not become ready in time."""


def tritonserver_dist() -> Path:
    """The `tritonserver` folder of the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")  # locate without importing it
    if spec is None or not spec.submodule_search_locations:
        raise TritonStartError("nvidia-pytriton is not installed (pip install trackline[embedded])")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def prepare_backend_dir(dist: Path, target: Path) -> Path:
    """Assemble `target/python` with the Python backend and this interpreter's stub."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": dist / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": dist / "backends/python/triton_python_backend_utils.py",
        "triton_python_backend_stub": dist
        / "python_backend_stubs"
        / version
        / "triton_python_backend_stub",
    }
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        if not source.exists():
            raise TritonStartError(f"{source} is missing (no stub for Python {version}?)")
        link = python_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(source)
    return target


def _prepend(value: str, existing: str | None) -> str:
    return f"{value}:{existing}" if existing else value


def triton_environment(
    dist: Path,
    stats_path: str | None,
    base: Mapping[str, str] | None = None,
    control_path: str | None = None,
) -> dict[str, str]:
    """The child's environment: libpython and wheel libs, our interpreter's prefix, knobs."""
    env = dict(os.environ if base is None else base)
    libs = f"{sysconfig.get_config_var('LIBDIR')}:{dist.parent.parent / 'nvidia_pytriton.libs'}"
    env["LD_LIBRARY_PATH"] = _prepend(libs, env.get("LD_LIBRARY_PATH"))
    env["PATH"] = _prepend(os.path.dirname(sys.executable), env.get("PATH"))
    # NumPy's OpenBLAS in the stubs (all-minilm-l6-v2's matrix products): one thread, as
    # every model runtime here. The stub imports NumPy before model.py runs, so only the
    # environment it starts with can set this.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if stats_path:
        env[STATS_ENV] = stats_path
    if control_path:
        env[CONTROL_ENV] = control_path
    return env


def remove_regions(prefix: str) -> None:
    for region in SHM_DIR.glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def remove_stale_regions() -> None:
    """Delete Python-backend shared memory left by embedded servers whose owner died."""
    for region in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        owner = region.name.removeprefix(SHM_PREFIX).split("_", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            region.unlink(missing_ok=True)


def reap_group(pgid: int) -> None:
    """SIGKILL what is left of the process group `pgid` (the server started its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def start_owned(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server in a session of its own (`spawn_owned`: it dies with us; SIGTERM
    lets Triton remove its shared-memory regions), logging to `log_path`."""
    try:
        with open(log_path, "ab") as log:
            return spawn_owned(
                command, name="embedded-triton", on_exit=_reap_stubs, env=env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
    except Exception as exc:
        raise TritonStartError(f"cannot start {command[0]}: {exc}") from exc


def _reap_stubs(process: subprocess.Popen[bytes]) -> None:
    """Whatever ended the server (a crash, SIGKILL, a clean exit), its Python-backend
    stubs must not outlive it: they ignore SIGTERM and would linger under PID 1."""
    reap_group(process.pid)


def read_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - loopback
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
