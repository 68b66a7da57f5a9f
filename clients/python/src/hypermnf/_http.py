"""What the blocking and the asyncio client, and their jobs, share of the HTTP exchange with the
service: the client's settings, job paths, pages of the job list, how often a request is retried, and
how transport failures and error answers become this package's exceptions."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import httpx

from ._version import __version__
from .errors import APIError, ConnectionError

DEFAULT_URL = "http://127.0.0.1:8080"
# The largest page the service serves (GET /v1/jobs?limit=1..1000).
_MAX_PAGE = 1000

# Statuses the service answers for a created (202) or already existing identical (200) job.
_SUBMIT_OK = (200, 201, 202)


class _Disconnected(ConnectionError):
    """The server closed the connection without answering (typically a stale pooled connection)."""


# How often a request that met a closed connection is sent (the first time included).
_ATTEMPTS = 2


def _segment(job_id: str) -> str:
    """A job id as one path segment (refuses ids that would change the path)."""
    if not isinstance(job_id, str) or not job_id or "/" in job_id or job_id in (".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


def _page(page: Any) -> "tuple[list, Optional[str]]":
    """The job documents of one page of ``GET /v1/jobs`` and the cursor of the next page, if any."""
    if isinstance(page, list):
        return page, None
    documents = page.get("jobs")
    if documents is None:
        documents = page.get("items", [])
    cursor = page.get("next_after") or page.get("next")
    return list(documents), cursor if isinstance(cursor, str) and cursor else None


def _page_query(status: Optional[str], limit: Optional[int], have: int, after: Optional[str]) -> Dict[str, Any]:
    """The query of the next page of ``GET /v1/jobs``: jobs in ``status``, the ``limit - have`` still
    wanted (at most a page), after the cursor ``after``."""
    query: Dict[str, Any] = {}
    if status is not None:
        query["status"] = status
    if limit is not None:
        query["limit"] = min(limit - have, _MAX_PAGE)
    if after is not None:
        query["after"] = after
    return query


def _digest_probe(kwargs: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """An upload's request (``kwargs``) without its body, when it names its cube by ``X-Cube-Digest``:
    the server answers at once when it has the job or the cube, else 409 ``body_needed``."""
    headers = kwargs.get("headers", {})
    if "X-Cube-Digest" not in headers:
        return None
    return {**kwargs, "content": b"", "headers": {**headers, "Content-Length": "0"}}


def _raise_unless_body_needed(response: httpx.Response) -> None:
    """A digest probe's 409: the body goes when the server says ``body_needed``; any other refusal is
    raised."""
    refusal = _api_error(response)
    if refusal.code != "body_needed":
        raise refusal


def _reason(error: Exception) -> str:
    text = str(error).strip()
    return text or type(error).__name__


def _api_error(response: httpx.Response) -> APIError:
    """The server's ``{"code", "message"}`` as an :class:`APIError`; a stand-in when the body is not one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return APIError(response.status_code, body["code"], str(body.get("message", "")))
    text = response.text.strip()
    if len(text) > 300:
        text = text[:300] + "..."
    return APIError(response.status_code, f"http_{response.status_code}", text or response.reason_phrase)


def _settings(url: Optional[str], api_key: Optional[str]) -> "tuple[str, Dict[str, str]]":
    """The base URL and the default headers of a client (``$HYPERMNF_URL``, ``$HYPERMNF_API_KEY``)."""
    base = (url or os.environ.get("HYPERMNF_URL") or DEFAULT_URL).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {base!r}")
    if api_key is None:
        api_key = os.environ.get("HYPERMNF_API_KEY") or None
    headers = {"User-Agent": f"hypermnf-python/{__version__}", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return base, headers
