"""Resumable uploads: the tus 1.0 protocol (``/v1/uploads``) with httpx, for cubes above the client's
``tus_threshold``.

The upload is created (``POST``, ``Upload-Length``), its bytes sent in ``PATCH`` requests of up to
:data:`CHUNK_BYTES`, each streamed from the array's memory or the file in 1 MiB pieces with a progress
bar. When a connection drops (or the server answers 409, 423 or 5xx), the client waits (exponential
backoff, bounded retries), asks the server how much it holds (``HEAD``: ``Upload-Offset``) and sends the
rest from there. The finished upload is then named in ``POST /v1/jobs`` (``{"upload": id, ...}``).
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import httpx

from .errors import APIError, ConnectionError

TUS_VERSION = "1.0.0"
# Cubes at least this large go through a resumable upload (Client(tus_threshold=...)).
DEFAULT_THRESHOLD = 256 << 20
# Bytes per PATCH: each request stays well within the server's request timeout on slow links.
CHUNK_BYTES = 256 << 20
# Bytes per piece of a PATCH body (and per progress step).
PIECE_BYTES = 1 << 20
# Failed attempts in a row before giving up, and the backoff: 0.5 s doubling up to 30 s.
DEFAULT_RETRIES = 10
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
# Answers after which the client asks the offset again and resumes (a PATCH that raced another, the
# server busy with the upload, or a passing server error).
_RETRY_STATUSES = (409, 423, 500, 502, 503, 504)


class Source:
    """The bytes to upload: ``length`` and ``read(offset, size)``."""

    length: int
    name: str

    def read(self, offset: int, size: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class MemorySource(Source):
    """A ``.npy`` held in memory: its header bytes, then the array's own memory (never copied whole)."""

    def __init__(self, header: bytes, raw: memoryview, name: str = "cube.npy") -> None:
        self.header, self.raw, self.name = header, raw, name
        self.length = len(header) + raw.nbytes

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.length)
        h = len(self.header)
        out = b""
        if offset < h:
            out = self.header[offset:min(end, h)]
        if end > h:
            out += bytes(self.raw[max(offset - h, 0) : end - h])
        return out


