"""The asyncio client: :class:`AsyncClient` and :class:`AsyncJob`, on ``httpx.AsyncClient``.

The same methods as :class:`~hypermnf.Client` and :class:`~hypermnf.Job`, as coroutines, with the same
requests, retries and errors. Hashing an array's content digest, which takes CPU time, runs in a worker
thread, so the event loop goes on meanwhile. The differences: ``await job.metadata()`` is a coroutine
(the job's ``eigenvalues``, ``snr`` and ``bands_used`` read the metadata it fetched), and an ``AsyncClient``
is closed with ``await client.aclose()`` or ``async with``.

    >>> async with hypermnf.AsyncClient("http://gpu-node:8080") as client:
    ...     jobs = [await client.submit(cube, components=10) for cube in cubes]
    ...     results = await asyncio.gather(*(job.wait_result() for job in jobs))
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Sequence, Union

import httpx
import numpy as np

from ._http import _ATTEMPTS, _SUBMIT_OK, _api_error, _digest_probe, _Disconnected, _page, _page_query
from ._http import _raise_unless_body_needed, _reason, _segment, _settings
from ._inputs import CubeLike, Upload, build_upload
from ._npy import NpyReader, ShortBody
from ._params import DEFAULT_COMPONENTS
from .batches import CubeRef, _BatchState, _BatchWaiter, _system, batch_list, batch_request, list_query
from .client import _check_product, prepare_submission
from .errors import ConnectionError, TimeoutError
from .job import MAX_WAIT_S, _content_length, _JobState, _result_query, _Waiter, preview_query
from .results import Reduction


class AsyncClient:
    """A client of one hypermnf service for asyncio code (``httpx.AsyncClient`` underneath).

    Args: as :class:`~hypermnf.Client` (``url``, ``api_key``, ``timeout``).
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, timeout: Optional[float] = 60.0) -> None:
        self.url, headers = _settings(url, api_key)
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout))

    # -- lifecycle -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"hypermnf.AsyncClient({self.url!r})"

    # -- jobs ------------------------------------------------------------------------------------------

    async def submit(
        self,
        cube: CubeLike,
        components: Optional[int] = DEFAULT_COMPONENTS,
        noise: str = "mean-filter",
        snr: Optional[float] = None,
        inverse: bool = False,
        bad_bands: Optional[Sequence[int]] = None,
        ignore_value: Optional[float] = None,
        noise_window: Optional[Sequence[int]] = None,
        backend: Optional[str] = None,
        statistics_from: Optional[str] = None,
        ortho: bool = False,
    ) -> "AsyncJob":
        """Creates a job that reduces ``cube`` (see :meth:`hypermnf.Client.submit`) and returns it."""
        prepared, params = await asyncio.to_thread(
            prepare_submission, cube, components, snr, noise, inverse, bad_bands, ignore_value, noise_window, backend
        )
        if statistics_from is not None:
            params = dataclasses.replace(params, statistics_from=str(statistics_from))
        if ortho:
            params = dataclasses.replace(params, ortho=True)
        for attempt in range(_ATTEMPTS):
            upload = await asyncio.to_thread(build_upload, prepared, params)  # hashes the digest off the loop
            with upload.files:
                try:
                    response = await self._submit(upload)
                    break
                except _Disconnected:
                    if attempt + 1 == _ATTEMPTS:
                        raise
        return AsyncJob(self, response.json(), prepared.source)

    async def _submit(self, upload: Upload) -> httpx.Response:
        probe = _digest_probe(upload.kwargs)
        if probe is not None:
            response = await self._request("POST", "/v1/jobs", expect=_SUBMIT_OK + (409,), **probe)
            if response.status_code != 409:
                return response
            _raise_unless_body_needed(response)
        kwargs = dict(upload.kwargs)
        content = kwargs.get("content")
        if content is not None and not isinstance(content, (bytes, bytearray)):
            kwargs["content"] = _async_chunks(content)  # httpx.AsyncClient streams async iterables only
        return await self._request("POST", "/v1/jobs", expect=_SUBMIT_OK, upload=True, **kwargs)

    async def job(self, job_id: str) -> "AsyncJob":
        """The job ``job_id`` as the server knows it now (:class:`~hypermnf.APIError` 404 if there is none)."""
        return AsyncJob(self, await self._get_json(f"/v1/jobs/{_segment(job_id)}"))

    async def jobs(self, status: Optional[str] = None, limit: Optional[int] = None) -> List["AsyncJob"]:
        """The jobs this client can see, newest first (see :meth:`hypermnf.Client.jobs`)."""
        out: List[AsyncJob] = []
        after: Optional[str] = None
        while limit is None or len(out) < limit:
            documents, after = _page(await self._get_json("/v1/jobs", params=_page_query(status, limit, len(out), after)))
            out.extend(AsyncJob(self, d) for d in documents)
            if not documents or after is None:
                break
        return out[:limit] if limit is not None else out

    async def reduce(
        self,
        cube: CubeLike,
        components: Optional[int] = DEFAULT_COMPONENTS,
        *,
        product: str = "components",
        timeout: Optional[float] = None,
        progress: bool = True,
        full: bool = False,
        **params: Any,
    ) -> Union[np.ndarray, Reduction]:
        """Submits ``cube``, waits for the job and returns its result (see :meth:`hypermnf.Client.reduce`)."""
        _check_product(product)
        if product == "denoised":
            params["inverse"] = True
        job = await self.submit(cube, components=components, **params)
        await job.wait(timeout=timeout, progress=progress)
        array = await job.result(product=product)
        if not full:
            return array
        return Reduction.from_metadata(await job.metadata(), array, product, job.id)

    # -- service ---------------------------------------------------------------------------------------

    # -- batches (see hypermnf.Client.batch) -----------------------------------------------------------

    async def batch(self, cubes: Sequence[CubeRef], statistics: str = "each", **params: Any) -> "AsyncBatch":
        """Submits several cubes as one batch (see :meth:`hypermnf.Client.batch`) and returns it."""
        body = batch_request(cubes, statistics, params)
        return AsyncBatch(self, (await self._request("POST", "/v1/batches", expect=(201,), json=body)).json())

    async def batches(self, limit: Optional[int] = None) -> List["AsyncBatch"]:
        """The batches this client can see, newest first."""
        out: List[AsyncBatch] = []
        after: Optional[str] = None
        while limit is None or len(out) < limit:
            documents, after = batch_list(await self._get_json("/v1/batches", params=list_query(limit, len(out), after)))
            out.extend(AsyncBatch(self, d) for d in documents)
            if after is None:
                break
        return out[:limit] if limit is not None else out

    async def fit(self, cubes: Sequence[CubeRef], *, timeout: Optional[float] = None, progress: bool = False, **params: Any) -> Any:
        """A pooled batch, waited for, and its eigen system (see :meth:`hypermnf.Client.fit`)."""
        batch = await self.batch(cubes, statistics="pooled", **params)
        await batch.wait(timeout=timeout, progress=progress)
        return await batch.system()

    async def info(self) -> Dict[str, Any]:
        """The server's version, backends and devices (``GET /v1/info``)."""
        return await self._get_json("/v1/info")

    async def health(self) -> bool:
        """True when the server answers ``GET /healthz``; raises :class:`~hypermnf.ConnectionError` otherwise."""
        return (await self._request("GET", "/healthz", expect=(200,))).status_code == 200

    # -- transport -------------------------------------------------------------------------------------

    async def _get_json(self, path: str, **kwargs: Any) -> Any:
        return (await self._request("GET", path, expect=(200,), **kwargs)).json()

    async def _request(
        self, method: str, path: str, *, expect: Iterable[int] = (200,), upload: bool = False, **kwargs: Any
    ) -> httpx.Response:
        attempts = _ATTEMPTS if method == "GET" else 1
        for attempt in range(attempts):
            try:
                return await self._send(method, path, expect, upload, kwargs)
            except _Disconnected:
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    async def _send(self, method: str, path: str, expect: Iterable[int], upload: bool, kwargs: Dict[str, Any]) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            reason = _reason(e)
            if upload:
                reason += " (the server closed the connection during the upload; it may exceed the server's size limit)"
            raise _Disconnected(self.url, reason) from None
        except httpx.TimeoutException as e:
            raise TimeoutError(
                f"hypermnf at {self.url} did not answer {method} {path} within {self.timeout} s ({type(e).__name__})"
            ) from None
        except httpx.TransportError as e:
            raise ConnectionError(self.url, _reason(e)) from None
        if response.status_code not in tuple(expect):
            raise _api_error(response)
        return response

    async def _stream(self, path: str, params: Dict[str, Any]) -> httpx.Response:
        """Opens a streamed GET (caller closes it with ``aclose``), sent once more if it met a closed connection."""
        for attempt in range(_ATTEMPTS):
            try:
                response = await self._http.send(self._http.build_request("GET", path, params=params), stream=True)
                break
            except httpx.TimeoutException:
                raise TimeoutError(f"hypermnf at {self.url} did not answer GET {path} within {self.timeout} s") from None
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                if attempt + 1 == _ATTEMPTS:
                    raise ConnectionError(self.url, _reason(e)) from None
            except httpx.TransportError as e:
                raise ConnectionError(self.url, _reason(e)) from None
        if response.status_code != 200:
            await response.aread()
            await response.aclose()
            raise _api_error(response)
        return response


