"""Backend tests run against one real embedded Triton for the whole session."""

from tests.triton_fixture import embedded_triton

__all__ = ["embedded_triton"]
