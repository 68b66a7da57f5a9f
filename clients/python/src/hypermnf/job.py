"""A job on the service: its status, waiting for it with a progress bar, and its result."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Union

import httpx
import numpy as np

from ._http import _ATTEMPTS, _reason, _segment
from ._npy import ShortBody, read_npy_stream
from .errors import ConnectionError, JobCanceled, JobFailed, TimeoutError
from ._metadata import merge_source

TERMINAL = ("succeeded", "failed", "canceled")

# Polling back-off: the first look comes quickly (small cubes finish in milliseconds), then the interval
# grows by half each time up to a cap, so that a long job costs the server one request every 2 s.
FIRST_POLL_S = 0.05
POLL_GROWTH = 1.5
MAX_POLL_S = 2.0
# Servers that know ``GET /v1/jobs/{id}?wait=S`` hold the request until the job ends (at most
# MAX_WAIT_S): the client then asks for holds of LONG_POLL_S, or PROGRESS_EVERY_S while a progress bar
# shows, and the back-off above only serves older servers.
MAX_WAIT_S = 50.0
LONG_POLL_S = 20.0
PROGRESS_EVERY_S = 1.0

PRODUCTS = ("components", "denoised")
FORMATS = ("npy", "envi", "cog")


class _Session(Protocol):
    """What a :class:`Job` uses of its :class:`~hypermnf.Client` (described here, so that this module,
    which the client imports, does not import the client)."""

    url: str
    timeout: Optional[float]

    def _get_json(self, path: str, **kwargs: Any) -> Any: ...

    def _request(
        self, method: str, path: str, *, expect: Iterable[int] = ..., upload: bool = ..., **kwargs: Any
    ) -> httpx.Response: ...

    def _stream(self, path: str, params: Dict[str, Any]) -> Any: ...


class _JobState:
    """What :class:`Job` and :class:`~hypermnf.AsyncJob` share: the job document as last fetched, and the
    metadata once fetched."""

    def __init__(self, client: Any, document: Dict[str, Any], source: Optional[Dict[str, Any]] = None) -> None:
        if not isinstance(document, dict) or not isinstance(document.get("id"), str):
            raise ValueError(f"not a job document: {document!r}")
        self._client = client
        self.document: Dict[str, Any] = document
        self.id: str = document["id"]
        self._metadata: Optional[Dict[str, Any]] = None
        # The submission's answer says whether it was an existing job; later fetches of the job document
        # (refresh, status, wait) describe the job, not that answer, so the flag is kept from the first.
        self._cached = bool(document.get("cached", False))
        # What the client knew of the input besides its samples (a DataArray's or SpyFile's wavelengths...).
        self._source = source

    def __repr__(self) -> str:
        return f"<hypermnf.{type(self).__name__} {self.id} {self.document.get('status', '?')}>"

    # -- state -----------------------------------------------------------------------------------------

    @property
    def cached(self) -> bool:
        """True when the server answered the submission with an existing identical job (stays true after
        :meth:`refresh`, :meth:`status` and :meth:`wait`)."""
        return self._cached or bool(self.document.get("cached", False))

    @property
    def progress(self) -> float:
        """Progress 0..1 as last fetched."""
        return float(self.document.get("progress") or 0.0)

    @property
    def stage(self) -> Optional[str]:
        """The pipeline stage as last fetched (``None`` when not running)."""
        return self.document.get("stage")

    def _adopt_metadata(self, metadata: Any) -> Dict[str, Any]:
        if not isinstance(metadata, dict):
            raise ValueError(f"the job's metadata is not a JSON object: {type(metadata).__name__}")
        self._metadata = merge_source(metadata, self._source)
        return self._metadata

    def _known_metadata(self) -> Dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def eigenvalues(self) -> np.ndarray:
        """The MNF eigenvalues (signal-to-noise ratio + 1 of each component), largest first."""
        return np.asarray(self._known_metadata()["eigenvalues"], dtype=np.float64)

    @property
    def snr(self) -> np.ndarray:
        """The signal-to-noise ratio of each component (eigenvalue − 1)."""
        meta = self._known_metadata()
        if "snr" in meta:
            return np.asarray(meta["snr"], dtype=np.float64)
        return self.eigenvalues - 1.0

    @property
    def bands_used(self) -> List[int]:
        """The 0-based input bands the transform used (bad, constant and excluded bands left out)."""
        return [int(b) for b in self._known_metadata()["bands_used"]]

    def _path(self, suffix: str = "") -> str:
        return f"/v1/jobs/{_segment(self.id)}{suffix}"


class _Waiter:
    """The decisions of ``wait()``, for the blocking and the asyncio job alike: how long each long poll
    asks the server to hold, the progress bar, what a document means, and the pause before the next poll."""

    def __init__(self, job: _JobState, timeout: Optional[float], progress: bool, client_timeout: Optional[float]) -> None:
        self.job, self.timeout, self.progress = job, timeout, progress
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.delay = FIRST_POLL_S
        self.bar: Any = None
        # Long polls: the server answers the moment the job finishes. Each is held at most
        # PROGRESS_EVERY_S while a progress bar shows (so that it moves), else LONG_POLL_S.
        self.hold = PROGRESS_EVERY_S if progress else LONG_POLL_S
        if client_timeout is not None:
            self.hold = min(self.hold, 0.5 * client_timeout)  # the hold must end well before a read times out
        self.asked = 0.0
        self.sent = 0.0

    def ask(self) -> float:
        """The hold to ask for in the next long poll (call just before sending it)."""
        self.asked = self.hold if self.deadline is None else max(0.0, min(self.hold, self.deadline - time.monotonic()))
        self.sent = time.monotonic()
        return self.asked

    def seen(self, document: Dict[str, Any]) -> Optional[float]:
        """Takes the answer of a poll: ``None`` when the job succeeded, else the pause (seconds) before the
        next poll. Raises JobFailed, JobCanceled, or TimeoutError once the deadline has passed."""
        held = time.monotonic() - self.sent
        status = document.get("status")
        job = self.job
        if status not in TERMINAL and self.progress and self.bar is None:
            self.bar = _progress_bar()(total=100, desc=f"job {job.id[:8]}", unit="%", bar_format=_BAR_FORMAT, leave=True)
        if self.bar is not None:
            done = 100.0 if status == "succeeded" else round(100.0 * job.progress, 1)
            self.bar.n = min(max(done, 0.0), 100.0)
            self.bar.set_postfix_str(str(job.stage or status), refresh=False)
            self.bar.refresh()
        if status == "succeeded":
            return None
        if status == "failed":
            error = document.get("error") or {}
            raise JobFailed(job.id, error.get("code"), error.get("message"))
        if status == "canceled":
            raise JobCanceled(job.id)
        # A server that held the request has done the waiting; one that answered at once (an older server,
        # or a wait cut short) is polled with a growing pause instead.
        pause = 0.0 if self.asked > 0 and held >= 0.8 * self.asked else self.delay
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"job {job.id} still {status} ({job.progress:.0%}) after {self.timeout} s; "
                    "it goes on on the server: wait() again or cancel() it"
                )
            pause = min(pause, left)
        if pause > 0:
            self.delay = min(self.delay * POLL_GROWTH, MAX_POLL_S)
        return pause

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Job(_JobState):
    """One job on the service. Made by :meth:`Client.submit`, :meth:`Client.job` and :meth:`Client.jobs`.

    ``document`` is the job document as last fetched; :meth:`refresh` (or :meth:`status`) fetches it again.
    """

    _client: _Session

    def refresh(self, wait: Optional[float] = None) -> Dict[str, Any]:
        """Fetches the job document again (``GET /v1/jobs/{id}``) and returns it.

        With ``wait`` (seconds, at most 50), the server holds the request until the job has finished or
        ``wait`` has passed, whichever comes first (a long poll).
        """
        params = None if not wait or wait <= 0 else {"wait": f"{min(wait, MAX_WAIT_S):.3f}"}
        self.document = self._client._get_json(self._path(), params=params)
        return self.document

    def status(self) -> str:
        """The job's status now: ``queued``, ``running``, ``succeeded``, ``failed`` or ``canceled``."""
        return str(self.refresh()["status"])

    def wait(self, timeout: Optional[float] = None, progress: bool = True) -> "Job":
        """Waits until the job has finished; returns the job when it succeeded.

        Args:
            timeout: give up after this many seconds (``None``: wait as long as it takes).
            progress: show a tqdm progress bar driven by the server's progress and stage.

        Raises:
            JobFailed: the job failed; carries the server's error ``code`` and ``message``.
            JobCanceled: the job was canceled.
            TimeoutError: ``timeout`` passed first (the job goes on on the server).
        """
        waiter = _Waiter(self, timeout, progress, self._client.timeout)
        try:
            while True:
                pause = waiter.seen(self.refresh(wait=waiter.ask()))
                if pause is None:
                    return self
                if pause > 0:
                    time.sleep(pause)
        finally:
            waiter.close()

    def cancel(self) -> None:
        """Cancels the job if it is queued or running (``DELETE /v1/jobs/{id}``).

        The worker stops at its next chunk; :meth:`wait` then raises :class:`JobCanceled`. On a job that has
        already finished, the same request deletes it and its files (see :meth:`delete`).
        """
        self._client._request("DELETE", self._path(), expect=(200, 202, 204))

    def delete(self) -> None:
        """Deletes a finished job and its result files (cancels it first if it is still running)."""
        self.cancel()

    # -- results ---------------------------------------------------------------------------------------

    def result(self, product: str = "components") -> np.ndarray:
        """The result as a NumPy array (``GET /v1/jobs/{id}/result``).

        Args:
            product: ``"components"`` (float32, (lines, samples, k)) or ``"denoised"`` (the inverse transform
                in the input's band space; the job must have been submitted with ``inverse=True``).

        The body is read straight into one array allocated from its ``.npy`` header, so the result is held
        once, never also as the downloaded bytes.

        Raises:
            APIError: 409 ``not_ready`` before the job succeeded; 404 for a product that was not computed.
            ConnectionError: the connection dropped before the whole result arrived.
            TimeoutError: the server stopped sending for longer than the client's ``timeout``.
            ValueError: the body is not a ``.npy`` of the length announced.
        """
        query = _result_query(product, "npy")
        response = self._open_stream(self._path("/result"), query)
        try:
            expected = _content_length(response)
            return read_npy_stream(_body(self._client, response, expected), expected)
        except ShortBody as e:  # the body ended cleanly but short (no Content-Length for httpx to check)
            raise ConnectionError(self._client.url, f"the result was cut off: {e}") from None
        finally:
            response.close()  # before the end (an error), this drops the connection rather than drain it

    def download(self, path: Union[str, "os.PathLike[str]"], product: str = "components", format: str = "npy") -> Path:
        """Streams the result to ``path`` without holding it in memory, and returns the path.

        ``format="npy"`` writes the ``.npy``; ``format="envi"`` writes a zip holding the ENVI ``.hdr`` and ``.img``;
        ``format="cog"`` writes a Cloud-Optimized GeoTIFF with the source's CRS (servers built with GDAL), which
        :func:`hypermnf.cog_to_xarray` opens.
        """
        query = _result_query(product, format)
        target = Path(os.fspath(path))
        response = self._client._stream(self._path("/result"), query)
        try:
            with open(target, "wb") as out:
                for block in response.iter_bytes(1 << 20):
                    out.write(block)
        finally:
            response.close()
        return target

    @property
    def metadata(self) -> Dict[str, Any]:
        """The result's metadata (``GET /v1/jobs/{id}/metadata``; the JSON ``hypermnf run`` writes):
        eigenvalues, SNR, bands used, components, parameters, and ``source`` (the request's header metadata:
        wavelengths, band names, map info...). Fetched once, then kept."""
        if self._metadata is None:
            self._adopt_metadata(self._client._get_json(self._path("/metadata")))
        assert self._metadata is not None
        return self._metadata

    def _known_metadata(self) -> Dict[str, Any]:
        return self.metadata

    def preview(self, component: int = 0) -> bytes:
        """A quicklook of one component as PNG bytes (``GET /v1/jobs/{id}/preview?component=N``): 8-bit
        greyscale, samples wide and lines high, stretched between its 2nd and 98th percentiles, no-data
        pixels black. ``component`` is 0-based, below the number kept.

        In a notebook: ``IPython.display.Image(job.preview(0))``.

        Raises:
            APIError: 409 ``not_ready`` before the job succeeded; 400/404 for a component that was not kept.
        """
        return self._client._request("GET", self._path("/preview"), expect=(200,), params=preview_query(component)).content

    def _open_stream(self, path: str, query: Dict[str, str]) -> httpx.Response:
        """A streamed GET, opened a second time when the first met a closed connection (as ``_request``
        does for a GET: typically a pooled keep-alive connection the server had dropped)."""
        for attempt in range(_ATTEMPTS):
            try:
                return self._client._stream(path, query)
            except ConnectionError:
                if attempt + 1 == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")