class AsyncJob(_JobState):
    """One job on the service, for asyncio code. Made by :class:`AsyncClient`'s ``submit``, ``job`` and ``jobs``."""

    _client: AsyncClient

    async def refresh(self, wait: Optional[float] = None) -> Dict[str, Any]:
        """Fetches the job document again (a long poll of up to ``wait`` seconds, at most 50)."""
        params = None if not wait or wait <= 0 else {"wait": f"{min(wait, MAX_WAIT_S):.3f}"}
        self.document = await self._client._get_json(self._path(), params=params)
        return self.document

    async def status(self) -> str:
        """The job's status now: ``queued``, ``running``, ``succeeded``, ``failed`` or ``canceled``."""
        return str((await self.refresh())["status"])

    async def wait(self, timeout: Optional[float] = None, progress: bool = True) -> "AsyncJob":
        """Waits until the job has finished (see :meth:`hypermnf.Job.wait`); returns the job when it succeeded."""
        waiter = _Waiter(self, timeout, progress, self._client.timeout)
        try:
            while True:
                pause = waiter.seen(await self.refresh(wait=waiter.ask()))
                if pause is None:
                    return self
                if pause > 0:
                    await asyncio.sleep(pause)
        finally:
            waiter.close()

    async def wait_result(self, product: str = "components", timeout: Optional[float] = None, progress: bool = False) -> np.ndarray:
        """:meth:`wait`, then :meth:`result`."""
        await self.wait(timeout=timeout, progress=progress)
        return await self.result(product=product)

    async def cancel(self) -> None:
        """Cancels the job if it is queued or running; on a finished job, deletes it and its files."""
        await self._client._request("DELETE", self._path(), expect=(200, 202, 204))

    async def delete(self) -> None:
        """Deletes a finished job and its result files (cancels it first if it is still running)."""
        await self.cancel()

    async def result(self, product: str = "components") -> np.ndarray:
        """The result as a NumPy array, read straight into one array as it streams (see :meth:`hypermnf.Job.result`)."""
        response = await self._client._stream(self._path("/result"), _result_query(product, "npy"))
        expected = _content_length(response)
        reader = NpyReader(expected)
        received = 0
        of = "" if expected is None else f" of {expected}"
        try:
            async for chunk in response.aiter_bytes():
                received += len(chunk)
                reader.feed(chunk)
            return reader.finish()
        except ShortBody as e:
            raise ConnectionError(self._client.url, f"the result was cut off: {e}") from None
        except httpx.TimeoutException:
            raise TimeoutError(
                f"hypermnf at {self._client.url} sent {received}{of} bytes of the result, then nothing for {self._client.timeout} s"
            ) from None
        except httpx.TransportError as e:
            raise ConnectionError(self._client.url, f"the result was cut off after {received}{of} bytes ({_reason(e)})") from None
        finally:
            await response.aclose()

    async def download(self, path: Union[str, "os.PathLike[str]"], product: str = "components", format: str = "npy") -> Path:
        """Streams the result to ``path`` (``format="npy"`` or ``"envi"``, a zip) and returns the path."""
        query = _result_query(product, format)
        target = Path(os.fspath(path))
        response = await self._client._stream(self._path("/result"), query)
        try:
            with open(target, "wb") as out:
                async for block in response.aiter_bytes(1 << 20):
                    out.write(block)
        finally:
            await response.aclose()
        return target

    async def metadata(self) -> Dict[str, Any]:
        """The result's metadata (see :attr:`hypermnf.Job.metadata`); fetched once, then kept."""
        if self._metadata is None:
            self._adopt_metadata(await self._client._get_json(self._path("/metadata")))
        assert self._metadata is not None
        return self._metadata

    def _known_metadata(self) -> Dict[str, Any]:
        if self._metadata is None:
            raise RuntimeError("the metadata has not been fetched: `await job.metadata()` first")
        return self._metadata

    async def preview(self, component: int = 0) -> bytes:
        """A quicklook PNG of one component (see :meth:`hypermnf.Job.preview`)."""
        response = await self._client._request("GET", self._path("/preview"), expect=(200,), params=preview_query(component))
        return response.content


