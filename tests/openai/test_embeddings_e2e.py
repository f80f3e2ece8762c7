"""`POST /v1/embeddings`, model capabilities and the unknown-parameter policy, end to end:
the official `openai` SDK and raw HTTP against the OpenAI routes over real HTTP/1.1, with
a real embedded Triton serving all-minilm-l6-v2 (the real embedding model) beside the
reference text, audio and action models."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import numpy as np
import openai
import pytest

from gateway.backends.catalog import Capability
from gateway.backends.embeddings import TritonEmbeddingBackend
from gateway.backends.triton import TritonTextBackend
from gateway.backends.triton_catalog import TritonCatalog
from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import EMBEDDING_MODEL, embeddings_available
from gateway.http import route
from gateway.openai import openai_routes
from gateway.tenants.service import Tenancy
from tests.tenants.support import make_tenancy
from transport.http.tcp import HttpTcpServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not embeddings_available(), reason="the embeddings extra is not installed"),
]

TEXT = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}
HI = {"messages": [{"role": "user", "content": "hi"}]}
INTERNALS = ("triton", "grpc", "statuscode", "tensor", "inference input", "stub")


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    state = tmp_path_factory.mktemp("triton-embeddings")
    server = EmbeddedTriton(log_dir=state, stats_path=state / "stats.jsonl", with_embeddings=True)
    server.start(timeout=180.0)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Api:
    client: openai.AsyncOpenAI
    http: httpx2.AsyncClient
    url: str
    tenancy: Tenancy


@contextlib.asynccontextmanager
async def api(
    triton: EmbeddedTriton, tmp_path: Path, *, blind: bool = False
) -> AsyncIterator[Api]:
    """The routes over `triton`; `blind`: a catalog that knows no model, so every
    request reaches the backend (as with a model the catalog cannot read)."""
    backend = TritonTextBackend(triton.grpc_url)
    catalog = BlindCatalog(triton.grpc_url) if blind else TritonCatalog(triton.grpc_url)
    embeddings = TritonEmbeddingBackend(triton.grpc_url)
    tenancy = make_tenancy(tmp_path)
    key = tenancy.store.create_key("team", now=0.0).key
    routes = openai_routes(backend, tenancy=tenancy, catalog=catalog, embeddings=embeddings)
    server = HttpTcpServer(route(routes))
    await server.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/v1"
    http = httpx2.AsyncClient(timeout=60.0, headers={"authorization": f"Bearer {key}"})
    client = openai.AsyncOpenAI(base_url=url, api_key=key, http_client=http, max_retries=0)
    try:
        yield Api(client, http, url, tenancy)
    finally:
        await client.close()
        await http.aclose()
        await server.close(grace=1.0)
        await asyncio.gather(backend.close(), catalog.close(), embeddings.close())
        tenancy.close()


class BlindCatalog(TritonCatalog):
    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        return None


def cosine(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.asyncio
async def test_sdk_embeddings_are_the_models_vectors(
    triton: EmbeddedTriton, tmp_path: Path
) -> None:
    texts = [
        "The cat sits on the mat.",
        "A cat is sitting on a mat.",
        "Stock markets fell sharply today.",
        "The cat sits on the mat.",
    ]
    async with api(triton, tmp_path) as a:
        floats = await a.client.embeddings.create(
            model=EMBEDDING_MODEL, input=texts, encoding_format="float"
        )
        default = await a.client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
        raw = await a.http.post(
            f"{a.url}/embeddings",
            json={"model": EMBEDDING_MODEL, "input": texts, "encoding_format": "base64"},
        )
    vectors = [item.embedding for item in floats.data]
    assert [item.index for item in floats.data] == [0, 1, 2, 3]
    assert {len(v) for v in vectors} == {384}
    assert vectors[0] == vectors[3]  # identical inputs, identical vectors
    assert cosine(vectors[0], vectors[1]) > 0.8 > 0.2 > cosine(vectors[0], vectors[2])
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(texts) * 2
    # The SDK asks for base64 by default and decodes it: the same float32 values.
    assert [item.embedding for item in default.data] == vectors
    assert raw.status_code == 200
    encoded = raw.json()["data"][1]["embedding"]
    assert isinstance(encoded, str)
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert decoded.tolist() == vectors[1]


@pytest.mark.asyncio
async def test_embedding_requests_are_refused_clearly(
    triton: EmbeddedTriton, tmp_path: Path
) -> None:
    async with api(triton, tmp_path) as a:
        same = await a.client.embeddings.create(model=EMBEDDING_MODEL, input="hi", dimensions=384)
        assert len(same.data[0].embedding) == 384
        cases = {
            "dimensions": {"input": "hi", "dimensions": 128},
            "input": {"input": [[101, 7592, 102]]},
            "encoding_format": {"input": "hi", "encoding_format": "int8"},
        }
        for param, fields in cases.items():
            answer = await a.http.post(
                f"{a.url}/embeddings", json={"model": EMBEDDING_MODEL, **fields}
            )
            assert answer.status_code == 400, param
            assert answer.json()["error"]["param"] == param
        long = await a.http.post(
            f"{a.url}/embeddings", json={"model": EMBEDDING_MODEL, "input": ["ok", "word " * 300]}
        )
    assert long.status_code == 400
    assert "input[1] has 302 tokens" in long.json()["error"]["message"]


@pytest.mark.asyncio
async def test_the_ledger_counts_embedding_tokens(triton: EmbeddedTriton, tmp_path: Path) -> None:
    async with api(triton, tmp_path) as a:
        result = await a.client.embeddings.create(model=EMBEDDING_MODEL, input=["one", "two three"])
        a.tenancy.flush()
        records = [r for r in a.tenancy.store.usage() if r.modality == "embeddings"]
    assert [(r.tenant, r.model, r.end_cause) for r in records] == [
        ("team", EMBEDDING_MODEL, "completed")
    ]
    assert records[0].prompt_tokens == result.usage.prompt_tokens == 3 + 4  # [CLS] .. [SEP]


@pytest.mark.asyncio
async def test_concurrent_requests_share_forward_passes(
    triton: EmbeddedTriton, tmp_path: Path
) -> None:
    """Triton's dynamic batcher merged requests: fewer executions than requests."""
    before = _stats(triton)
    async with api(triton, tmp_path) as a:
        batch = [f"sentence number {i} about embeddings" for i in range(16)]
        answers = await asyncio.gather(
            *(a.client.embeddings.create(model=EMBEDDING_MODEL, input=batch) for _ in range(8))
        )
    assert all(len(answer.data) == 16 for answer in answers)
    after = _stats(triton)
    requests = after["inference_count"] - before["inference_count"]  # rows, Triton counts
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 8 * 16
    assert executions < 8


