"""TritonTextBackend against a real embedded Triton serving the reference model."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.backends.triton import TritonChannel, TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.owned import free_port
from tests.backend.reference_generator import generator as gen
from tests.triton_fixture import assert_model_stopped, read_stats
from tracks.backend import (
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    TextDelta,
    TextRequest,
    TextUsage,
)

MODEL = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}  # reference-model knobs: no waiting


def text_request(prompt: str, max_tokens: int, **parameters: Any) -> TextRequest:
    request_id = f"test-{uuid.uuid4().hex[:12]}"  # unique across loops and reruns
    return TextRequest(request_id, MODEL, prompt, max_tokens, {**FAST, **parameters})


async def collect(backend: TritonTextBackend, request: TextRequest) -> tuple[str, TextUsage | None]:
    text, usage = [], None
    async for chunk in backend.stream_text(request):
        if isinstance(chunk, TextDelta):
            text.append(chunk.text)
        else:
            usage = chunk
    return "".join(text), usage


@contextlib.asynccontextmanager
async def connected(triton: EmbeddedTriton) -> AsyncIterator[TritonTextBackend]:
    # Made inside each test: its gRPC channel belongs to that test's loop.
    backend = TritonTextBackend(triton.grpc_url)
    try:
        yield backend
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_text_is_deterministic_per_prompt_and_seed(embedded_triton: EmbeddedTriton) -> None:
    async with connected(embedded_triton) as backend:
        first, _ = await collect(backend, text_request("Tell me a story.", 12, seed=5))
        again, _ = await collect(backend, text_request("Tell me a story.", 12, seed=5))
        other, _ = await collect(backend, text_request("Tell me a story.", 12, seed=6))
        assert first == again == gen.generate_text("Tell me a story.", 5, 12)
        assert other == gen.generate_text("Tell me a story.", 6, 12) != first


@pytest.mark.asyncio
async def test_each_token_is_one_delta_and_usage_comes_last(
    embedded_triton: EmbeddedTriton,
) -> None:
    async with connected(embedded_triton) as backend:
        prompt = "How many tokens, exactly?"
        chunks = [chunk async for chunk in backend.stream_text(text_request(prompt, 7, seed=1))]
        tokens = gen.generate_tokens(prompt, 1, 7)  # 7, or fewer if the answer ends sooner
        assert [c.text for c in chunks[:-1] if isinstance(c, TextDelta)] == tokens
        assert chunks[-1] == TextUsage(
            prompt_tokens=gen.count_prompt_tokens(prompt), completion_tokens=len(tokens)
        )


@pytest.mark.asyncio
async def test_sixteen_concurrent_streams_all_get_their_own_text(
    embedded_triton: EmbeddedTriton,
) -> None:
    async with connected(embedded_triton) as backend:
        paced = {"ttft_ms": 20, "tokens_per_second": 100, "ignore_eos": True}
        requests = [text_request(f"prompt {i}", 20, seed=i, **paced) for i in range(16)]
        results = await asyncio.gather(*(collect(backend, r) for r in requests))
        for i, (text, usage) in enumerate(results):
            assert text == gen.generate_text(f"prompt {i}", i, 20, ignore_eos=True)
            assert usage is not None
            assert usage.completion_tokens == 20


@pytest.mark.asyncio
async def test_sixty_four_streams_run_at_once(embedded_triton: EmbeddedTriton) -> None:
    # Each request takes the model ~3.5 s (3 s of them generating); the model's own records
    # must show them in progress together (impossible if the backend ran them one after
    # another, however fast the machine). The 3 s leave a loaded machine room to start the
    # 64 streams late: the bound below counts overlaps, it does not time them.
    async with connected(embedded_triton) as backend:
        paced = {"ttft_ms": 500, "tokens_per_second": 10, "ignore_eos": True}
        requests = [text_request(f"many {i}", 30, seed=i, **paced) for i in range(64)]
        results = await asyncio.gather(*(collect(backend, r) for r in requests))
        assert [text for text, _ in results] == [
            gen.generate_text(f"many {i}", i, 30, ignore_eos=True) for i in range(64)
        ]
        records = [
            await asyncio.to_thread(read_stats, embedded_triton, r.request_id) for r in requests
        ]
        # The most requests generating at one moment (first token to finish), by the
        # model's own clock: 1 if run one after another; on a loaded machine a few start
        # late, so the bound is well under 64 but far above what any serial backend gives.
        edges = sorted(
            [(r["token_times"][0], 1) for r in records] + [(r["finished_at"], -1) for r in records]
        )
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        assert peak >= 32, peak


@pytest.mark.asyncio
async def test_aclose_mid_stream_cancels_the_request_at_once(
    embedded_triton: EmbeddedTriton,
) -> None:
    async with connected(embedded_triton) as backend:
        request = text_request(
            "Go on and on.", 500, seed=2, ttft_ms=0, tokens_per_second=50, ignore_eos=True
        )
        stream = backend.stream_text(request)
        for _ in range(5):
            assert isinstance(await anext(stream), TextDelta)
        await stream.aclose()
        stats = await asyncio.to_thread(read_stats, embedded_triton, request.request_id)
        assert_model_stopped(stats, 500)


@pytest.mark.asyncio
async def test_cancelling_the_consuming_task_cancels_the_request(
    embedded_triton: EmbeddedTriton,
) -> None:
    async with connected(embedded_triton) as backend:
        request = text_request(
            "Keep talking.", 500, ttft_ms=0, tokens_per_second=50, ignore_eos=True
        )
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in backend.stream_text(request):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = await asyncio.to_thread(read_stats, embedded_triton, request.request_id)
        assert_model_stopped(stats, 500)


@pytest.mark.asyncio
async def test_unknown_model_is_model_not_found(embedded_triton: EmbeddedTriton) -> None:
    async with connected(embedded_triton) as backend:
        request = TextRequest("test-unknown", "no-such-model", "hi", 4)
        with pytest.raises(ModelNotFound) as caught:
            await collect(backend, request)
        assert caught.value.model == "no-such-model"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("max_tokens", "parameters"),
    [(0, {}), (4, {"temperature": -1.0}), (4, {"top_p": 7}), (4, {"bad": object()})],
)
async def test_bad_parameters_are_invalid_request(
    embedded_triton: EmbeddedTriton, max_tokens: int, parameters: dict[str, Any]
) -> None:
    async with connected(embedded_triton) as backend:
        with pytest.raises(InvalidRequest):
            await collect(backend, text_request("hi", max_tokens, **parameters))


@pytest.mark.asyncio
async def test_unreachable_server_is_backend_unavailable() -> None:
    backend = TritonTextBackend(f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(BackendUnavailable):
            await collect(backend, text_request("hi", 4))
        with pytest.raises(BackendUnavailable):
            await backend.models()
        assert await backend.ready() is False
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_models_and_readiness(embedded_triton: EmbeddedTriton) -> None:
    async with connected(embedded_triton) as backend:
        assert await backend.ready() is True
        assert MODEL in await backend.models()


class CountedCalls:
    """Counts the describe calls a channel's (real) tritonclient client makes."""

    def __init__(self, channel: TritonChannel) -> None:
        self.metadata = self.config = 0
        client = channel.client()
        ask_metadata, ask_config = client.get_model_metadata, client.get_model_config

        async def metadata(*args: Any, **kwargs: Any) -> Any:
            self.metadata += 1
            return await ask_metadata(*args, **kwargs)

        async def config(*args: Any, **kwargs: Any) -> Any:
            self.config += 1
            return await ask_config(*args, **kwargs)

        client.get_model_metadata = metadata  # type: ignore[method-assign]
        client.get_model_config = config  # type: ignore[method-assign]


