"""How each kind of cube becomes an HTTP request body for ``POST /v1/jobs``.

* a NumPy array      → ``application/x-npy`` body, streamed from the array's memory; parameters in the query;
* an ENVI ``.hdr``   → ``multipart/form-data`` with parts ``header``, ``data`` (streamed from disk) and ``params``;
  the data file (``scene.img``) names the same pair when its header is beside it;
* a ``.npy`` file    → ``application/x-npy`` body streamed from disk;
* a ``file://`` href → ``application/json`` ``{"input": {"href": ...}, "params": {...}}`` (the server reads it).

What a notebook holds is first turned into one of those by :func:`prepare`: an ``xarray.DataArray`` with a
band dimension, and a Spectral Python image (``SpyFile``), become arrays (lines, samples, bands).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from ._npy import as_cube, npy_stream
from ._params import Params

# An array's digest (`X-Cube-Digest`, or `X-Content-SHA256` for a big-endian one, see `npy_stream`) is sent
# ahead of it: when the caller already has a job of the same cube and parameters, the server answers at once
# without reading the body (hashing memory is much cheaper than uploading it again, e.g. when a notebook
# cell is re-run).

CubeLike = Union[np.ndarray, str, "os.PathLike[str]", Any]  # Any: an xarray.DataArray or a SpyFile

# Where ENVI tools put the raw data beside `NAME.hdr`, in the order they are tried.
_DATA_SUFFIXES = (".img", ".dat", ".raw", ".bsq", ".bil", ".bip", ".bin", "")


@dataclass
class Upload:
    """Keyword arguments for ``httpx.Client.request`` plus the files to close after the request."""

    kwargs: Dict[str, Any]
    files: ExitStack = field(default_factory=ExitStack)


def envi_data_file(header: Path) -> Path:
    """The raw data file that belongs to the ENVI header ``header`` (same stem, usual suffixes)."""
    stem = header.with_suffix("")
    for suffix in _DATA_SUFFIXES:
        candidate = stem.with_name(stem.name + suffix) if suffix else stem
        if candidate != header and candidate.is_file():
            return candidate
    tried = ", ".join(stem.name + s for s in _DATA_SUFFIXES)
    raise FileNotFoundError(f"no ENVI data file beside {header} (tried {tried})")


def envi_header_file(data: Path) -> Optional[Path]:
    """The ENVI header of the data file ``data``: ``NAME.hdr`` for ``NAME.img`` (any suffix), or ``NAME.img.hdr``."""
    for candidate in (data.with_suffix(".hdr"), data.with_name(data.name + ".hdr")):
        if candidate != data and candidate.is_file():
            return candidate
    upper = data.with_suffix(".HDR")
    return upper if upper != data and upper.is_file() else None


# Names of a DataArray's band dimension, and of its line (row) and sample (column) dimensions.
BAND_DIMS = ("band", "bands", "wavelength", "wavelengths", "channel", "channels", "spectral", "lambda")
LINE_DIMS = ("line", "lines", "y", "row", "rows", "lat", "latitude", "northing")
SAMPLE_DIMS = ("sample", "samples", "x", "col", "cols", "column", "columns", "lon", "longitude", "easting")


@dataclass
class Prepared:
    """A cube as it will be sent, with what the client knew of it besides its samples.

    ``source`` holds the members of the metadata's ``source`` (wavelength, band_names, ...) that the input
    object carried; ``ignore_value`` and ``bad_bands`` are those of a Spectral Python image's header, which
    an array upload would otherwise lose (an ENVI upload sends the header itself)."""

    cube: Any
    source: Optional[Dict[str, Any]] = None
    ignore_value: Optional[float] = None
    bad_bands: List[int] = field(default_factory=list)


def prepare(cube: Any) -> Prepared:
    """Turns an ``xarray.DataArray`` or a Spectral Python image into an array (lines, samples, bands), and a
    data-file path into its header's path; leaves anything else as it is."""
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(cube, xr.DataArray):
        return _from_dataarray(cube)
    spyfile = sys.modules.get("spectral.io.spyfile")
    if spyfile is not None and isinstance(cube, spyfile.SpyFile):
        return _from_spyfile(cube)
    if isinstance(cube, (str, os.PathLike)) and not (isinstance(cube, str) and "://" in cube):
        path = Path(os.fspath(cube))
        if path.suffix.lower() not in (".hdr", ".npy") and path.is_file():
            header = envi_header_file(path)
            if header is not None:
                return Prepared(_EnviPair(header, path))
    return Prepared(cube)


