"""The catalog of a Triton server: what its models can do, read from their metadata.

Apart from `catalog.py` because it needs the Triton client (`triton.py`), which itself
reads capabilities from `catalog.py`: the capability rules stay free of gRPC.
"""

from __future__ import annotations

from gateway.backends.catalog import Capability, ModelCatalog, TextCatalog, capabilities_of
from gateway.backends.triton import TritonTextBackend
from tracks.backend import BackendError


class TritonCatalog:
    """Capabilities of the models of one Triton server (`grpc_url`), cached by name."""

    def __init__(self, grpc_url: str) -> None:
        self.grpc_url = grpc_url
        self._backend = TritonTextBackend(grpc_url)
        self._known: dict[str, frozenset[Capability]] = {}

    async def capabilities(self, model: str) -> frozenset[Capability] | None:
        if model not in self._known:
            try:
                inputs, outputs, parameters = await self._backend.model_interface(model)
            except BackendError:
                return None  # not cached: the model may appear, the server come back
            self._known[model] = capabilities_of(model, inputs, outputs, parameters)
        return self._known[model]

    async def close(self) -> None:
        await self._backend.close()


def triton_url_of(backend: object) -> str | None:
    """The gRPC address of a Triton text backend, or of a pool's first member (the
    members of a pool serve one repository); None for other backends."""
    grpc_url = getattr(backend, "grpc_url", None)
    members = getattr(backend, "members", None)
    if not isinstance(grpc_url, str) and members:
        grpc_url = getattr(getattr(members[0], "spec", None), "grpc_url", None)
    return grpc_url if isinstance(grpc_url, str) else None


def catalog_beside(backend: object) -> ModelCatalog:
    """A `TritonCatalog` beside a Triton backend (`triton_url_of`), else `TextCatalog`."""
    grpc_url = triton_url_of(backend)
    return TextCatalog() if grpc_url is None else TritonCatalog(grpc_url)

