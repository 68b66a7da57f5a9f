"""Batches: several cubes, given by reference, submitted together (``/v1/batches``).

With ``statistics="pooled"`` the service computes one eigen system from all the cubes' statistics and
projects every cube with it (a campaign of flight lines in one MNF space); with ``"each"`` every cube is
an independent job. Each cube is an ordinary job (:class:`~hypermnf.Job`), listed by ``client.jobs()``.

    >>> batch = client.batch(["s3://bucket/line1.hdr", Path("/data/line2.hdr")], statistics="pooled", components=10)
    >>> batch.wait()                           # one progress bar over the whole batch
    >>> [c.shape for c in batch.components()]  # one array per cube, in the order given
    >>> system = client.fit(cubes)             # a pooled batch, waited for: its eigen system
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Union

from ._http import _segment
from ._params import DEFAULT_COMPONENTS, Params
from .errors import JobCanceled, JobFailed, TimeoutError
from .job import _BAR_FORMAT, FIRST_POLL_S, MAX_POLL_S, POLL_GROWTH, TERMINAL, Job, _progress_bar

STATISTICS = ("each", "pooled")
# A cube of a batch: an href the server reads (``file://``, ``s3://``, ``https://``) or a local path.
CubeRef = Union[str, "os.PathLike[str]"]


def cube_href(cube: CubeRef) -> str:
    """The href the server is given for ``cube``: a string with a scheme as it is; a path (a
    ``pathlib.Path``, or a string without ``://``) as the ``file://`` URL of its absolute form, which the
    server reads under one of its ``--input-root`` directories (so the path is the server's too)."""
    if isinstance(cube, str) and "://" in cube:
        return cube
    if isinstance(cube, (str, os.PathLike)):
        return Path(os.fspath(cube)).absolute().as_uri()
    raise TypeError(f"a batch's cubes are hrefs (str) or paths, got {type(cube).__name__}")


def batch_request(cubes: Iterable[CubeRef], statistics: str, params: Dict[str, Any]) -> Dict[str, Any]:
    """The ``POST /v1/batches`` body. ``params`` are :meth:`Client.submit`'s keyword arguments."""
    if statistics not in STATISTICS:
        raise ValueError(f"statistics must be one of {STATISTICS}, got {statistics!r}")
    if isinstance(cubes, (str, os.PathLike)):
        raise TypeError("cubes must be a list of hrefs or paths, not a single one")
    inputs = [{"href": cube_href(c)} for c in cubes]
    unknown = set(params) - set(_PARAM_NAMES)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}; the parameters are {', '.join(_PARAM_NAMES)}")
    values = {**_PARAM_DEFAULTS, **params}
    built = Params.build(*(values[name] for name in _PARAM_NAMES))
    return {"inputs": inputs, "statistics": statistics, "params": built.to_json()}


# Params.build's arguments, in its order, with submit()'s defaults.
_PARAM_NAMES = ("components", "snr", "noise", "inverse", "bad_bands", "ignore_value", "noise_window", "backend", "statistics_from")
_PARAM_DEFAULTS: Dict[str, Any] = {
    "components": DEFAULT_COMPONENTS, "snr": None, "noise": "mean-filter", "inverse": False, "bad_bands": None,
    "ignore_value": None, "noise_window": None, "backend": None, "statistics_from": None,
}


class _BatchState:
    """What :class:`Batch` and :class:`~hypermnf.aio.AsyncBatch` share: the batch document as last
    fetched, read through properties."""

    def __init__(self, client: Any, document: Dict[str, Any]) -> None:
        if not isinstance(document, dict) or not isinstance(document.get("id"), str):
            raise ValueError(f"not a batch document: {document!r}")
        self._client = client
        self.document: Dict[str, Any] = document
        self.id: str = document["id"]

    def __repr__(self) -> str:
        return f"<hypermnf.{type(self).__name__} {self.id} {self.statistics} {self.status} {len(self.document.get('jobs', []))} jobs>"

    @property
    def status(self) -> str:
        """``queued``, ``running``, ``succeeded``, ``failed`` or ``canceled``, as last fetched."""
        return str(self.document.get("status", "?"))

    @property
    def statistics(self) -> str:
        """``"pooled"`` (one eigen system for every cube) or ``"each"``."""
        return str(self.document.get("statistics", "each"))

    @property
    def progress(self) -> float:
        """The share of the whole batch's work done, 0..1, as last fetched."""
        return float(self.document.get("progress") or 0.0)

    @property
    def counts(self) -> Dict[str, int]:
        """How many member jobs are in each status, as last fetched."""
        return {k: int(v) for k, v in (self.document.get("counts") or {}).items()}

    @property
    def system_ready(self) -> bool:
        """True once a pooled batch's eigen system is computed."""
        return bool(self.document.get("system_ready"))

    def _member_documents(self) -> List[Dict[str, Any]]:
        return list(self.document.get("jobs") or [])

    def _path(self, suffix: str = "") -> str:
        return f"/v1/batches/{_segment(self.id)}{suffix}"


class _BatchWaiter:
    """The decisions of ``Batch.wait()``: one progress bar over the whole batch (as ``Job.wait`` shows
    one job's), what a document means, and the growing pause between polls."""

    def __init__(self, batch: _BatchState, timeout: Optional[float], progress: bool) -> None:
        self.batch, self.timeout, self.progress = batch, timeout, progress
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.delay = FIRST_POLL_S
        self.bar: Any = None

    def seen(self, document: Dict[str, Any]) -> Optional[float]:
        """``None`` when every member succeeded, else the pause before the next poll. Raises JobFailed
        (the failed member's, or the batch's own error), JobCanceled, or TimeoutError after the deadline."""
        batch = self.batch
        status = document.get("status")
        if status not in TERMINAL and self.progress and self.bar is None:
            self.bar = _progress_bar()(total=100, desc=f"batch {batch.id[:8]}", unit="%", bar_format=_BAR_FORMAT, leave=True)
        if self.bar is not None:
            done = 100.0 if status == "succeeded" else round(100.0 * batch.progress, 1)
            self.bar.n = min(max(done, 0.0), 100.0)
            counts = batch.counts
            self.bar.set_postfix_str(f"{counts.get('succeeded', 0)}/{len(batch._member_documents())} jobs done", refresh=False)
            self.bar.refresh()
        if status == "succeeded":
            return None
        if status == "failed":
            error = document.get("error")
            if error:
                raise JobFailed(batch.id, error.get("code"), error.get("message"))
            member = next((j for j in batch._member_documents() if j.get("status") == "failed"), {})
            error = member.get("error") or {}
            raise JobFailed(str(member.get("id", batch.id)), error.get("code"), error.get("message"))
        if status == "canceled":
            raise JobCanceled(batch.id)
        pause = self.delay
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"batch {batch.id} still {status} ({batch.progress:.0%}) after {self.timeout} s; "
                    "it goes on on the server: wait() again or delete() it"
                )
            pause = min(pause, left)
        self.delay = min(self.delay * POLL_GROWTH, MAX_POLL_S)
        return pause

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Batch(_BatchState):
    """One batch on the service. Made by :meth:`Client.batch` and :meth:`Client.batches`.

    ``document`` is the batch document as last fetched; :meth:`refresh` fetches it again.
    """

    @property
    def jobs(self) -> List[Job]:
        """The member jobs as :class:`~hypermnf.Job` objects, in the order the cubes were given (their
        documents as the batch document last showed them; ``job.refresh()`` fetches a whole one)."""
        return [Job(self._client, dict(d)) for d in self._member_documents()]

    def refresh(self) -> Dict[str, Any]:
        """Fetches the batch document again (``GET /v1/batches/{id}``) and returns it."""
        self.document = self._client._get_json(self._path())
        return self.document

    def wait(self, timeout: Optional[float] = None, progress: bool = True) -> "Batch":
        """Waits until every member job has finished; returns the batch when all succeeded.

        Args:
            timeout: give up after this many seconds (``None``: wait as long as it takes).
            progress: show one progress bar over the whole batch (tqdm, as :meth:`Job.wait`).

        Raises:
            JobFailed: a member failed (its id, code and message), or the batch itself did (a pooled
                batch whose system could not be computed: the batch's id).
            JobCanceled: the batch was canceled.
            TimeoutError: ``timeout`` passed first (the batch goes on on the server).
        """
        waiter = _BatchWaiter(self, timeout, progress)
        try:
            while True:
                pause = waiter.seen(self.refresh())
                if pause is None:
                    return self
                time.sleep(pause)
        finally:
            waiter.close()

    def delete(self) -> None:
        """Cancels what still runs and deletes the batch, its jobs and their files (``DELETE``)."""
        self._client._request("DELETE", self._path(), expect=(204,))

    def results(self, product: str = "components") -> List[Any]:
        """Each member's result (:meth:`Job.result`) as a NumPy array, in the order the cubes were given."""
        return [job.result(product=product) for job in self.jobs]

    def components(self) -> List[Any]:
        """Each member's components, float32 (lines, samples, k), in the order the cubes were given."""
        return self.results("components")

    def metadata(self) -> List[Dict[str, Any]]:
        """Each member's metadata (:attr:`Job.metadata`); a pooled batch's share one eigen system."""
        return [job.metadata for job in self.jobs]

    def system(self) -> Any:
        """A pooled batch's eigen system (``GET /v1/batches/{id}/system``) as a :class:`hypermnf.System`,
        with its pooled statistics in ``system.arrays`` (``pooled_data_mean``, ...)."""
        return _system(self._client._get_json(self._path("/system")))


def _system(document: Dict[str, Any]) -> Any:
    # Imported when used: the System class lives in hypermnf.systems, which this module does not need
    # for anything else.
    from .systems import System  # type: ignore[import-not-found,unused-ignore]

    return System(document)


def batch_list(page: Any) -> "tuple[List[Dict[str, Any]], Optional[str]]":
    """The batch documents of one page of ``GET /v1/batches`` and the ``after`` cursor of the next."""
    documents = list(page.get("batches") or [])
    nxt = page.get("next")
    if not isinstance(nxt, str) or "after=" not in nxt or not documents:
        return documents, None
    return documents, str(documents[-1]["id"])


def list_query(limit: Optional[int], have: int, after: Optional[str]) -> Dict[str, Any]:
    query: Dict[str, Any] = {}
    if limit is not None:
        query["limit"] = min(limit - have, 1000)
    if after is not None:
        query["after"] = after
    return query


__all__ = ["Batch", "batch_request", "cube_href"]
