"""Sending a NumPy array as a ``.npy`` body without copying it into one big ``bytes`` object."""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator

import numpy as np

# Chunk size of the streamed body: large enough that Python overhead is negligible, small enough that
# nothing big is held twice.
CHUNK_BYTES = 4 << 20

# The cube's content digest, as the server computes it (`src/cube/digest.rs`): SHA-256 as a tree of 4 MiB
# leaves over the canonical .npy, so that the server hashes the leaves on every core as the body arrives.
LEAF_BYTES = 4 << 20
TREE_TAG = b"hypermnf-content-v2 sha256-tree 4MiB"


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


def canonical_header(descr: str, shape: tuple) -> bytes:
    """The server's canonical ``.npy`` header for a little-endian C-order cube (``src/cube/npy.rs``): the
    dict NumPy writes, padded with spaces so that the samples start at a multiple of 64 bytes."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, ", ".join(str(int(d)) for d in shape))
    dict_bytes = text.encode("latin1")
    header_len = -(-(10 + len(dict_bytes) + 1) // 64) * 64 - 10
    if header_len > 0xFFFF:  # pragma: no cover - a 3-D shape never needs format 2.0
        raise ValueError("the cube's shape does not fit a version 1.0 .npy header")
    padded = dict_bytes + b" " * (header_len - len(dict_bytes) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + header_len.to_bytes(2, "little") + padded


def cube_digest(header: bytes, raw: memoryview) -> str:
    """The hex content digest of the stream ``header`` + ``raw`` (leaves hashed on several threads:
    hashlib releases the GIL while it hashes)."""
    total = len(header) + raw.nbytes
    n = -(-total // LEAF_BYTES)

    def leaf(i: int) -> bytes:
        start, end = i * LEAF_BYTES, min((i + 1) * LEAF_BYTES, total)
        h = hashlib.sha256(header[start:end] if start < len(header) else b"")
        h.update(raw[max(start - len(header), 0) : end - len(header)])
        return h.digest()

    with ThreadPoolExecutor(max_workers=min(n, os.cpu_count() or 2) or 1) as pool:
        leaves = list(pool.map(leaf, range(n)))
    root = hashlib.sha256(TREE_TAG)
    root.update(total.to_bytes(8, "little"))
    for d in leaves:
        root.update(d)
    return root.hexdigest()


def npy_stream(array: np.ndarray) -> tuple[int, Dict[str, str], Iterator[bytes]]:
    """Returns the body length, the digest header to send ahead of it and an iterator over the ``.npy``
    bytes of a C-contiguous ``array``.

    A little-endian (or one-byte) array is sent as the server's canonical ``.npy`` with its content digest
    (``X-Cube-Digest``), which the server checks while the body streams in, on every core. A big-endian one
    is sent as it is held, with the body's SHA-256 (``X-Content-SHA256``), which the server checks on one
    core (its content digest is of the little-endian samples, which are not what is sent)."""
    raw = memoryview(array).cast("B") if array.size else memoryview(b"")
    if array.dtype.str[0] == ">":
        header = npy_header(array)
        sha = hashlib.sha256(header)
        sha.update(raw)
        digest = {"X-Content-SHA256": sha.hexdigest()}
    else:
        header = canonical_header(array.dtype.newbyteorder("<").str, array.shape)
        digest = {"X-Cube-Digest": cube_digest(header, raw)}

    def chunks() -> Iterator[bytes]:
        yield header
        for start in range(0, raw.nbytes, CHUNK_BYTES):
            yield bytes(raw[start : start + CHUNK_BYTES])

    return len(header) + raw.nbytes, digest, chunks()


def load_npy(data: bytes) -> np.ndarray:
    """Parses ``.npy`` bytes (never unpickling anything)."""
    return np.load(io.BytesIO(data), allow_pickle=False)
