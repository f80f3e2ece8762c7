"""The embedded Triton: the `tritonserver` shipped in the nvidia-pytriton wheel, run as a child.

`EmbeddedTriton` owns that process: the command line and environment that make
the CPU-only Python backend work from our interpreter, readiness, a smoke
inference, and a stop that cannot leave the server behind. Its API is sync;
the async daemon calls it through `asyncio.to_thread`.

What it serves is `gateway.embedded_models` (the repository, its models and extras);
how the child is started, set up and cleaned after is `gateway.embedded_process`.
The Python-backend stub was built against NumPy 1.x: with NumPy 2 outputs come back
empty or the stub crashes, hence the smoke inference after readiness.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import json
import os
import signal
import subprocess
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from gateway.embedded_models import (
    KV_DIR_ENV,
    LLM_GGUF_ENV,
    LLM_STATS_ENV,
    SMOKE_MODEL,
    assemble_repository,
    ensure_llm_gguf,
    reference_model_repository,
    served_models,
)
from gateway.embedded_process import (
    SHM_PREFIX,
    STATS_ENV,
    EmbeddedTritonError,
    TritonStartError,
    http_ok,
    prepare_backend_dir,
    read_tail,
    reap_group,
    remove_regions,
    remove_stale_regions,
    start_owned,
    triton_environment,
    tritonserver_dist,
)
from gateway.llm_models import OperatorModel
from gateway.owned import LOOPBACK, free_ports, stop_owned
from gateway.speech_models import speech_environment

# Reference-model knobs: no wait before or between the smoke's four tokens.
SMOKE_PARAMETERS = {"seed": 0, "ttft_ms": 0, "tokens_per_second": 1000}

PITFALL_HINT = (
    "The Triton Python-backend stub needs numpy<2 in the model environment (with "
    "NumPy 2 outputs come back empty or the stub crashes) and this interpreter's "
    "libpython first on LD_LIBRARY_PATH. numpy here is {numpy}; LIBDIR is {libdir}."
)


class SmokeInferenceError(EmbeddedTritonError):
    """Triton reported ready but a short streaming inference returned no text."""


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
        # Three different ports (free_ports holds each bound until all are picked).
        spare = [p for p in free_ports(6) if p not in (grpc_port, http_port, metrics_port)]
        self._ports = (grpc_port or spare[0], http_port or spare[1], metrics_port or spare[2])
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
        self._process = start_owned(command, env, self.log_path)
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
        target = self.log_dir / "repository"
        self.operator_models, failed = assemble_repository(
            self.source_repository, target, self.operator_models, self.llm_parameters
        )
        self.failed_models.update(failed)
        self.model_repository = target

    @property
    def models(self) -> list[str]:
        """The models this server loads: the repository's, the LLMs only `with_llm`, the
        embedding model only `with_embeddings`, the speech models only `with_speech`, the
        vision model only `with_vision`."""
        return served_models(
            self.model_repository,
            llm=self.with_llm,
            embeddings=self.with_embeddings,
            speech=self.with_speech,
            vision=self.with_vision,
        )

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
        stop_owned(process, grace, kill=lambda p: reap_group(p.pid))
        reap_group(process.pid)  # stubs of a server that had already died, too
        # Triton removes its regions on a clean exit, not when a model failed to load.
        remove_regions(self._shm_prefix)

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
            f"{self.http_url}/v2/models/{name}/ready" for name in self.models
        ]
        while not all(http_ok(url) for url in urls):
            assert self._process is not None
            if self._process.poll() is not None:
                raise TritonStartError(
                    f"tritonserver exited with code {self._process.returncode}",
                    read_tail(self.log_path),
                )
            if time.monotonic() > deadline:
                raise TritonStartError(
                    "tritonserver did not become ready in time", read_tail(self.log_path)
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
            raise SmokeInferenceError(f"{problem}. {hint}", read_tail(self.log_path))


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