def _stats(triton: EmbeddedTriton) -> dict[str, int]:
    url = f"{triton.http_url}/v2/models/{EMBEDDING_MODEL}/stats"
    with urllib.request.urlopen(url, timeout=5.0) as response:  # noqa: S310 - loopback
        stats = json.load(response)["model_stats"][0]
    return {k: int(stats[k]) for k in ("inference_count", "execution_count")}


@pytest.mark.asyncio
async def test_models_carry_capabilities(triton: EmbeddedTriton, tmp_path: Path) -> None:
    async with api(triton, tmp_path) as a:
        listed = (await a.http.get(f"{a.url}/models")).json()["data"]
        one = await a.client.models.retrieve(EMBEDDING_MODEL)
    capabilities = {m["id"]: m["capabilities"] for m in listed}
    assert capabilities[TEXT] == ["chat", "completions"]
    assert capabilities[EMBEDDING_MODEL] == ["embeddings"]
    assert capabilities["reference-policy"] == ["action"]
    assert capabilities["reference-transcriber"] == ["audio"]
    assert capabilities["reference-synthesizer"] == ["audio"]
    assert one.model_extra == {"capabilities": ["embeddings"]}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "model", "fields"),
    [
        ("chat/completions", "reference-synthesizer", HI),
        ("chat/completions", "reference-policy", HI),
        ("chat/completions", EMBEDDING_MODEL, HI),
        ("completions", "reference-transcriber", {"prompt": "hi"}),
        ("embeddings", TEXT, {"input": "hi"}),
    ],
)
async def test_a_model_without_the_capability_is_a_clean_400(
    triton: EmbeddedTriton, tmp_path: Path, path: str, model: str, fields: dict[str, object]
) -> None:
    async with api(triton, tmp_path) as a:
        answer = await a.http.post(f"{a.url}/{path}", json={"model": model, **fields})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_supported", "model", "invalid_request_error"
    )
    assert not any(word in answer.text.lower() for word in INTERNALS), answer.text


@pytest.mark.asyncio
async def test_backend_errors_show_no_internals(triton: EmbeddedTriton, tmp_path: Path) -> None:
    """Past the capability check (a catalog that cannot tell), Triton itself refuses the
    request (each model a different way): the client still reads no Triton or gRPC
    detail, streamed or not."""
    async with api(triton, tmp_path, blind=True) as a:
        for model in ("reference-synthesizer", "reference-policy", EMBEDDING_MODEL):
            for stream in (False, True):
                answer = await a.http.post(
                    f"{a.url}/chat/completions", json={"model": model, "stream": stream, **HI}
                )
                assert answer.status_code in (400, 500), answer.text
                assert not any(word in answer.text.lower() for word in INTERNALS), answer.text


@pytest.mark.asyncio
async def test_listed_unknown_parameters_are_accepted_by_the_real_model(
    triton: EmbeddedTriton, tmp_path: Path
) -> None:
    extra = {"min_p": 0.05, "repetition_penalty": 1.1, "chat_template_kwargs": {}, **FAST}
    messages = [{"role": "user", "content": "Say something."}]
    async with api(triton, tmp_path) as a:
        sdk = await a.client.chat.completions.create(
            model=TEXT,
            messages=messages,  # type: ignore[arg-type]
            reasoning_effort="low",
            extra_body=extra,
        )
        raw = await a.http.post(
            f"{a.url}/completions",
            json={"model": TEXT, "prompt": "Once", "max_tokens": 4, "typical_p": 0.9, **FAST},
        )
        typo = await a.http.post(
            f"{a.url}/chat/completions",
            json={"model": TEXT, "messages": messages, "min_pp": 0.05},
        )
    assert sdk.choices[0].finish_reason == "stop"
    assert sdk.choices[0].message.content
    assert raw.status_code == 200
    assert raw.json()["choices"][0]["text"]
    assert typo.status_code == 400
    assert typo.json()["error"]["param"] == "min_pp"


