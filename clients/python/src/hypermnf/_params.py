"""The MNF parameters, in the two spellings the service accepts: a query string and a JSON object."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence


class _DefaultComponents(int):
    """The default of ``components`` (10), distinguishable from an explicit ``components=10``.

    ``components`` and ``snr`` are exclusive on the server; when the caller gives ``snr`` and leaves
    ``components`` at its default, only ``snr`` is sent.
    """

    def __repr__(self) -> str:
        return "10"


DEFAULT_COMPONENTS: int = _DefaultComponents(10)

NOISE_ESTIMATORS = ("mean-filter", "shift-difference")
BACKENDS = ("auto", "cpu", "cuda", "cuda-cublas")

# How ``ignore_value=float("nan")`` is spelt on the wire, in a query string and as a JSON string.
NAN = "nan"


@dataclass(frozen=True)
class Params:
    """One job's parameters, as ``submit`` received them (``None`` = the server's default)."""

    components: Optional[int] = None
    snr: Optional[float] = None
    noise: Optional[str] = None
    inverse: bool = False
    bad_bands: List[int] = field(default_factory=list)
    ignore_value: Optional[float] = None
    noise_window: Optional[List[int]] = None
    backend: Optional[str] = None
    # A job or system id whose eigen system the job projects with (``hypermnf.systems``).
    statistics_from: Optional[str] = None
    # An EMIT granule's GeoTIFF result on its north-up grid (the granule's GLT applied).
    ortho: bool = False

    @classmethod
    def build(
        cls,
        components: Optional[int],
        snr: Optional[float],
        noise: Optional[str],
        inverse: bool,
        bad_bands: Optional[Sequence[int]],
        ignore_value: Optional[float],
        noise_window: Optional[Sequence[int]],
        backend: Optional[str],
        statistics_from: Optional[str] = None,
    ) -> "Params":
        """Normalises the caller's arguments; checks only their Python types (the server checks the values
        against the cube and answers with an :class:`~hypermnf.APIError` when they are wrong)."""
        if snr is not None and components is DEFAULT_COMPONENTS:
            components = None
        if components is not None:
            components = _as_int("components", components)
        if snr is not None:
            snr = _as_float("snr", snr)
        if ignore_value is not None:
            ignore_value = _as_float("ignore_value", ignore_value, nan=True)
        bands = [_as_int("bad_bands[]", b) for b in (bad_bands or [])]
        window = None
        if noise_window is not None:
            window = [_as_int("noise_window[]", v) for v in noise_window]
            if len(window) != 4:
                raise ValueError(f"noise_window must be (x0, y0, x1, y1), got {list(noise_window)!r}")
        return cls(components, snr, noise, bool(inverse), bands, ignore_value, window, backend, statistics_from)

    def to_json(self) -> Dict[str, Any]:
        """The JSON ``params`` object (only the fields that differ from the server's defaults)."""
        out: Dict[str, Any] = {}
        if self.components is not None:
            out["components"] = self.components
        if self.snr is not None:
            out["snr"] = self.snr
        if self.noise is not None:
            out["noise"] = self.noise
        if self.inverse:
            out["inverse"] = True
        if self.bad_bands:
            out["bad_bands"] = list(self.bad_bands)
        if self.ignore_value is not None:
            # NaN has no JSON number: the service reads the string "nan" (and ignore_value=nan in a query).
            out["ignore_value"] = NAN if math.isnan(self.ignore_value) else self.ignore_value
        if self.noise_window is not None:
            out["noise_window"] = list(self.noise_window)
        if self.backend is not None:
            out["backend"] = self.backend
        if self.statistics_from is not None:
            out["statistics_from"] = self.statistics_from
        if self.ortho:
            out["ortho"] = True
        return out

    def to_query(self) -> Dict[str, str]:
        """The same parameters as query-string values (lists comma-separated, booleans true/false)."""
        out: Dict[str, str] = {}
        for key, value in self.to_json().items():
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, list):
                out[key] = ",".join(str(v) for v in value)
            elif isinstance(value, float):
                out[key] = repr(value)
            else:
                out[key] = str(value)
        return out


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return int(value.__index__())


def _as_float(name: str, value: Any, nan: bool = False) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(out) and not nan:
        raise ValueError(f"{name} must be a number, not NaN")
    return out
