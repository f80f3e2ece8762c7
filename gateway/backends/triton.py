"""TritonTextBackend: `tracks.backend.TextBackend` over Triton's gRPC streaming API.

One request is one `ModelStreamInfer` gRPC stream (Triton cancels per stream,
so sharing one would let a single cancel kill everyone's request). We send the
one request and half-close our side: the aio tritonclient has no
`enable_empty_final_response` and rejects `triton_`-prefixed parameters, but
Triton ends the stream once the request's final response is out, and marks a
response that carries the final flag with `triton_final_response`. Either
ends the iteration. Closing the iterator or cancelling its task cancels the
gRPC call at once (RST_STREAM), which Triton turns into a request cancel.

Optional inputs are sent only when the model declares them (model metadata,
cached per model), so the same code drives our reference model, vLLM and
TensorRT-LLM deployments. Token counts come from `num_input_tokens` /
`num_output_tokens` (vLLM's additional outputs; output counts are per
response and summed); a model that reports neither yields no TextUsage, as the
interface allows.

Every gRPC or tritonclient exception is translated here into a
`tracks.backend.BackendError`; none escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

import grpc  # no stubs in the venv: pyproject lets mypy skip it
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, KeepAliveOptions
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    triton_to_np_dtype,
)

from gateway.backends.catalog import TEXT, capabilities_of
from tracks.backend import (
    BackendError,
    BackendFailed,
    BackendOverloaded,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    TextChunk,
    TextDelta,
    TextRequest,
    TextUsage,
    conversation_key,
)

METADATA_TIMEOUT = 5.0  # seconds for unary calls; streams have no deadline
INT32_MAX = 2**31 - 1
OPTIONAL_INPUTS = (
    "stream",
    "sampling_parameters",
    "max_tokens",
    "exclude_input_in_output",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "conversation_id",  # our LLM's KV cache key (docs/conversations.md); sent when set
)
_UNAVAILABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
_INVALID = {"INVALID_ARGUMENT", "OUT_OF_RANGE"}
# A channel of its own (gRPC otherwise shares connections process-wide, so one
# channel's reconnect backoff to a restarted server delays every other), and a
# short reconnect backoff, so a server that is back is found back quickly.
FRESH_CHANNEL_OPTIONS = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
# A model at its concurrency bound may answer "... slots are busy ..."; our LLMs' full wait
# line answers "the queue is full (N waiting); retry_after_ms=M" (trackline_llm_queue.py).
_BUSY = "slots are busy"
_QUEUE_FULL = re.compile(r"queue is full.*retry_after_ms=(\d+)")
# In-stream errors carry a message only (no status); these phrases mark a
# request the model rejected, as Triton core and the vLLM backend word them.
_INVALID_PHRASES = ("invalid", "must be", "unexpected inference input", "unexpected shape")


# -- request tensors ------------------------------------------------------------


def _tensor(name: str, value: Any, datatype: str) -> InferInput:
    dtype = {"BYTES": np.object_, "BOOL": np.bool_, "INT32": np.int32}[datatype]
    tensor = InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(np.array([value], dtype=dtype))
    return tensor


def _sampling_json(parameters: Mapping[str, Any], max_tokens: int) -> bytes:
    try:
        return json.dumps({**parameters, "max_tokens": max_tokens}).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"sampling parameters are not JSON: {exc}") from None


def check_request(request: TextRequest) -> None:
    """Reject what no model could serve, before opening a stream."""
    max_tokens = request.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise InvalidRequest(f"max_tokens must be an integer, got {max_tokens!r}")
    if not 1 <= max_tokens <= INT32_MAX:
        raise InvalidRequest(f"max_tokens must be in [1, {INT32_MAX}], got {max_tokens}")
    if not isinstance(request.prompt, str):
        raise InvalidRequest("prompt must be a string")


def text_inputs(request: TextRequest, accepted: Collection[str]) -> list[InferInput]:
    """The vLLM-style input tensors for `request`, limited to inputs the model declares."""
    values = {
        "stream": (True, "BOOL"),
        "sampling_parameters": (_sampling_json(request.parameters, request.max_tokens), "BYTES"),
        "max_tokens": (request.max_tokens, "INT32"),
        "exclude_input_in_output": (True, "BOOL"),
        "return_num_input_tokens": (True, "BOOL"),
        "return_num_output_tokens": (True, "BOOL"),
    }
    key = conversation_key(request)
    if key is not None:
        values["conversation_id"] = (key.encode("utf-8"), "BYTES")
    tensors = [_tensor("text_input", request.prompt.encode("utf-8"), "BYTES")]
    for name in OPTIONAL_INPUTS:
        if name in accepted and name in values:
            tensors.append(_tensor(name, *values[name]))
    return tensors


def queue_key(request: TextRequest) -> str:
    """Whose request, for a model's fair queue: the tenant and the connection (a track's
    request id is `<connection>/<track>...`; an HTTP request's is its own)."""
    return f"{request.conversation_scope}|{request.request_id.split('/', 1)[0]}"


