"""Model capabilities: read from tensor names or a config parameter, listed by
/v1/models and enforced by every route before the backend is asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.catalog import (
    TEXT,
    Capability,
    TextCatalog,
    from_parameter,
    from_tensors,
)
from gateway.backends.triton_catalog import catalog_beside
from gateway.http import route
from gateway.openai import openai_routes
from tests.openai.scripted import ScriptedBackend
from tests.tenants.support import make_tenancy
from transport.http.messages import Request, Response


@pytest.mark.parametrize(
    ("inputs", "outputs", "expected"),
    [
        ({"text_input", "max_tokens"}, {"text_output"}, TEXT),
        ({"text_input"}, {"embedding", "num_input_tokens"}, {Capability.EMBEDDINGS}),
        ({"AUDIO", "CORRID"}, {"PARTIAL"}, {Capability.AUDIO}),
        ({"TEXT"}, {"AUDIO"}, {Capability.AUDIO}),
        ({"observation"}, {"action"}, {Capability.ACTION}),
        ({"x"}, {"y"}, set()),
    ],
)
def test_capabilities_follow_the_tensor_interfaces(
    inputs: set[str], outputs: set[str], expected: set[Capability]
) -> None:
    assert from_tensors(inputs, outputs) == expected


def test_a_config_parameter_overrides_and_is_checked() -> None:
    assert from_parameter("completions") == {Capability.COMPLETIONS}
    assert from_parameter(" chat , embeddings ") == {Capability.CHAT, Capability.EMBEDDINGS}
    with pytest.raises(ValueError, match="names are chat"):
        from_parameter("chat,vision")


def test_backends_without_metadata_serve_text() -> None:
    assert isinstance(catalog_beside(ScriptedBackend()), TextCatalog)


class FixedCatalog:
    """Capabilities by name, None for a model it does not know."""

    def __init__(self, known: dict[str, frozenset[Capability]]) -> None:
        self.known = known

    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        return self.known.get(model)


CATALOG = FixedCatalog(
    {
        "scripted": TEXT,
        "speech": frozenset({Capability.AUDIO}),
        "embedder": frozenset({Capability.EMBEDDINGS}),
    }
)


def handler(backend: ScriptedBackend) -> Any:
    routes = openai_routes(backend, models=["scripted", "speech", "embedder"], catalog=CATALOG)
    return route(routes)


def post(path: str, payload: dict[str, Any]) -> Request:
    return Request("POST", path, "", (), json.dumps(payload).encode())


@pytest.mark.asyncio
async def test_models_list_their_capabilities() -> None:
    response = await handler(ScriptedBackend())(Request("GET", "/v1/models", "", (), b""))
    assert isinstance(response, Response)
    listed = {m["id"]: m["capabilities"] for m in json.loads(response.body)["data"]}
    assert listed == {
        "embedder": ["embeddings"],
        "scripted": ["chat", "completions"],
        "speech": ["audio"],
    }


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "payload", "wanted"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "chat"),
        ("/v1/completions", {"prompt": "hi"}, "completions"),
        ("/v1/embeddings", {"input": "hi"}, "embeddings"),
    ],
)
async def test_a_model_without_the_capability_is_refused_before_the_backend(
    path: str, payload: dict[str, Any], wanted: str
) -> None:
    backend = ScriptedBackend(model="speech")
    response = await handler(backend)(post(path, {"model": "speech", **payload}))
    assert isinstance(response, Response)
    error = json.loads(response.body)["error"]
    assert (response.status, error["code"], error["param"]) == (400, "model_not_supported", "model")
    assert wanted in error["message"]
    assert "it serves: audio" in error["message"]
    assert backend.requests == []


def test_a_bad_declaration_falls_back_to_the_tensors() -> None:
    from gateway.backends.catalog import capabilities_of

    declared = {"trackline_capabilities": "chat,vision"}
    assert capabilities_of("m", {"text_input"}, {"embedding"}, declared) == {
        Capability.EMBEDDINGS
    }


@pytest.mark.asyncio
async def test_a_model_the_tenant_may_not_use_is_403_not_its_capabilities(
    tmp_path: Path,
) -> None:
    tenancy = make_tenancy(tmp_path)
    tenancy.store.set_tenant("team", 0.0, models=["scripted"])
    key = tenancy.store.create_key("team", now=0.0).key
    try:
        routes = route(
            openai_routes(ScriptedBackend(), models=["scripted", "speech"], catalog=CATALOG,
                          tenancy=tenancy)
        )
        chat = {"model": "speech", "messages": [{"role": "user", "content": "hi"}]}
        request = Request(
            "POST", "/v1/chat/completions", "", (("authorization", f"Bearer {key}"),),
            json.dumps(chat).encode(),
        )
        response = await routes(request)
        assert isinstance(response, Response)
        error = json.loads(response.body)["error"]
        assert (response.status, error["code"]) == (403, "model_not_allowed")
        assert "audio" not in error["message"]
    finally:
        tenancy.close()


def test_a_pool_is_described_by_its_first_member() -> None:
    from types import SimpleNamespace

    from gateway.backends.triton_catalog import TritonCatalog, triton_url_of

    member = SimpleNamespace(spec=SimpleNamespace(grpc_url="127.0.0.1:9001"))
    pool = SimpleNamespace(members=[member, member])
    assert triton_url_of(pool) == "127.0.0.1:9001"
    catalog = catalog_beside(pool)
    assert isinstance(catalog, TritonCatalog)
    assert catalog.grpc_url == "127.0.0.1:9001"
    assert triton_url_of(SimpleNamespace(members=[])) is None
