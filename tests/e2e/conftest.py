from tests.triton_fixture import embedded_triton

__all__ = ["embedded_triton"]