def preview_query(component: int) -> Dict[str, str]:
    if isinstance(component, bool) or not hasattr(component, "__index__"):
        raise TypeError(f"component must be an integer, got {component!r}")
    return {"component": str(int(component.__index__()))}


def _progress_bar() -> Any:
    """tqdm's notebook widget when ipywidgets is there, else the text bar (tqdm.auto would warn)."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        from tqdm import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm


_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"


def _content_length(response: httpx.Response) -> Optional[int]:
    """The body's length as announced, when it is the length of the decoded bytes (no content coding)."""
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None
    value = response.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def _body(client: _Session, response: httpx.Response, expected: Optional[int]) -> Iterator[bytes]:
    """The response body's chunks, with transport failures mapped to this package's exceptions.

    ``iter_bytes()`` without a chunk size yields each read of the socket (up to 64 KiB) as it comes: asking
    for larger chunks makes httpx join reads into a buffer, a copy of every byte, and measured slower.
    """
    received = 0
    of = "" if expected is None else f" of {expected}"
    try:
        for chunk in response.iter_bytes():
            received += len(chunk)
            yield chunk
    except httpx.TimeoutException:
        raise TimeoutError(
            f"hypermnf at {client.url} sent {received}{of} bytes of the result, then nothing for {client.timeout} s"
        ) from None
    except httpx.TransportError as e:
        raise ConnectionError(client.url, f"the result was cut off after {received}{of} bytes ({_reason(e)})") from None


def _result_query(product: str, format: str) -> Dict[str, str]:
    if product not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    query: Dict[str, str] = {}
    if product != "components":
        query["product"] = product
    if format != "npy":
        query["format"] = format
    return query
