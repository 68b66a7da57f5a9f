"""``.npy`` bodies both ways without holding a cube twice: sending an array from its own memory, and
reading a streamed result straight into one preallocated array."""

from __future__ import annotations

import ast
import hashlib
import io
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, Iterator, Optional, Tuple

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


MAGIC = b"\x93NUMPY"
# The longest header dict accepted: NumPy's own limit for files it does not trust (literal_eval of a long
# string is slow, and deep nesting can crash it). A 3-D float32 header is about 70 bytes.
MAX_HEADER_BYTES = 10000
# Per .npy version: bytes of the little-endian header-length field, and the header's text encoding.
_VERSIONS = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf8")}
_MAX_PREAMBLE = 8 + 4 + MAX_HEADER_BYTES


class ShortBody(ValueError):
    """A ``.npy`` stream ended before the length its header (or the response's Content-Length) promised."""

    def __init__(self, received: int, expected: Optional[int]) -> None:
        self.received, self.expected = received, expected
        of = "" if expected is None else f" of {expected}"
        super().__init__(f"the .npy body ended after {received}{of} bytes")


def _preamble_length(head: bytes) -> Optional[int]:
    """The preamble's length (magic, version, length field, header dict), or ``None`` while ``head`` is too
    short to tell. Raises ValueError as soon as ``head`` cannot start a .npy."""
    if head[:6] != MAGIC[: len(head)]:
        raise ValueError(f"not a .npy: the body starts with {bytes(head[:16])!r}")
    if len(head) < 8:
        return None
    version = (head[6], head[7])
    if version not in _VERSIONS:
        raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
    size = _VERSIONS[version][0]
    if len(head) < 8 + size:
        return None
    header_length = int.from_bytes(head[8 : 8 + size], "little")
    if header_length > MAX_HEADER_BYTES:
        raise ValueError(f".npy header of {header_length} bytes (more than {MAX_HEADER_BYTES}): refused")
    return 8 + size + header_length


def parse_npy_preamble(preamble: bytes) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` from a complete ``.npy`` preamble, checked as ``np.load`` checks it
    (``ast.literal_eval``, never unpickling); object dtypes are refused."""
    length = _preamble_length(preamble)
    if length is None or length != len(preamble):
        raise ValueError(f"incomplete .npy preamble ({len(preamble)} bytes)")
    version = (preamble[6], preamble[7])
    size, encoding = _VERSIONS[version]
    try:
        d = ast.literal_eval(bytes(preamble[8 + size :]).decode(encoding))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise ValueError(f"cannot parse the .npy header: {e}") from None
    if not isinstance(d, dict) or d.keys() != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"the .npy header is not a dict of descr, fortran_order, shape: {d!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"the .npy header has an invalid shape: {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"the .npy header has an invalid fortran_order: {fortran!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"the .npy header has an invalid descr {d['descr']!r}: {e}") from None
    if dtype.hasobject:
        raise ValueError(f"the .npy holds Python objects ({dtype}), which are never unpickled")
    return shape, fortran, dtype


def read_npy_stream(chunks: Iterable[bytes], expected_length: Optional[int] = None) -> np.ndarray:
    """Reads a ``.npy`` arriving as byte chunks (of any sizes) into one array allocated once.

    The preamble is parsed and the data's size checked against ``expected_length`` (the body's length, e.g.
    Content-Length, when known) before anything is allocated; each following chunk is then copied straight
    into the array's memory. No chunk is joined with another, so the cube is held once.

    Raises:
        ValueError: a malformed or refused preamble, a size that disagrees with ``expected_length``, or more
            bytes than the header promises.
        ShortBody: (a ValueError) the chunks ended early, e.g. a dropped connection.
    """
    reader = NpyReader(expected_length)
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


class NpyReader:
    """The incremental form of :func:`read_npy_stream`: ``feed`` each chunk as it arrives (from a blocking
    or an asyncio stream), then ``finish`` returns the array. Same checks, same single allocation."""

    def __init__(self, expected_length: Optional[int] = None) -> None:
        self.expected_length = expected_length
        self._head = bytearray()  # the preamble while it is gathered (at most _MAX_PREAMBLE bytes)
        self._array: Optional[np.ndarray] = None
        self._flat = memoryview(bytearray())
        self._length = 0  # of the preamble
        self._nbytes = 0  # of the data
        self._offset = 0  # data bytes received

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk).cast("B")
        if self._array is not None:
            self._copy(view)
            return
        # Gather the preamble; what follows it in the same chunk is data.
        take = _MAX_PREAMBLE - len(self._head)
        self._head += view[:take]
        length = _preamble_length(self._head)
        if length is None or len(self._head) < length:
            return
        self._start(length)
        head, self._head = self._head, bytearray()
        self._copy(memoryview(head)[length:])
        self._copy(view[take:])

    def finish(self) -> np.ndarray:
        if self._array is None:
            raise ShortBody(len(self._head), self.expected_length)
        if self._offset < self._nbytes:
            raise ShortBody(self._length + self._offset, self._length + self._nbytes)
        return self._array

    def _start(self, length: int) -> None:
        shape, fortran, dtype = parse_npy_preamble(self._head[:length])
        nbytes = dtype.itemsize * math.prod(shape)  # Python ints: an absurd shape cannot overflow
        if self.expected_length is not None and self.expected_length != length + nbytes:
            raise ValueError(
                f"the body is {self.expected_length} bytes but its .npy header ({dtype}, shape {shape}) "
                f"promises {length + nbytes}"
            )
        array = np.empty(shape, dtype, order="F" if fortran else "C")
        # The array's memory as flat bytes, in the order the .npy stores it (Fortran order is the .npy's too).
        self._flat = memoryview(array.reshape(-1, order="A").view(np.uint8)) if nbytes else memoryview(bytearray())
        self._array, self._length, self._nbytes = array, length, nbytes

    def _copy(self, piece: memoryview) -> None:
        end = self._offset + len(piece)
        if end > self._nbytes:
            raise ValueError(f"the .npy body holds more than the {self._length + self._nbytes} bytes its header promises")
        self._flat[self._offset : end] = piece
        self._offset = end