@dataclass(frozen=True)
class _EnviPair:
    """An ENVI header and the data file named by the caller."""

    header: Path
    data: Path


def _from_dataarray(da: Any) -> Prepared:
    dims = [str(d) for d in da.dims]
    if len(dims) != 3:
        raise ValueError(f"a cube DataArray must have 3 dims (lines, samples, bands), got {tuple(dims)}")
    lowered = [d.lower() for d in dims]
    band = next((dims[i] for i, d in enumerate(lowered) if d in BAND_DIMS), None)
    if band is None:
        raise ValueError(
            f"cannot tell the band dimension of a DataArray with dims {tuple(dims)}: name it one of {', '.join(BAND_DIMS)}"
        )
    spatial = [d for d in dims if d != band]
    line = next((d for d in spatial if d.lower() in LINE_DIMS), None)
    sample = next((d for d in spatial if d.lower() in SAMPLE_DIMS), None)
    if line is None or sample is None or line == sample:
        line, sample = spatial  # neither named: the order they have
    array = np.asarray(da.transpose(line, sample, band).values)
    return Prepared(array, _dataarray_source(da, band))


def _dataarray_source(da: Any, band: str) -> Optional[Dict[str, Any]]:
    """The source metadata a DataArray carries: wavelengths and band names along its band dimension, and
    the ENVI-named attributes (``wavelength_units``, ``description``, ``map_info``, ``crs_wkt``...)."""
    source: Dict[str, Any] = {}
    n = da.sizes[band]
    for name, coord in da.coords.items():
        if coord.dims != (band,) or coord.size != n:
            continue
        values = np.asarray(coord.values)
        key = str(name).lower()
        if key in ("wavelength", "wavelengths", "lambda") and values.dtype.kind in "iuf":
            source["wavelength"] = [float(v) for v in values]
            units = coord.attrs.get("units")
            if isinstance(units, str):
                source["wavelength_units"] = units
        elif key in ("fwhm",) and values.dtype.kind in "iuf":
            source["fwhm"] = [float(v) for v in values]
        elif key in ("band_name", "band_names", "band", "bands") and values.dtype.kind in "OUS":
            source["band_names"] = [str(v) for v in values]
    attrs = {str(k).lower().replace(" ", "_"): v for k, v in da.attrs.items()}
    for key, names in (("wavelength_units", ("wavelength_units",)), ("description", ("description",)),
                       ("map_info", ("map_info",)), ("coordinate_system_string", ("coordinate_system_string", "crs_wkt"))):
        for attr in names:
            if key not in source and isinstance(attrs.get(attr), str):
                source[key] = attrs[attr]
    return source or None


def _from_spyfile(image: Any) -> Prepared:
    """A Spectral Python image as a (lines, samples, bands) array of the stored samples: its memory map
    (read in place; one copy only where the file is BSQ or BIL and the array must be made C-ordered), or
    ``load()`` when there is no file to map. A ``reflectance scale factor`` is not applied (it changes no
    component, and the ``data ignore value`` is in stored units)."""
    try:
        array = image.open_memmap(interleave="bip")
    except Exception:  # no plain file to map (e.g. compressed): one read into memory
        array = np.asarray(image.load(scale=False))
    header = getattr(image, "metadata", None) or {}
    source: Dict[str, Any] = {}
    centers = getattr(getattr(image, "bands", None), "centers", None)
    if centers:
        source["wavelength"] = [float(c) for c in centers]
        unit = getattr(image.bands, "band_unit", None)
        if unit:
            source["wavelength_units"] = str(unit)
    widths = getattr(getattr(image, "bands", None), "bandwidths", None)
    if widths:
        source["fwhm"] = [float(w) for w in widths]
    for key, name in (("band names", "band_names"), ("description", "description"), ("map info", "map_info"),
                      ("coordinate system string", "coordinate_system_string")):
        value = header.get(key)
        if isinstance(value, (list, tuple)):
            value = [str(v).strip() for v in value] if key == "band names" else ", ".join(str(v).strip() for v in value)
        if value is not None:
            source[name] = value
    ignore = header.get("data ignore value")
    ignore_value = None
    if ignore is not None:
        try:
            ignore_value = float(str(ignore).strip())
        except ValueError:
            ignore_value = None
    bad: List[int] = []
    bbl = header.get("bbl")
    if isinstance(bbl, (list, tuple)):
        try:
            bad = [i for i, flag in enumerate(bbl) if int(float(flag)) == 0]
        except (TypeError, ValueError):
            bad = []
    return Prepared(array, source or None, ignore_value, bad)