async def _async_chunks(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterator of body chunks (an array's memory, a file read) as the async iterable httpx wants."""
    for chunk in chunks:
        yield chunk
        await asyncio.sleep(0)  # let other tasks run between chunks


class AsyncBatch(_BatchState):
    """One batch on the service, for asyncio code (see :class:`hypermnf.Batch`)."""

    _client: AsyncClient

    @property
    def jobs(self) -> List[AsyncJob]:
        """The member jobs, in the order the cubes were given."""
        return [AsyncJob(self._client, dict(d)) for d in self._member_documents()]

    async def refresh(self) -> Dict[str, Any]:
        self.document = await self._client._get_json(self._path())
        return self.document

    async def wait(self, timeout: Optional[float] = None, progress: bool = True) -> "AsyncBatch":
        """Waits until every member has finished (see :meth:`hypermnf.Batch.wait`)."""
        waiter = _BatchWaiter(self, timeout, progress)
        try:
            while True:
                pause = waiter.seen(await self.refresh())
                if pause is None:
                    return self
                await asyncio.sleep(pause)
        finally:
            waiter.close()

    async def delete(self) -> None:
        """Cancels what still runs and deletes the batch, its jobs and their files."""
        await self._client._request("DELETE", self._path(), expect=(204,))

    async def results(self, product: str = "components") -> List[np.ndarray]:
        """Each member's result, in the order the cubes were given."""
        return list(await asyncio.gather(*(job.result(product=product) for job in self.jobs)))

    async def components(self) -> List[np.ndarray]:
        return await self.results("components")

    async def system(self) -> Any:
        """A pooled batch's eigen system (see :meth:`hypermnf.Batch.system`)."""
        return _system(await self._client._get_json(self._path("/system")))
