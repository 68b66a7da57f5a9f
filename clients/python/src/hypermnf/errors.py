"""The exceptions the client raises.

Everything derives from :class:`HyperMNFError`, so ``except HyperMNFError`` catches any failure of the
service or of the connection to it. :class:`ConnectionError` and :class:`TimeoutError` also derive from
the built-in exceptions of the same name, so code that already handles those keeps working.
"""

from __future__ import annotations

import builtins
from typing import Optional


class HyperMNFError(Exception):
    """Base class of every error raised by the hypermnf client."""


class APIError(HyperMNFError):
    """The service answered with an error document ``{"code", "message"}``.

    Attributes:
        status: the HTTP status (400, 401, 404, 409, 413, 415, 422, 503, ...).
        code: the service's stable machine-readable code (e.g. ``"invalid_params"``, ``"not_found"``, ``"not_ready"``).
        message: the service's human-readable message.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"HTTP {status} {code}: {message}")


class ConnectionError(HyperMNFError, builtins.ConnectionError):  # noqa: A001 - deliberate shadowing
    """The service could not be reached (not running, wrong URL, network down)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach hypermnf at {url}: {reason}")


class TimeoutError(HyperMNFError, builtins.TimeoutError):  # noqa: A001 - deliberate shadowing
    """A request, or :meth:`hypermnf.Job.wait`, took longer than its timeout."""


class JobFailed(HyperMNFError):
    """The job ended in status ``failed``; ``code`` and ``message`` are the server's."""

    def __init__(self, job_id: str, code: Optional[str], message: Optional[str]) -> None:
        self.job_id = job_id
        self.code = code or "failed"
        self.message = message or "the job failed without a message"
        super().__init__(f"job {job_id} failed ({self.code}): {self.message}")


class JobCanceled(HyperMNFError):
    """The job was canceled before it produced a result."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was canceled")