def merged_params(prepared: Prepared, ignore_value: Optional[float], bad_bands: Optional[Sequence[int]]) -> tuple:
    """The caller's ``ignore_value`` (else the image header's) and ``bad_bands`` with the header's ``bbl``."""
    if ignore_value is None:
        ignore_value = prepared.ignore_value
    if prepared.bad_bands:
        bands = [int(b) for b in (bad_bands or [])]
        bad_bands = bands + [b for b in prepared.bad_bands if b not in bands]
    return ignore_value, bad_bands


def build_upload(cube: CubeLike, params: Params) -> Upload:
    """Chooses the request form for ``cube`` and prepares its (streaming) body."""
    if isinstance(cube, Prepared):
        cube = cube.cube
    if isinstance(cube, _EnviPair):
        return _envi_multipart(cube.header, params, cube.data)
    if isinstance(cube, np.ndarray):
        return _npy_array(as_cube(cube), params)
    if isinstance(cube, str) and cube.startswith("file://"):
        body = json.dumps({"input": {"href": cube}, "params": params.to_json()}).encode()
        return Upload({"content": body, "headers": {"Content-Type": "application/json"}})
    if isinstance(cube, (str, os.PathLike)):
        path = Path(os.fspath(cube))
        if "://" in str(cube):
            raise ValueError(f"only file:// hrefs are understood, got {cube!r}")
        if not path.is_file():
            raise FileNotFoundError(f"no such cube file: {path}")
        suffix = path.suffix.lower()
        if suffix == ".hdr":
            return _envi_multipart(path, params)
        if suffix == ".npy":
            return _npy_file(path, params)
        raise ValueError(
            f"a cube path must be an ENVI header (.hdr), an ENVI data file with its .hdr beside it, or a .npy file, got {path}"
        )
    raise TypeError(
        "cube must be a numpy array (lines, samples, bands), an xarray.DataArray with a band dimension, a Spectral "
        "Python image, a path to an ENVI .hdr (or its data file) or a .npy file, or a 'file://' href on the server; "
        f"got {type(cube).__name__}"
    )


def _npy_array(array: np.ndarray, params: Params) -> Upload:
    length, digest, chunks = npy_stream(array)
    headers = {"Content-Type": "application/x-npy", "Content-Length": str(length), **digest}
    return Upload({"content": chunks, "params": params.to_query(), "headers": headers})


def _npy_file(path: Path, params: Params) -> Upload:
    upload = Upload({})
    handle = upload.files.enter_context(open(path, "rb"))
    upload.kwargs = {
        "content": _read_chunks(handle),
        "params": params.to_query(),
        "headers": {"Content-Type": "application/x-npy", "Content-Length": str(path.stat().st_size)},
    }
    return upload


def _envi_multipart(header: Path, params: Params, data: Optional[Path] = None) -> Upload:
    data = data or envi_data_file(header)
    upload = Upload({})
    # httpx streams file parts in chunks and computes Content-Length from the files' sizes.
    header_file = upload.files.enter_context(open(header, "rb"))
    data_file = upload.files.enter_context(open(data, "rb"))
    # The parameters before the data: the server then sends the data to the device while it arrives.
    upload.kwargs = {
        "files": [
            ("header", (header.name, header_file, "text/plain")),
            ("params", (None, json.dumps(params.to_json()).encode(), "application/json")),
            ("data", (data.name, data_file, "application/octet-stream")),
        ]
    }
    return upload


def _read_chunks(handle: Any, size: int = 4 << 20) -> Iterable[bytes]:
    while True:
        block = handle.read(size)
        if not block:
            return
        yield block

