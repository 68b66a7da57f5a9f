"""Sending a NumPy array as a ``.npy`` body without copying it into one big ``bytes`` object."""

from __future__ import annotations

import hashlib
import io
from typing import Iterator

import numpy as np

# Chunk size of the streamed body: large enough that Python overhead is negligible, small enough that
# nothing big is held twice.
CHUNK_BYTES = 4 << 20


def npy_header(array: np.ndarray) -> bytes:
    """The ``.npy`` preamble (magic, version, header dict, padding) for a C-ordered ``array``."""
    buf = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(array)
    # Version 1.0 holds headers up to 64 KiB, which any 3-D shape fits; let NumPy pick otherwise.
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def as_cube(array: np.ndarray) -> np.ndarray:
    """Checks that ``array`` is a 3-D (lines, samples, bands) numeric cube and returns it C-contiguous."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray, got {type(array).__name__}")
    if array.ndim != 3:
        raise ValueError(f"a cube must be 3-D (lines, samples, bands), got shape {array.shape}")
    if array.dtype.kind not in "iuf":
        raise TypeError(f"a cube must hold integers or floats, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(f"a cube must not be empty, got shape {array.shape}")
    # The service reads C order; a Fortran-ordered or strided view is copied once here.
    return np.ascontiguousarray(array)


def npy_stream(array: np.ndarray) -> tuple[int, str, Iterator[bytes]]:
    """Returns the body length, its hex SHA-256 and an iterator over the ``.npy`` bytes of a C-contiguous
    ``array``."""
    header = npy_header(array)
    raw = memoryview(array).cast("B") if array.size else memoryview(b"")
    digest = hashlib.sha256(header)
    digest.update(raw)

    def chunks() -> Iterator[bytes]:
        yield header
        for start in range(0, raw.nbytes, CHUNK_BYTES):
            yield bytes(raw[start : start + CHUNK_BYTES])

    return len(header) + raw.nbytes, digest.hexdigest(), chunks()


def load_npy(data: bytes) -> np.ndarray:
    """Parses ``.npy`` bytes (never unpickling anything)."""
    return np.load(io.BytesIO(data), allow_pickle=False)
