"""Eigen systems: export a job's, import one, and apply one to other cubes (issue 32, "Reuse a system").

A system file is JSON (``"format": "hypermnf-system"``, version 1) whose float64 arrays are base64 ``.npy``
files, so that they travel bit for bit::

    >>> system = client.system(job.id)              # GET /v1/jobs/{id}/system
    >>> system.transform.shape, system.bands_used   # numpy arrays
    >>> system.save("campaign-system.json")         # hypermnf run --system campaign-system.json ...
    >>> jobs = client.apply(system, [cube2, cube3], components=10)   # one job per cube, statistics_from
    >>> imported = client.import_system(hypermnf.System.load("campaign-system.json"))   # POST /v1/systems
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Protocol, Union

import numpy as np

from ._http import _segment

if TYPE_CHECKING:  # pragma: no cover
    import httpx

    from .job import Job


class _Client(Protocol):
    """What these functions use of a :class:`~hypermnf.Client` (described here, so that this module, which
    the client imports, does not import the client)."""

    def _get_json(self, path: str, **kwargs: Any) -> Any: ...

    def _request(self, method: str, path: str, *, expect: Iterable[int] = ..., **kwargs: Any) -> "httpx.Response": ...

    def submit(self, cube: Any, **params: Any) -> "Job": ...

FORMAT = "hypermnf-system"
VERSION = 1
# The arrays every version-1 file has; others (a batch's pooled statistics, say) are kept as they come.
ARRAYS = ("means", "eigenvalues", "transform", "noise_covariance")


def decode_array(member: Dict[str, Any]) -> np.ndarray:
    """The array of one ``{"npy": "<base64>"}`` member (float64, as the file stores it)."""
    return np.load(io.BytesIO(base64.b64decode(member["npy"])), allow_pickle=False)


def encode_array(array: np.ndarray) -> Dict[str, str]:
    """``{"npy": "<base64>"}`` of ``array`` as little-endian float64."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype="<f8"), allow_pickle=False)
    return {"npy": base64.b64encode(buffer.getvalue()).decode("ascii")}


class System:
    """One eigen system file, with its arrays as numpy arrays.

    ``transform`` is ``(u, u)`` float64, rows following ``bands_used`` (the u input bands used), column c
    the weights of component c; components are ``(x[bands_used] - means) @ transform[:, :k]``. ``id`` is
    the service's id of the system (an imported system's, or the job's it was exported from), when known.
    """

    def __init__(self, document: Dict[str, Any]) -> None:
        if document.get("format") != FORMAT:
            raise ValueError(f"not a hypermnf system file (its format is {document.get('format')!r})")
        if document.get("version") != VERSION:
            raise ValueError(f"system file version {document.get('version')!r}; this client reads version {VERSION}")
        missing = [name for name in ARRAYS if name not in document.get("arrays", {})]
        if missing:
            raise ValueError(f"the system file lacks the arrays {missing}")
        self.document = document
        self.arrays: Dict[str, np.ndarray] = {name: decode_array(a) for name, a in document["arrays"].items()}

    # -- the file ----------------------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, data: Union[bytes, str]) -> "System":
        return cls(json.loads(data))

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "System":
        """Reads a system file (from ``system.save``, ``hypermnf run --export-system`` or the service)."""
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())

    def to_json(self) -> Dict[str, Any]:
        """The file's JSON document (the arrays as they came: their bytes are not re-encoded)."""
        return copy.deepcopy(self.document)

    def to_bytes(self) -> bytes:
        return json.dumps(self.document, indent=2).encode()

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the system file, for ``hypermnf run --system`` or :meth:`load`."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())

    # -- what it holds -------------------------------------------------------------------------------------

    @property
    def id(self) -> Optional[str]:
        """The id the service knows it by: the imported system's, or the job's it came from."""
        source = self.document.get("source") or {}
        return source.get("system") or source.get("job")

    @property
    def source(self) -> Dict[str, Any]:
        return dict(self.document.get("source") or {})

    @property
    def bands(self) -> int:
        """The band count B of the cubes it applies to."""
        return int(self.document["input"]["bands"])

    @property
    def wavelengths(self) -> Optional[np.ndarray]:
        w = self.document["input"].get("wavelengths")
        return None if w is None else np.asarray(w, dtype=np.float64)

    @property
    def bands_used(self) -> np.ndarray:
        return np.asarray(self.document["bands_used"], dtype=np.int64)

    @property
    def dropped_bands(self) -> List[Dict[str, Any]]:
        return list(self.document.get("dropped_bands", []))

    @property
    def means(self) -> np.ndarray:
        return self.arrays["means"]

    @property
    def eigenvalues(self) -> np.ndarray:
        return self.arrays["eigenvalues"]

    @property
    def snr(self) -> np.ndarray:
        return self.arrays["eigenvalues"] - 1.0

    @property
    def transform(self) -> np.ndarray:
        return self.arrays["transform"]

    @property
    def noise_covariance(self) -> np.ndarray:
        return self.arrays["noise_covariance"]

    def __repr__(self) -> str:
        return f"hypermnf.System(id={self.id!r}, bands={self.bands}, bands_used={len(self.bands_used)})"


# -- the service's side, called by the Client methods of the same names -----------------------------------


def job_system(client: "_Client", job_id: str) -> System:
    """``GET /v1/jobs/{id}/system``."""
    response = client._request("GET", f"/v1/jobs/{_segment(job_id)}/system", expect=(200,))
    return System.from_bytes(response.content)


def get_system(client: "_Client", system_id: str) -> System:
    """``GET /v1/systems/{id}``."""
    response = client._request("GET", f"/v1/systems/{_segment(system_id)}", expect=(200,))
    return System.from_bytes(response.content)


def import_system(client: "_Client", system: Union[System, str, os.PathLike]) -> System:
    """``POST /v1/systems``: the system as the service stored it (its ``id`` is the new system's)."""
    if not isinstance(system, System):
        system = System.load(system)
    response = client._request(
        "POST", "/v1/systems", expect=(201,), content=system.to_bytes(), headers={"Content-Type": "application/json"}
    )
    return get_system(client, response.json()["id"])


def delete_system(client: "_Client", system_id: str) -> None:
    """``DELETE /v1/systems/{id}``."""
    client._request("DELETE", f"/v1/systems/{_segment(system_id)}", expect=(204,))


def list_systems(client: "_Client") -> List[Dict[str, Any]]:
    """``GET /v1/systems``: summaries of the caller's imported systems, newest first."""
    return list(client._get_json("/v1/systems")["systems"])


def apply(client: "_Client", system: Union[System, str], cubes: Iterable[Any], **params: Any) -> List["Job"]:
    """One job per cube, each projected with ``system`` (its ``statistics_from``): a :class:`System` the
    service knows (one from :meth:`Client.system` or :meth:`Client.import_system`; one loaded from a file
    is imported first), or a job or system id. ``params`` are those of :meth:`Client.submit`."""
    if isinstance(system, System):
        system_id = system.id
        if system_id is None or system.source.get("run") is not None:
            system_id = import_system(client, system).id
    else:
        system_id = str(system)
    return [client.submit(cube, statistics_from=system_id, **params) for cube in cubes]
