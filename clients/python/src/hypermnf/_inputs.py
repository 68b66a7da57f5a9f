"""How each kind of cube becomes an HTTP request body for ``POST /v1/jobs``.

* a NumPy array      → ``application/x-npy`` body, streamed from the array's memory; parameters in the query;
* an ENVI ``.hdr``   → ``multipart/form-data`` with parts ``header``, ``data`` (streamed from disk) and ``params``;
* a ``.npy`` file    → ``application/x-npy`` body streamed from disk;
* a ``file://`` href → ``application/json`` ``{"input": {"href": ...}, "params": {...}}`` (the server reads it).
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Union

import numpy as np

from ._npy import as_cube, npy_stream
from ._params import Params

# An array's digest (`X-Cube-Digest`, or `X-Content-SHA256` for a big-endian one, see `npy_stream`) is sent
# ahead of it: when the caller already has a job of the same cube and parameters, the server answers at once
# without reading the body (hashing memory is much cheaper than uploading it again, e.g. when a notebook
# cell is re-run).

CubeLike = Union[np.ndarray, str, "os.PathLike[str]"]

# Where ENVI tools put the raw data beside `NAME.hdr`, in the order they are tried.
_DATA_SUFFIXES = (".img", ".dat", ".raw", ".bsq", ".bil", ".bip", ".bin", "")


@dataclass
class Upload:
    """Keyword arguments for ``httpx.Client.request`` plus the files to close after the request."""

    kwargs: Dict[str, Any]
    files: ExitStack = field(default_factory=ExitStack)


def envi_data_file(header: Path) -> Path:
    """The raw data file that belongs to the ENVI header ``header`` (same stem, usual suffixes)."""
    stem = header.with_suffix("")
    for suffix in _DATA_SUFFIXES:
        candidate = stem.with_name(stem.name + suffix) if suffix else stem
        if candidate != header and candidate.is_file():
            return candidate
    tried = ", ".join(stem.name + s for s in _DATA_SUFFIXES)
    raise FileNotFoundError(f"no ENVI data file beside {header} (tried {tried})")


def build_upload(cube: CubeLike, params: Params) -> Upload:
    """Chooses the request form for ``cube`` and prepares its (streaming) body."""
    if isinstance(cube, np.ndarray):
        return _npy_array(as_cube(cube), params)
    if isinstance(cube, str) and cube.startswith("file://"):
        body = json.dumps({"input": {"href": cube}, "params": params.to_json()}).encode()
        return Upload({"content": body, "headers": {"Content-Type": "application/json"}})
    if isinstance(cube, (str, os.PathLike)):
        path = Path(os.fspath(cube))
        if "://" in str(cube):
            raise ValueError(f"only file:// hrefs are understood, got {cube!r}")
        if not path.is_file():
            raise FileNotFoundError(f"no such cube file: {path}")
        suffix = path.suffix.lower()
        if suffix == ".hdr":
            return _envi_multipart(path, params)
        if suffix == ".npy":
            return _npy_file(path, params)
        raise ValueError(f"a cube path must be an ENVI header (.hdr) or a .npy file, got {path}")
    raise TypeError(
        "cube must be a numpy array (lines, samples, bands), a path to an ENVI .hdr or .npy file, "
        f"or a 'file://' href on the server; got {type(cube).__name__}"
    )


def _npy_array(array: np.ndarray, params: Params) -> Upload:
    length, digest, chunks = npy_stream(array)
    headers = {"Content-Type": "application/x-npy", "Content-Length": str(length), **digest}
    return Upload({"content": chunks, "params": params.to_query(), "headers": headers})


def _npy_file(path: Path, params: Params) -> Upload:
    upload = Upload({})
    handle = upload.files.enter_context(open(path, "rb"))
    upload.kwargs = {
        "content": _read_chunks(handle),
        "params": params.to_query(),
        "headers": {"Content-Type": "application/x-npy", "Content-Length": str(path.stat().st_size)},
    }
    return upload


def _envi_multipart(header: Path, params: Params) -> Upload:
    data = envi_data_file(header)
    upload = Upload({})
    # httpx streams file parts in chunks and computes Content-Length from the files' sizes.
    header_file = upload.files.enter_context(open(header, "rb"))
    data_file = upload.files.enter_context(open(data, "rb"))
    upload.kwargs = {
        "files": [
            ("header", (header.name, header_file, "text/plain")),
            ("data", (data.name, data_file, "application/octet-stream")),
            ("params", (None, json.dumps(params.to_json()).encode(), "application/json")),
        ]
    }
    return upload


def _read_chunks(handle: Any, size: int = 4 << 20) -> Iterable[bytes]:
    while True:
        block = handle.read(size)
        if not block:
            return
        yield block

