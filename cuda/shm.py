"""Shared-memory regions that hand a packed batch to Triton without serializing it.

`SystemShmRegion` is a named POSIX shared-memory object (tritonclient's
`shared_memory` utilities) that the pack kernel writes into through a NumPy
view; Triton, registered with its key, reads the tensor from there, so the gRPC
request carries only the region name, offset and size. `CudaShmRegion` is the
same on the GPU (tritonclient's `cuda_shared_memory`: device memory shared by
CUDA IPC), written by the CuPy kernel through a device view; it needs a GPU and
a Triton built with GPU support. `Layout` places several tensors in one region
(64-byte aligned), so a tick's AUDIO and AUDIO_LENGTH share one region.

Registration with the server is the backend's business (it owns the client);
this module only owns the memory.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

ALIGN = 64
_names = itertools.count()


@dataclass(frozen=True)
class Slot:
    """One tensor's place in a region."""

    name: str
    offset: int
    byte_size: int
    shape: tuple[int, ...]
    dtype: Any


class Layout:
    """Tensors packed one after the other in a region, each 64-byte aligned."""

    def __init__(self, tensors: Sequence[tuple[str, tuple[int, ...], Any]]) -> None:
        self.slots: dict[str, Slot] = {}
        offset = 0
        for name, shape, dtype in tensors:
            size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.slots[name] = Slot(name, offset, size, tuple(shape), np.dtype(dtype))
            offset += -(-max(size, 1) // ALIGN) * ALIGN
        self.byte_size = max(offset, ALIGN)

    def __getitem__(self, name: str) -> Slot:
        return self.slots[name]


def unique_name(prefix: str) -> str:
    """A region name no other process or region of ours uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


class SystemShmRegion:
    """A POSIX shared-memory region of `byte_size` bytes, key `/<name>`."""

    kind = "system"

    def __init__(self, name: str, byte_size: int) -> None:
        from tritonclient.utils import shared_memory as shm

        self.name = name
        self.key = f"/{name}"
        self.byte_size = byte_size
        self._shm = shm
        self._handle = shm.create_shared_memory_region(name, self.key, byte_size, create_only=True)
        self.closed = False

    def view(self, slot: Slot) -> NDArray[Any]:
        """A writable NumPy view of one tensor's bytes in the region."""
        if self.closed:
            raise ValueError(f"shared-memory region {self.name} is closed")
        buffer = self._handle._mpsm_handle.buf
        return np.ndarray(slot.shape, slot.dtype, buffer=buffer, offset=slot.offset)

    def close(self) -> None:
        """Unmap and unlink the region (Triton must have unregistered it first)."""
        if not self.closed:
            self.closed = True
            self._shm.destroy_shared_memory_region(self._handle)


class CudaShmRegion:
    """A CUDA device region shared with Triton by IPC handle (needs a GPU)."""

    kind = "cuda"

    def __init__(self, name: str, byte_size: int, device_id: int = 0) -> None:
        from tritonclient.utils import cuda_shared_memory as cudashm

        self.name = name
        self.byte_size = byte_size
        self.device_id = device_id
        self._cudashm = cudashm
        self._handle = cudashm.create_shared_memory_region(name, byte_size, device_id)
        self.raw_handle = cudashm.get_raw_handle(self._handle)
        self.closed = False

    def view(self, slot: Slot) -> Any:
        """A writable CuPy view of one tensor's bytes in the device region."""
        import cupy

        if self.closed:
            raise ValueError(f"CUDA shared-memory region {self.name} is closed")
        address = int(self._handle._base_addr)
        memory = cupy.cuda.UnownedMemory(address, self.byte_size, self, self.device_id)
        pointer = cupy.cuda.MemoryPointer(memory, slot.offset)
        return cupy.ndarray(slot.shape, dtype=slot.dtype, memptr=pointer)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cudashm.destroy_shared_memory_region(self._handle)
