"""Conversions to other libraries (xarray, rioxarray), imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Union

import numpy as np

from ._geo import MapInfo, crs_wkt
from .results import Reduction, band_values, metadata_of, source_of

if TYPE_CHECKING:  # pragma: no cover
    import xarray

    from .job import Job


def to_xarray(
    result: Union[np.ndarray, Reduction],
    metadata: Union[Mapping[str, Any], "Job", None] = None,
    product: Optional[str] = None,
) -> "xarray.DataArray":
    """Wraps a result in an ``xarray.DataArray``, with the coordinates its metadata gives.

    ``result`` is an array with ``metadata`` (:attr:`Job.metadata`, the job itself or a :class:`Reduction`),
    or a :class:`Reduction` alone. ``product`` is ``"components"`` (the default) or ``"denoised"``;
    for a Reduction it is the one it holds.

    * dims ``(line, sample, component)`` for the components, with coordinates ``component`` (0-based),
      ``eigenvalue`` and ``snr``; ``(line, sample, band)`` for the denoised cube, with ``band`` (0-based
      input band) and, when the source's header had them, ``wavelength`` (attribute ``units``),
      ``fwhm`` and ``band_name`` along ``band``;
    * ``line`` and ``sample``: 0-based pixel indices;
    * when the source's header had a ``map info``: map coordinates ``x`` and ``y`` of each pixel's centre
      (1-D along ``sample`` and ``line``, or 2-D (line, sample) for a rotated grid); the CRS as WKT (the
      header's ``coordinate system string``, else derived from a UTM or geographic map info) in the
      attribute ``crs_wkt`` and on a scalar coordinate ``spatial_ref`` (attributes ``crs_wkt``,
      ``spatial_ref``, ``GeoTransform``, as GDAL and rioxarray read them), and through ``.rio.write_crs``
      when rioxarray is installed (it is not required; it then writes its own spelling of the CRS on
      ``spatial_ref``, while ``attrs["crs_wkt"]`` stays the source's);
    * the metadata's scalar fields, and the source's ``description`` and ``map_info``, as attributes.

    Raises:
        ImportError: xarray is not installed (``pip install 'hypermnf[xarray]'``).
    """
    try:
        import xarray as xr
    except ImportError:
        raise ImportError(
            "hypermnf.to_xarray needs xarray, which is not installed: pip install 'hypermnf[xarray]' (or pip install xarray)"
        ) from None
    if isinstance(result, Reduction):
        reduction = result
        held = "components" if reduction.components is not None else "denoised"
        if product is not None and product != held:
            raise ValueError(f"this Reduction holds the {held}, not the {product}")
        product = held
        result = reduction.components if held == "components" else reduction.denoised
        if metadata is None:
            metadata = reduction.metadata
    if metadata is None:
        raise TypeError("to_xarray needs the result's metadata (a Job, a Reduction or Job.metadata)")
    product = product or "components"
    metadata = metadata_of(metadata)
    array = np.asarray(result)
    if array.ndim != 3:
        raise ValueError(f"a result is 3-D (lines, samples, k), got shape {array.shape}")
    lines, samples, depth = array.shape
    attrs: Dict[str, Any] = {k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool))}
    source = source_of(metadata)
    for key in ("description", "map_info"):
        if isinstance(source.get(key), str):
            attrs[key] = source[key]
    coords: Dict[str, Any] = {"line": np.arange(lines), "sample": np.arange(samples)}
    if product == "denoised":
        dims = ("line", "sample", "band")
        coords["band"] = np.arange(depth)
        for key, name in (("wavelength", "wavelength"), ("fwhm", "fwhm"), ("band_names", "band_name")):
            values = band_values(metadata, key)
            if values is not None and len(values) == depth:
                coords[name] = ("band", np.asarray(values, dtype=object if key == "band_names" else np.float64))
        if "wavelength" in coords and source.get("wavelength_units"):
            coords["wavelength"] = ("band", coords["wavelength"][1], {"units": source["wavelength_units"]})
        name = "denoised"
    elif product == "components":
        dims = ("line", "sample", "component")
        eigenvalues = np.asarray(metadata["eigenvalues"], dtype=np.float64)
        if eigenvalues.size < depth:
            raise ValueError(f"the metadata has {eigenvalues.size} eigenvalues for a result with {depth} components")
        snr = np.asarray(metadata["snr"], dtype=np.float64) if "snr" in metadata else eigenvalues - 1.0
        coords.update(component=np.arange(depth), eigenvalue=("component", eigenvalues[:depth]), snr=("component", snr[:depth]))
        name = "mnf"
    else:
        raise ValueError(f"product must be 'components' or 'denoised', got {product!r}")
    wkt = _georeference(coords, attrs, source, lines, samples)
    da = xr.DataArray(array, dims=dims, coords=coords, name=name, attrs=attrs)
    if wkt is not None:
        da = _write_crs_with_rioxarray(da, wkt)
    return da


def _georeference(coords: Dict[str, Any], attrs: Dict[str, Any], source: Mapping[str, Any], lines: int, samples: int) -> Optional[str]:
    """Adds x/y and the CRS (see :func:`to_xarray`) to ``coords`` and ``attrs``; returns the WKT, if any."""
    info = None
    if isinstance(source.get("map_info"), str):
        try:
            info = MapInfo.parse(source["map_info"])
        except ValueError:
            info = None  # a map info we cannot read: the pixel grid only
    if info is not None:
        x, y = info.pixel_centres(lines, samples)
        if x.ndim == 1:
            coords["x"], coords["y"] = ("sample", x), ("line", y)
        else:
            coords["x"], coords["y"] = (("line", "sample"), x), (("line", "sample"), y)
    wkt = crs_wkt(info, source.get("coordinate_system_string"))
    if wkt is None and info is None:
        return None
    ref_attrs: Dict[str, Any] = {}
    if wkt is not None:
        attrs["crs_wkt"] = wkt
        ref_attrs.update(crs_wkt=wkt, spatial_ref=wkt)
    if info is not None:
        ref_attrs["GeoTransform"] = " ".join(repr(float(v)) for v in info.geotransform())
    coords["spatial_ref"] = ((), np.int64(0), ref_attrs)
    attrs["grid_mapping"] = "spatial_ref"
    return wkt


def _write_crs_with_rioxarray(da: "xarray.DataArray", wkt: str) -> "xarray.DataArray":
    """``da.rio.write_crs(wkt)`` when rioxarray is installed (keeping the GeoTransform), else ``da``."""
    try:
        import rioxarray  # noqa: F401  (registers the .rio accessor)
    except ImportError:
        return da
    transform = da.coords["spatial_ref"].attrs.get("GeoTransform")
    da = da.rio.write_crs(wkt, grid_mapping_name="spatial_ref")
    if transform is not None:
        da.coords["spatial_ref"].attrs["GeoTransform"] = transform
    return da