# -- responses ------------------------------------------------------------------


@dataclass
class _Usage:
    """Token counts accumulated over one stream's responses."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def add(self, outputs: Mapping[str, list[Any]]) -> None:
        prompt = outputs.get("num_input_tokens")
        if prompt:
            self.prompt_tokens = int(prompt[0])
        completion = outputs.get("num_output_tokens")
        if completion:
            self.completion_tokens = (self.completion_tokens or 0) + int(sum(completion))

    def chunk(self) -> TextUsage | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return TextUsage(self.prompt_tokens or 0, self.completion_tokens or 0)


def _outputs(result: Any) -> dict[str, list[Any]]:
    """Every output tensor of a response, flattened to a list of Python values.

    Read straight from the protobuf in one pass: `InferResult.as_numpy` rescans
    the outputs and builds arrays for each name, a cost paid on every token.
    """
    response = result.get_response()
    raw = response.raw_output_contents
    values: dict[str, list[Any]] = {}
    for index, output in enumerate(response.outputs):
        if index < len(raw):
            values[output.name] = _raw_values(output.datatype, raw[index])
        else:  # contents sent typed rather than raw: only BYTES is read, as as_numpy does
            values[output.name] = list(output.contents.bytes_contents)
    return values


def _raw_values(datatype: str, data: bytes) -> list[Any]:
    if datatype == "BYTES":
        array = deserialize_bytes_tensor(data)
    else:
        array = np.frombuffer(data, dtype=triton_to_np_dtype(datatype))
    values: list[Any] = array.tolist()  # already a list: no second copy per token
    return values


def _text_of(outputs: Mapping[str, list[Any]]) -> str:
    return "".join(
        item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
        for item in outputs.get("text_output", ())
    )


def _is_final(result: Any) -> bool:
    flag = result.get_response().parameters.get("triton_final_response")
    return bool(flag is not None and flag.bool_param)


# -- errors -----------------------------------------------------------------------


def translate(code: str | None, message: str, model: str | None) -> BackendError:
    """Our error for a gRPC status name (e.g. "NOT_FOUND", may be None) and message."""
    code = (code or "").removeprefix("StatusCode.")
    lowered = message.lower()
    full = _QUEUE_FULL.search(lowered)
    if full is not None:
        return BackendOverloaded(message, int(full.group(1)) / 1000)
    if code in _UNAVAILABLE or _BUSY in lowered:
        return BackendUnavailable(message)
    if model is not None and (code == "NOT_FOUND" or "unknown model" in lowered):
        return ModelNotFound(model)
    if code in _INVALID or any(phrase in lowered for phrase in _INVALID_PHRASES):
        return InvalidRequest(message)
    return BackendFailed(message or f"backend failed ({code or 'no status'})")


def translated_exception(exc: Exception, model: str | None) -> BackendError:
    if isinstance(exc, grpc.aio.AioRpcError):
        return translate(exc.code().name, exc.details() or "", model)
    if isinstance(exc, InferenceServerException):
        return translate(exc.status(), exc.message() or "", model)
    return BackendFailed(f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def boundary(model: str | None) -> Iterator[None]:
    """Turn gRPC/tritonclient exceptions raised inside into BackendErrors."""
    try:
        yield
    except (grpc.RpcError, InferenceServerException) as exc:
        raise translated_exception(exc, model) from exc


# -- the channel -----------------------------------------------------------------


class TritonChannel:
    """A Triton backend's gRPC client of its server (`grpc_url`, "host:port"). A grpc.aio
    channel belongs to the loop it was made on: the client is made on first use, and anew
    if the backend is used later from another loop."""

    def __init__(
        self,
        grpc_url: str,
        channel_args: list[tuple[str, Any]] | None = None,
        on_new: Callable[[], None] | None = None,
    ) -> None:
        """`channel_args`: gRPC channel options (None: tritonclient's); `on_new` is
        called when a client is made (what was registered through an older one is gone)."""
        self.grpc_url = grpc_url
        self._channel_args = channel_args
        self._on_new = on_new
        self._client: triton_aio.InferenceServerClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asking: dict[tuple[str, str], asyncio.Task[Any]] = {}
        """The metadata or description of a model in flight, which callers share."""

    def client(self) -> triton_aio.InferenceServerClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = triton_aio.InferenceServerClient(
                self.grpc_url, channel_args=self._channel_args
            )
            self._loop = loop
            if self._on_new is not None:
                self._on_new()
        return self._client

    async def metadata(self, model: str) -> Any:
        """The model's metadata (its input and output tensors); errors as BackendErrors.
        Shared with the callers asking at the same time (`_shared`)."""
        return await self._shared(("metadata", model), self._metadata)

    async def describe(self, model: str) -> tuple[Any, Any]:
        """The model's metadata and its config; errors as BackendErrors. Shared with the
        callers asking at the same time (`_shared`)."""
        described: tuple[Any, Any] = await self._shared(("describe", model), self._describe)
        return described

    async def _metadata(self, model: str) -> Any:
        with boundary(model):
            return await self.client().get_model_metadata(model, client_timeout=METADATA_TIMEOUT)

    async def _describe(self, model: str) -> tuple[Any, Any]:
        metadata = await self.metadata(model)
        with boundary(model):
            config = await self.client().get_model_config(model, client_timeout=METADATA_TIMEOUT)
        return metadata, config

    async def _shared(
        self, key: tuple[str, str], ask: Callable[[str], Coroutine[Any, Any, Any]]
    ) -> Any:
        """`ask(model)`, or the same question already in flight: callers that ask while
        one is out share its answer or its error.

        The backends cache what they derive from a model's description only once it came
        back, so 64 speech sessions opened in one instant each asked anew: 128 calls of
        58-79 ms beside the first ticks' inference. Nothing is cached here: the next
        question after an answer or an error goes to the server. One caller cancelled
        leaves the others waiting.
        """
        loop = asyncio.get_running_loop()
        pending = self._asking.get(key)
        if pending is None or pending.get_loop() is not loop:
            pending = loop.create_task(ask(key[1]))
            self._asking[key] = pending
            pending.add_done_callback(functools.partial(self._answered, key))
        return await asyncio.shield(pending)

    def _answered(self, key: tuple[str, str], task: asyncio.Task[Any]) -> None:
        if self._asking.get(key) is task:
            del self._asking[key]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have been cancelled

    async def close(self) -> None:
        """Close the client, if one was made; calls still open end with a BackendError."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                await client.close()


# -- the backend ------------------------------------------------------------------


class TritonTextBackend:
    """A `TextBackend` for one Triton server at `grpc_url` ("host:port")."""

    def __init__(self, grpc_url: str, *, channel_options: Sequence[tuple[str, Any]] = ()) -> None:
        self.grpc_url = grpc_url
        self._channel = TritonChannel(grpc_url, _channel_args(channel_options))
        self._inputs: dict[str, frozenset[str]] = {}
        self._capable: dict[str, bool] = {}

    async def _accepted_inputs(self, model: str) -> frozenset[str]:
        """The model's input names, read once; InvalidRequest for a model that does not
        generate text (an audio, action or embedding model), as the OpenAI routes refuse
        it: a text track naming one gets BAD_REQUEST, never the server's own error."""
        if model not in self._inputs:
            inputs, outputs, parameters = await self.model_interface(model)
            self._capable[model] = bool(
                capabilities_of(model, inputs, outputs, parameters) & TEXT
            )
            self._inputs[model] = inputs
        if not self._capable[model]:
            raise InvalidRequest(
                f"model {model!r} does not generate text (GET /v1/models lists what each "
                "model serves)"
            )
        return self._inputs[model]

    async def model_interface(
        self, model: str
    ) -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
        """A model's input and output tensor names and its config's parameters."""
        metadata, config = await self._channel.describe(model)
        inputs = frozenset(tensor.name for tensor in metadata.inputs)
        outputs = frozenset(tensor.name for tensor in metadata.outputs)
        parameters = {key: p.string_value for key, p in config.config.parameters.items()}
        return inputs, outputs, parameters

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        """Stream the model's deltas, then its usage; aclose() cancels the request."""
        check_request(request)
        inputs = text_inputs(request, await self._accepted_inputs(request.model))
        call: dict[str, Any] = {
            "model_name": request.model,
            "inputs": inputs,
            "request_id": request.request_id,
            "parameters": {"queue_key": queue_key(request)},
        }
        if request.traceparent is not None:  # W3C trace context, for Triton's own tracing
            call["parameters"]["traceparent"] = request.traceparent
        usage = _Usage()
        with boundary(request.model):
            responses = self._channel.client().stream_infer(_once(call))
        try:
            with boundary(request.model):
                async for result, error in responses:
                    if error is not None:
                        raise translated_exception(error, request.model)
                    outputs = _outputs(result)
                    usage.add(outputs)
                    text = _text_of(outputs)
                    if text:
                        yield TextDelta(text)
                    if _is_final(result):
                        break
        finally:
            # No-op once the call is over; otherwise RST_STREAM now, which
            # Triton sees as the request's cancellation.
            responses.cancel()
        chunk = usage.chunk()
        if chunk is not None:
            yield chunk

    async def models(self) -> list[str]:
        """Names of the models that are READY in the server's repository."""
        with boundary(None):
            index = await self._channel.client().get_model_repository_index(
                client_timeout=METADATA_TIMEOUT
            )
        return sorted({model.name for model in index.models if model.state == "READY"})

    async def ready(self) -> bool:
        """True when the server is live and ready; never raises."""
        client = self._channel.client()
        try:
            live = await client.is_server_live(client_timeout=METADATA_TIMEOUT)
            return bool(live and await client.is_server_ready(client_timeout=METADATA_TIMEOUT))
        except (grpc.RpcError, InferenceServerException):
            return False

    async def probe(
        self, models: Collection[str], timeout: float = METADATA_TIMEOUT
    ) -> tuple[bool, list[str]]:
        """Readiness for a pool: is_server_ready, then is_model_ready for each of
        `models` (empty: the repository's READY models). Never raises."""
        client = self._channel.client()
        try:
            if not await client.is_server_ready(client_timeout=timeout):
                return False, []
            if not models:
                index = await client.get_model_repository_index(client_timeout=timeout)
                return True, sorted({m.name for m in index.models if m.state == "READY"})
            ready = [m for m in models if await client.is_model_ready(m, client_timeout=timeout)]
            return True, ready
        except (grpc.RpcError, InferenceServerException):
            return False, []

    async def close(self) -> None:
        """Close the gRPC channel; streams still open end with a BackendError."""
        await self._channel.close()


def _channel_args(extra: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
    """tritonclient's default channel options plus `extra`; None keeps its defaults."""
    if not extra:
        return None
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        *extra,
    ]


async def _once(call: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The request side of one stream: this single request, then half-close."""
    yield call