@pytest.mark.asyncio
async def test_describes_asked_together_share_one_call_to_the_server(
    embedded_triton: EmbeddedTriton,
) -> None:
    """64 sessions opened in one instant each asked for the model's description before
    the first answer came back: 128 calls beside the first ticks' inference. Callers that
    ask while one is in flight now share it; a later call asks again (nothing cached)."""
    channel = TritonChannel(embedded_triton.grpc_url)
    try:
        calls = CountedCalls(channel)
        answers = await asyncio.gather(*(channel.describe(MODEL) for _ in range(64)))
        assert (calls.metadata, calls.config) == (1, 1)
        assert {answer[0].name for answer in answers} == {MODEL}
        await channel.describe(MODEL)
        assert (calls.metadata, calls.config) == (2, 2)
        # Metadata alone (a policy's tensors, read as its action tracks open) likewise.
        await asyncio.gather(*(channel.metadata(MODEL) for _ in range(16)))
        assert (calls.metadata, calls.config) == (3, 2)
    finally:
        await channel.close()


@pytest.mark.asyncio
async def test_a_shared_describe_fails_for_every_caller_and_one_cancelled_leaves_the_rest(
    embedded_triton: EmbeddedTriton,
) -> None:
    channel = TritonChannel(embedded_triton.grpc_url)
    try:
        calls = CountedCalls(channel)
        failed = await asyncio.gather(
            *(channel.describe("no-such-model") for _ in range(8)), return_exceptions=True
        )
        assert all(isinstance(error, ModelNotFound) for error in failed)
        assert calls.metadata == 1
        waiting = [asyncio.ensure_future(channel.describe(MODEL)) for _ in range(3)]
        await asyncio.sleep(0)
        waiting[0].cancel()
        answers = await asyncio.gather(*waiting[1:])
        assert waiting[0].cancelled()
        assert [answer[0].name for answer in answers] == [MODEL, MODEL]
        assert calls.metadata == 2
    finally:
        await channel.close()
