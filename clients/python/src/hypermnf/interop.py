"""Conversions to other libraries (xarray), imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import xarray

    from .job import Job


def to_xarray(result: np.ndarray, metadata: Union[Mapping[str, Any], "Job"], product: str = "components") -> "xarray.DataArray":
    """Wraps a result in an ``xarray.DataArray``.

    For ``product="components"`` the dims are ``(line, sample, component)`` with coordinates ``component``
    (0-based), ``eigenvalue`` and ``snr`` along ``component``; for ``product="denoised"`` they are
    ``(line, sample, band)``. ``metadata`` is :attr:`Job.metadata` (or the job itself); its scalar fields
    become attributes.

    Raises:
        ImportError: xarray is not installed (``pip install 'hypermnf[xarray]'``).
    """
    try:
        import xarray as xr
    except ImportError:
        raise ImportError(
            "hypermnf.to_xarray needs xarray, which is not installed: pip install 'hypermnf[xarray]' (or pip install xarray)"
        ) from None
    if not isinstance(metadata, Mapping):
        metadata = metadata.metadata
    array = np.asarray(result)
    if array.ndim != 3:
        raise ValueError(f"a result is 3-D (lines, samples, k), got shape {array.shape}")
    attrs: Dict[str, Any] = {k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool))}
    if product == "denoised":
        return xr.DataArray(array, dims=("line", "sample", "band"), name="denoised", attrs=attrs)
    if product != "components":
        raise ValueError(f"product must be 'components' or 'denoised', got {product!r}")
    k = array.shape[2]
    eigenvalues = np.asarray(metadata["eigenvalues"], dtype=np.float64)
    if eigenvalues.size < k:
        raise ValueError(f"the metadata has {eigenvalues.size} eigenvalues for a result with {k} components")
    snr = np.asarray(metadata["snr"], dtype=np.float64) if "snr" in metadata else eigenvalues - 1.0
    coords = {
        "component": np.arange(k),
        "eigenvalue": ("component", eigenvalues[:k]),
        "snr": ("component", snr[:k]),
    }
    return xr.DataArray(array, dims=("line", "sample", "component"), coords=coords, name="mnf", attrs=attrs)
