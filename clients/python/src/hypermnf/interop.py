"""Conversions to other libraries (xarray, rioxarray), imported only when asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Protocol, Union

if TYPE_CHECKING:  # pragma: no cover
    import os

import numpy as np

from ._geo import MapInfo, crs_wkt
from ._metadata import band_values, metadata_of, source_of

if TYPE_CHECKING:  # pragma: no cover
    import xarray

    from .job import Job


class _Reduction(Protocol):
    """What :func:`to_xarray` reads of a :class:`~hypermnf.Reduction` (described here: ``results`` imports
    this module for ``Reduction.to_xarray``, so this one does not import ``results``)."""

    components: Optional[np.ndarray]
    denoised: Optional[np.ndarray]
    metadata: Dict[str, Any]


def to_xarray(
    result: Union[np.ndarray, _Reduction],
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
    if not isinstance(result, np.ndarray) and hasattr(result, "components") and hasattr(result, "denoised"):
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


def cog_to_xarray(path: Union[str, "os.PathLike[str]"]) -> "xarray.DataArray":
    """Opens a GeoTIFF result (``Job.download(..., format="cog")``, ``hypermnf run --out X.tif``) as an
    ``xarray.DataArray`` of dims ``(line, sample, component)`` (``band`` for a denoised cube), with the map
    coordinates ``x`` and ``y`` of each pixel's centre from its geotransform (2-D for a rotated grid), the
    CRS as WKT in ``attrs["crs_wkt"]`` and on ``spatial_ref`` (and through ``.rio.write_crs`` when rioxarray
    is installed), the band descriptions (``MNF k``) as ``band_name`` and the eigenvalues and SNR, when the
    file has them, as coordinates. Reads with rasterio when installed, else GDAL's Python bindings.

    Raises:
        ImportError: xarray, or both rasterio and GDAL's bindings, are missing.
    """
    import os

    try:
        import xarray as xr
    except ImportError:
        raise ImportError("hypermnf.cog_to_xarray needs xarray: pip install 'hypermnf[xarray]'") from None
    array, gt, wkt, names, tags = _read_geotiff(os.fspath(path))
    bands, lines, samples = array.shape
    denoised = not all(n.startswith("MNF ") for n in names)
    depth = "band" if denoised else "component"
    coords: Dict[str, Any] = {"line": np.arange(lines), "sample": np.arange(samples), depth: np.arange(bands)}
    coords["band_name"] = (depth, np.asarray(names, dtype=object))
    eig = _numbers(tags.get("MNF_EIGENVALUES"))
    snr = _numbers(tags.get("MNF_SNR"))
    if not denoised and eig is not None and eig.size >= bands:
        coords["eigenvalue"] = (depth, eig[:bands])
    if not denoised and snr is not None and snr.size >= bands:
        coords["snr"] = (depth, snr[:bands])
    attrs: Dict[str, Any] = {k: v for k, v in tags.items() if isinstance(v, str) and not k.startswith("MNF_")}
    if gt is not None:
        cols, rows = np.meshgrid(np.arange(samples) + 0.5, np.arange(lines) + 0.5)
        x = gt[0] + cols * gt[1] + rows * gt[2]
        y = gt[3] + cols * gt[4] + rows * gt[5]
        if gt[2] == 0.0 and gt[4] == 0.0:
            coords["x"], coords["y"] = ("sample", x[0, :]), ("line", y[:, 0])
        else:
            coords["x"], coords["y"] = (("line", "sample"), x), (("line", "sample"), y)
        ref: Dict[str, Any] = {"GeoTransform": " ".join(repr(float(v)) for v in gt)}
        if wkt:
            attrs["crs_wkt"] = wkt
            ref.update(crs_wkt=wkt, spatial_ref=wkt)
        coords["spatial_ref"] = ((), np.int64(0), ref)
        attrs["grid_mapping"] = "spatial_ref"
    da = xr.DataArray(np.moveaxis(array, 0, -1), dims=("line", "sample", depth), coords=coords,
                      name="denoised" if denoised else "mnf", attrs=attrs)
    if gt is not None and wkt:
        da = _write_crs_with_rioxarray(da, wkt)
    return da


def _numbers(text: Optional[str]) -> Optional[np.ndarray]:
    try:
        return None if not text else np.asarray([float(v) for v in text.split(",")], dtype=np.float64)
    except ValueError:
        return None


def _read_geotiff(path: str):
    """(bands, lines, samples) values, the geotransform (None without one), the WKT, band descriptions and
    the dataset's metadata, with rasterio or else osgeo.gdal."""
    try:
        import rasterio
    except ImportError:
        rasterio = None
    if rasterio is not None:
        with rasterio.open(path) as d:
            gt = d.transform.to_gdal() if d.crs is not None or not d.transform.is_identity else None
            return d.read(), gt, d.crs.to_wkt() if d.crs else None, [s or "" for s in d.descriptions], dict(d.tags())
    try:
        from osgeo import gdal
    except ImportError:
        raise ImportError("hypermnf.cog_to_xarray needs rasterio or GDAL's Python bindings (osgeo)") from None
    d = gdal.Open(path)
    if d is None:
        raise ValueError(f"{path}: not a raster GDAL can read")
    has_gt = d.GetGeoTransform(can_return_null=True)
    names = [d.GetRasterBand(i + 1).GetDescription() for i in range(d.RasterCount)]
    return d.ReadAsArray().reshape(d.RasterCount, d.RasterYSize, d.RasterXSize), has_gt, d.GetProjection() or None, names, d.GetMetadata() or {}
