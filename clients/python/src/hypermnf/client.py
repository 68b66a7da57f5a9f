"""The connection to a hypermnf service: submitting cubes, finding jobs, one-call reduction."""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import httpx
import numpy as np

from . import _tus, systems
from ._http import DEFAULT_URL  # noqa: F401  (hypermnf.client.DEFAULT_URL, as before)
from ._http import (
    _ATTEMPTS,
    _SUBMIT_OK,
    _api_error,
    _digest_probe,
    _Disconnected,
    _page,
    _page_query,
    _raise_unless_body_needed,
    _reason,
    _segment,
    _settings,
)
from ._inputs import CubeLike, Prepared, Upload, _EnviPair, build_upload, envi_data_file, merged_params, prepare
from ._npy import as_cube, canonical_header, cube_digest, npy_header
from ._params import DEFAULT_COMPONENTS, Params
from .batches import Batch, CubeRef, batch_list, batch_request, list_query
from .errors import ConnectionError, TimeoutError
from .job import PRODUCTS, Job
from .results import Reduction

class Client:
    """A client of one hypermnf service.

    Args:
        url: the service's base URL. Default: ``$HYPERMNF_URL``, else ``http://127.0.0.1:8080``.
        api_key: sent as ``Authorization: Bearer <key>``; needed when the server runs with
            ``--api-keys-file``. Default: ``$HYPERMNF_API_KEY`` if set.
        timeout: seconds to wait for the connection, and for each read or write on it (not for the whole
            request, so large uploads are not cut off). ``None`` waits for ever.
        tus_threshold: cubes of at least this many bytes (256 MiB by default) are sent as a resumable
            upload (tus 1.0, ``/v1/uploads``): in pieces, with a progress bar, resumed from where the
            server's copy ends after a dropped connection. ``None`` sends every cube in one request.
        tus_retries: how many failed attempts in a row a resumable upload survives (with backoff from
            0.5 s doubling up to 30 s) before it raises :class:`ConnectionError`.

    The client keeps one HTTP connection pool; use it as a context manager or call :meth:`close`.

    Example::

        with hypermnf.Client("http://gpu-node:8080", api_key="...") as client:
            components = client.reduce(cube, components=10)
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        tus_threshold: Optional[int] = _tus.DEFAULT_THRESHOLD,
        tus_retries: int = _tus.DEFAULT_RETRIES,
    ) -> None:
        self.url, headers = _settings(url, api_key)
        self.timeout = timeout
        self.tus_threshold = tus_threshold
        self.tus_retries = tus_retries
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout))
        # The last resumable upload's uploader (how often it resumed: tests and curious callers).
        self.last_upload: Optional[_tus.Uploader] = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"hypermnf.Client({self.url!r})"

    # -- jobs ------------------------------------------------------------------------------------------

    def submit(
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
        progress: bool = True,
        statistics_from: Optional[str] = None,
        ortho: bool = False,
    ) -> Job:
        """Creates a job that reduces ``cube``, and returns it without waiting.

        Args:
            cube: a NumPy array shaped (lines, samples, bands) of integers or floats, sent as ``.npy`` (streamed
                from the array's memory); an ``xarray.DataArray`` with a band dimension (``band``, ``bands``,
                ``wavelength``, ...), sent as that array transposed to (lines, samples, bands); a Spectral
                Python image (``spectral.open_image(...)``), sent from its memory map with its header's
                ``data ignore value`` and ``bbl``; a path to an ENVI ``.hdr`` or to its data file
                (``scene.img``; uploaded as the pair, streamed from disk) or to a ``.npy`` file; or a
                ``"file://..."`` href naming a cube on the server's disk (under one of its ``--input-root``
                directories).
            components: number of components to keep (default 10). Left at its default, it is not sent
                when ``snr`` is given.
            noise: ``"mean-filter"`` (default) or ``"shift-difference"``.
            snr: keep the components whose eigenvalue is at least ``1 + snr`` (instead of ``components``).
            inverse: also compute the denoised cube (``job.result(product="denoised")``).
            bad_bands: 0-based bands to leave out (besides the header's ``bbl`` and constant bands).
            ignore_value: no-data value (overrides the header's ``data ignore value``); ``float("nan")`` makes
                NaN the no-data value (sent as ``nan``).
            noise_window: ``(x0, y0, x1, y1)``: estimate the noise in columns x0..x1, rows y0..y1 only
                (ends excluded).
            backend: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda-cublas"`` (default: the server's choice).
            progress: show a progress bar while a resumable upload (a cube of at least ``tus_threshold``
                bytes) is sent.
            statistics_from: project with the eigen system of this job or imported system (an id) instead of
                computing one (see :meth:`apply`).
            ortho: an EMIT NetCDF granule only (by ``"file://..."`` href): its GeoTIFF result
                (``job.download(..., format="cog")``) on the granule's north-up grid, its geometry lookup
                table applied; the ``.npy`` and ENVI downloads are refused then (the server answers 422).

        Returns:
            The :class:`Job`. An identical earlier request (same cube and parameters) returns that job,
            with ``job.cached`` true.

        Raises:
            APIError: the server refused the request (bad parameters, cube too large, bad format, ...).
            ConnectionError: the server could not be reached.
        """
        prepared, params = prepare_submission(cube, components, snr, noise, inverse, bad_bands, ignore_value, noise_window, backend)
        if statistics_from is not None:
            params = dataclasses.replace(params, statistics_from=str(statistics_from))
        if ortho:
            params = dataclasses.replace(params, ortho=True)
        with ExitStack() as stack:
            resumable = self._resumable(prepared, stack)
            if resumable is not None:
                return self._submit_resumable(resumable, prepared, params, progress)
        # Submitting is idempotent (an identical request answers the same job), so a request that met a
        # pooled connection the server had just closed is sent once more, with a fresh body.
        for attempt in range(_ATTEMPTS):
            upload = build_upload(prepared, params)
            with upload.files:
                try:
                    response = self._submit(upload)
                    break
                except _Disconnected:
                    if attempt + 1 == _ATTEMPTS:
                        raise
        return Job(self, response.json(), prepared.source)

    def _resumable(self, prepared: Prepared, stack: ExitStack) -> Optional["_Resumable"]:
        """The cube as the sources of a resumable upload when it is at least ``tus_threshold`` bytes (the
        ``.npy`` of an array, a ``.npy`` file, or an ENVI data file with its header), else None."""
        if self.tus_threshold is None:
            return None
        cube = prepared.cube
        if isinstance(cube, np.ndarray):
            array = as_cube(cube)
            raw = memoryview(array).cast("B")
            # As _npy.npy_stream sends it: a big-endian array as it is held (with no digest to ask by),
            # any other as the server's canonical .npy, asked for by its content digest first.
            big_endian = array.dtype.str[0] == ">"
            header = npy_header(array) if big_endian else canonical_header(array.dtype.newbyteorder("<").str, array.shape)
            if len(header) + raw.nbytes < self.tus_threshold:
                return None
            digest = None if big_endian else cube_digest(header, raw)
            return _Resumable(_tus.MemorySource(header, raw), None, digest, array)
        if isinstance(cube, _EnviPair) or (isinstance(cube, (str, os.PathLike)) and "://" not in str(cube)):
            if isinstance(cube, _EnviPair):
                header_path: Optional[Path] = cube.header
                data = cube.data
            else:
                path = Path(os.fspath(cube))
                suffix = path.suffix.lower()
                if not path.is_file() or suffix not in (".hdr", ".npy"):
                    return None  # build_upload says what is wrong
                header_path = path if suffix == ".hdr" else None
                data = envi_data_file(path) if header_path is not None else path
            if data.stat().st_size < self.tus_threshold:
                return None
            source = stack.enter_context(closing(_tus.FileSource(data)))
            header = stack.enter_context(closing(_tus.FileSource(header_path))) if header_path is not None else None
            return _Resumable(source, header, None, None)
        return None

    def _submit_resumable(self, resumable: "_Resumable", prepared: Prepared, params: Any, progress: bool) -> Job:
        """Asks for an existing job by the array's digest (as :meth:`_submit` does), else uploads the cube
        resumably and makes the job from the upload."""
        if resumable.digest is not None:
            probe = self._request(
                "POST", "/v1/jobs", expect=_SUBMIT_OK + (409,), params=params.to_query(), content=b"",
                headers={"Content-Type": "application/x-npy", "X-Cube-Digest": resumable.digest, "Content-Length": "0"},
            )
            if probe.status_code != 409:
                return Job(self, probe.json(), prepared.source)
            _raise_unless_body_needed(probe)
        uploader = _tus.Uploader(self._http, _api_error, retries=self.tus_retries, progress=progress)
        self.last_upload = uploader
        filetype = "application/x-npy" if resumable.header is None else "application/octet-stream"
        body: Dict[str, Any] = {"upload": uploader.upload(resumable.data, filetype), "params": params.to_json()}
        if resumable.header is not None:
            quiet = _tus.Uploader(self._http, _api_error, retries=self.tus_retries, progress=False)
            body["header_upload"] = quiet.upload(resumable.header, "text/plain")
        response = self._request("POST", "/v1/jobs", expect=_SUBMIT_OK, json=body)
        return Job(self, response.json(), prepared.source)

    def _submit(self, upload: Upload) -> httpx.Response:
        """POSTs ``upload``. An array named by its digest is first asked for without its body: the server
        answers at once (200) when it has a job of the same cube and parameters, or (201) when it ran the
        job on the cube it still holds on a GPU; otherwise it says 409 ``body_needed``, and the body goes.
        """
        probe = _digest_probe(upload.kwargs)
        if probe is not None:
            response = self._request("POST", "/v1/jobs", expect=_SUBMIT_OK + (409,), **probe)
            if response.status_code != 409:
                return response
            _raise_unless_body_needed(response)
        return self._request("POST", "/v1/jobs", expect=_SUBMIT_OK, upload=True, **upload.kwargs)

    def job(self, job_id: str) -> Job:
        """The job ``job_id`` as the server knows it now (:class:`APIError` 404 if there is none)."""
        return Job(self, self._get_json(f"/v1/jobs/{_segment(job_id)}"))

    def jobs(self, status: Optional[str] = None, limit: Optional[int] = None) -> List[Job]:
        """The jobs this client can see, newest first, following the server's pages.

        Args:
            status: only jobs in this status (``queued``, ``running``, ``succeeded``, ``failed``, ``canceled``).
            limit: at most this many jobs (default: all of them).
        """
        out: List[Job] = []
        after: Optional[str] = None
        while limit is None or len(out) < limit:
            page = self._get_json("/v1/jobs", params=_page_query(status, limit, len(out), after))
            documents, after = _page(page)
            out.extend(Job(self, d) for d in documents)
            if not documents or after is None:
                break
        return out[:limit] if limit is not None else out

    def reduce(
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
        """Submits ``cube``, waits for the job and returns its result, in one call.

        ``params`` are those of :meth:`submit` (``noise``, ``snr``, ``inverse``, ...); ``product="denoised"``
        returns the denoised cube (and implies ``inverse=True``). ``timeout`` bounds the wait, in seconds.

        Returns:
            The array (``full=False``, the default); with ``full=True``, a :class:`~hypermnf.Reduction`: the
            array with its eigenvalues, SNR, bands used, the wavelengths of those bands and the whole metadata.

        Raises:
            JobFailed, JobCanceled, TimeoutError, APIError, ConnectionError.
        """
        _check_product(product)
        if product == "denoised":
            params["inverse"] = True
        job = self.submit(cube, components=components, progress=progress, **params)
        job.wait(timeout=timeout, progress=progress)
        array = job.result(product=product)
        if not full:
            return array
        return Reduction.from_metadata(job.metadata, array, product, job.id)

    # -- eigen systems (hypermnf.systems) --------------------------------------------------------------

    def system(self, job_id: str) -> "systems.System":
        """The eigen system job ``job_id`` projected with (``GET /v1/jobs/{id}/system``)."""
        return systems.job_system(self, job_id)

    def get_system(self, system_id: str) -> "systems.System":
        """An imported system (``GET /v1/systems/{id}``)."""
        return systems.get_system(self, system_id)

    def import_system(self, system: Any) -> "systems.System":
        """Imports a :class:`~hypermnf.System` (or a system file's path): the system as stored, with its id."""
        return systems.import_system(self, system)

    def delete_system(self, system_id: str) -> None:
        systems.delete_system(self, system_id)

    def systems(self) -> List[Dict[str, Any]]:
        """Summaries of the imported systems this client can see, newest first."""
        return systems.list_systems(self)

    def apply(self, system: Any, cubes: Iterable[CubeLike], **params: Any) -> List[Job]:
        """One job per cube, each projected with ``system`` (a :class:`~hypermnf.System`, or a job or
        system id) through ``statistics_from``; ``params`` are those of :meth:`submit`. Returns the jobs
        without waiting."""
        return systems.apply(self, system, cubes, **params)
    # -- batches ---------------------------------------------------------------------------------------

    def batch(self, cubes: Sequence[CubeRef], statistics: str = "each", **params: Any) -> Batch:
        """Submits several cubes together as one batch (``POST /v1/batches``) and returns it without waiting.

        Args:
            cubes: hrefs the server reads (``"file://..."`` under one of its ``--input-root`` directories,
                ``"s3://..."``, ``"https://..."``), or paths (``pathlib.Path``), sent as ``file://`` URLs.
            statistics: ``"each"`` (default): independent jobs; ``"pooled"``: one eigen system from all the
                cubes' statistics, every cube projected with it (the cubes must have the same bands).
            params: those of :meth:`submit` (``components``, ``noise``, ``snr``, ``inverse``, ...), for every cube.

        Raises:
            APIError: the server refused the batch (``batch_mismatch``, ``invalid_params``, ``forbidden_path``,
                ``input_not_found``, ...; the message names the input); nothing was created.
        """
        body = batch_request(cubes, statistics, params)
        return Batch(self, self._request("POST", "/v1/batches", expect=(201,), json=body).json())

    def batches(self, limit: Optional[int] = None) -> List[Batch]:
        """The batches this client can see, newest first, following the server's pages."""
        out: List[Batch] = []
        after: Optional[str] = None
        while limit is None or len(out) < limit:
            documents, after = batch_list(self._get_json("/v1/batches", params=list_query(limit, len(out), after)))
            out.extend(Batch(self, d) for d in documents)
            if after is None:
                break
        return out[:limit] if limit is not None else out

    def fit(self, cubes: Sequence[CubeRef], *, timeout: Optional[float] = None, progress: bool = True, **params: Any) -> Any:
        """One eigen system from several cubes: a pooled :meth:`batch`, waited for, and its system
        (a :class:`hypermnf.System`; :meth:`hypermnf.System.save` writes it for ``hypermnf run --system``).

        Raises:
            JobFailed, JobCanceled, TimeoutError, APIError, ConnectionError.
        """
        return self.batch(cubes, statistics="pooled", **params).wait(timeout=timeout, progress=progress).system()

    # -- service ---------------------------------------------------------------------------------------

    def info(self) -> Dict[str, Any]:
        """The server's version, backends and devices (``GET /v1/info``)."""
        return self._get_json("/v1/info")

    def health(self) -> bool:
        """True when the server process answers ``GET /healthz``; raises :class:`ConnectionError` otherwise."""
        return self._request("GET", "/healthz", expect=(200,)).status_code == 200

    # -- transport -------------------------------------------------------------------------------------

    def _get_json(self, path: str, **kwargs: Any) -> Any:
        return self._request("GET", path, expect=(200,), **kwargs).json()

    def _request(
        self, method: str, path: str, *, expect: Iterable[int] = (200,), upload: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Sends one request; maps transport failures and error answers to this package's exceptions.

        A GET that finds its pooled connection closed by the server is sent once more: safe, and the usual
        cure for a keep-alive connection the server dropped while it sat in the pool.
        """
        attempts = _ATTEMPTS if method == "GET" else 1
        for attempt in range(attempts):
            try:
                return self._send(method, path, expect, upload, kwargs)
            except _Disconnected:
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, expect: Iterable[int], upload: bool, kwargs: Dict[str, Any]) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            # The connection was closed under the request: a pooled connection the server had dropped, or
            # (for an upload) a server that answered early (413, 4xx) and stopped reading, an answer that
            # HTTP/1.1 gives the client no way to read while it is still writing.
            reason = _reason(e)
            if upload:
                reason += " (the server closed the connection during the upload; it may exceed the server's size limit)"
            raise _Disconnected(self.url, reason) from None
        except httpx.TimeoutException as e:
            raise TimeoutError(
                f"hypermnf at {self.url} did not answer {method} {path} within {self.timeout} s ({type(e).__name__})"
            ) from None
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as e:
            raise ConnectionError(self.url, _reason(e)) from None
        except httpx.TransportError as e:
            raise ConnectionError(self.url, _reason(e)) from None
        if response.status_code not in tuple(expect):
            raise _api_error(response)
        return response

    def _stream(self, path: str, params: Dict[str, Any]) -> Any:
        """Opens a streamed GET (caller closes it); errors mapped like :meth:`_request`."""
        try:
            response = self._http.send(self._http.build_request("GET", path, params=params), stream=True)
        except httpx.TimeoutException:
            raise TimeoutError(f"hypermnf at {self.url} did not answer GET {path} within {self.timeout} s") from None
        except httpx.TransportError as e:
            raise ConnectionError(self.url, _reason(e)) from None
        if response.status_code != 200:
            response.read()
            response.close()
            raise _api_error(response)
        return response


def prepare_submission(
    cube: CubeLike,
    components: Optional[int],
    snr: Optional[float],
    noise: Optional[str],
    inverse: bool,
    bad_bands: Optional[Sequence[int]],
    ignore_value: Optional[float],
    noise_window: Optional[Sequence[int]],
    backend: Optional[str],
) -> "tuple[Prepared, Params]":
    """The cube as it will be sent, and the parameters (with a Spectral Python header's no-data value and
    bad bands where the caller gave none)."""
    prepared = prepare(cube)
    ignore_value, bad_bands = merged_params(prepared, ignore_value, bad_bands)
    params = Params.build(components, snr, noise, inverse, bad_bands, ignore_value, noise_window, backend)
    return prepared, params


def _check_product(product: str) -> None:
    if product not in PRODUCTS:
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")


class _Resumable:
    """A cube to send resumably: the data (the ``.npy``, or the ENVI data file), the ENVI header if any,
    the array's content digest to ask with first, and the array (kept alive while its memory is sent)."""

    def __init__(self, data: _tus.Source, header: Optional[_tus.Source], digest: Optional[str], array: Any) -> None:
        self.data, self.header, self.digest, self.array = data, header, digest, array