class FileSource(Source):
    """A file on disk, read where it is."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.length = self.path.stat().st_size
        self._file = open(self.path, "rb")

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._file.fileno(), min(size, self.length - offset), offset)

    def close(self) -> None:
        self._file.close()


def _metadata(pairs: Dict[str, str]) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in pairs.items())


class Uploader:
    """One resumable upload over ``http`` (an ``httpx.Client`` with the service's base URL and headers).

    ``error`` turns an unexpected answer into the package's :class:`APIError`; ``sleep`` is the pause
    between attempts (tests make it short)."""

    def __init__(
        self,
        http: httpx.Client,
        error: Callable[[httpx.Response], APIError],
        *,
        retries: int = DEFAULT_RETRIES,
        progress: bool = True,
        chunk_bytes: int = CHUNK_BYTES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.http, self.error, self.retries, self.progress = http, error, retries, progress
        self.chunk_bytes, self.sleep = chunk_bytes, sleep
        self.resumed = 0  # how many times an upload was resumed after a failure (tests read it)
        self.location: Optional[str] = None  # the upload's path, once created

    def upload(self, source: Source, filetype: str = "application/octet-stream") -> str:
        """Uploads all of ``source``; returns the upload's id (for ``POST /v1/jobs``)."""
        location = self.location = self._create(source, filetype)
        bar = _bar(source, self.progress)
        try:
            self._send(location, source, bar)
        except ConnectionError:
            # Given up: the server frees the space now rather than when the upload expires (if it can
            # be reached at all).
            try:
                self.http.delete(location, headers=self._headers(), timeout=10.0)
            except httpx.HTTPError:
                pass
            raise
        finally:
            bar.close()
        return location.rstrip("/").rsplit("/", 1)[-1]

    # -- the protocol ----------------------------------------------------------------------------------

    def _headers(self, **more: str) -> Dict[str, str]:
        return {"Tus-Resumable": TUS_VERSION, **more}

    def _create(self, source: Source, filetype: str) -> str:
        headers = self._headers(**{
            "Upload-Length": str(source.length),
            "Upload-Metadata": _metadata({"filename": source.name, "filetype": filetype}),
        })
        response = self._retrying(lambda: self.http.post("/v1/uploads", headers=headers), "create the upload")
        if response.status_code != 201:
            raise self.error(response)
        location = response.headers.get("location", "")
        if not location:
            raise APIError(response.status_code, "no_location", "the server created an upload but gave no Location")
        return _relative(location, str(self.http.base_url))

    def _offset(self, location: str) -> int:
        response = self._retrying(lambda: self.http.head(location, headers=self._headers()), "ask the upload's offset")
        if response.status_code != 200:
            raise self.error(response)
        return int(response.headers["upload-offset"])

    def _send(self, location: str, source: Source, bar: Any) -> None:
        offset, failures = 0, 0
        while offset < source.length:
            end = min(offset + self.chunk_bytes, source.length)
            headers = self._headers(**{
                "Upload-Offset": str(offset),
                "Content-Type": "application/offset+octet-stream",
                "Content-Length": str(end - offset),
            })
            try:
                response = self.http.patch(location, content=_pieces(source, offset, end, bar), headers=headers)
            except httpx.TransportError as e:
                failure: Any = e
            else:
                if response.status_code == 204:
                    offset = int(response.headers["upload-offset"])
                    failures = 0
                    continue
                if response.status_code not in _RETRY_STATUSES:
                    raise self.error(response)
                failure = self.error(response)
            failures += 1
            if failures > self.retries:
                raise ConnectionError(str(self.http.base_url), f"the upload failed {failures} times in a row: {_why(failure)}")
            self.sleep(_backoff(failures))
            offset = self._offset(location)
            self.resumed += 1
            bar.n = offset
            bar.refresh()

    def _retrying(self, send: Callable[[], httpx.Response], what: str) -> httpx.Response:
        """``send()``, again after a dropped connection or a passing server error (bounded, with backoff)."""
        for attempt in range(1, self.retries + 2):
            try:
                response = send()
            except httpx.TransportError as e:
                failure: Any = e
            else:
                if response.status_code not in (423, 502, 503, 504):
                    return response
                failure = self.error(response)
            if attempt > self.retries:
                raise ConnectionError(str(self.http.base_url), f"cannot {what}: {_why(failure)}")
            self.sleep(_backoff(attempt))
        raise AssertionError("unreachable")


def _pieces(source: Source, start: int, end: int, bar: Any) -> Iterator[bytes]:
    at = start
    while at < end:
        piece = source.read(at, min(PIECE_BYTES, end - at))
        if not piece:
            raise OSError(f"{source.name} ended at {at} of {end} bytes")
        at += len(piece)
        yield piece
        bar.update(len(piece))


def _backoff(attempt: int) -> float:
    return min(BACKOFF_FIRST_S * 2 ** (attempt - 1), BACKOFF_MAX_S)


def _why(failure: Any) -> str:
    text = str(failure).strip()
    return text or type(failure).__name__


def _relative(location: str, base: str) -> str:
    """The upload's URL as a request path for the client: the server answers ``/v1/uploads/<id>``;
    an absolute URL under the client's base URL becomes the path after it."""
    base = base.rstrip("/")
    if location.startswith(base + "/"):
        return location[len(base) :]
    return location


def _bar(source: Source, enabled: bool) -> Any:
    from .job import _progress_bar

    return _progress_bar()(
        total=source.length, unit="B", unit_scale=True, unit_divisor=1024, desc=f"upload {source.name}",
        disable=not enabled, leave=False,
    )
