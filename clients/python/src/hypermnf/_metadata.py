"""The metadata document of a job (``GET /v1/jobs/{id}/metadata``) read the same way by the results,
the jobs and the conversions: its ``source`` (the input's own header metadata) and per-band lists."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

# The members of the metadata's ``source``: the request's own ENVI header metadata (null when it had none).
SOURCE_KEYS = ("wavelength", "wavelength_units", "fwhm", "band_names", "description", "map_info", "coordinate_system_string")


def source_of(metadata: Mapping[str, Any]) -> Dict[str, Any]:
    """The metadata's ``source`` with every key of :data:`SOURCE_KEYS` (``None`` where absent: a server
    before 2026-11-26 sends no ``source``)."""
    source = metadata.get("source") or {}
    if not isinstance(source, Mapping):
        source = {}
    return {k: source.get(k) for k in SOURCE_KEYS}


def band_values(metadata: Mapping[str, Any], key: str) -> Optional[list]:
    """The source's per-band list ``key`` (wavelength, fwhm, band_names) when it has one value per input band."""
    values = source_of(metadata).get(key)
    bands = (metadata.get("input") or {}).get("bands")
    if not isinstance(values, list) or (bands is not None and len(values) != int(bands)):
        return None
    return values


def merge_source(metadata: Dict[str, Any], local: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Fills the members of ``metadata["source"]`` the server left null with what the client knew of the
    input (an xarray DataArray's coordinates, a Spectral Python image's header). The server's own values win."""
    if not local:
        return metadata
    merged = source_of(metadata)
    for key in SOURCE_KEYS:
        if merged.get(key) is None and local.get(key) is not None:
            merged[key] = local[key]
    metadata["source"] = merged
    return metadata


def metadata_of(obj: Any) -> Mapping[str, Any]:
    """The metadata dict of a job, a :class:`Reduction` or the metadata itself."""
    if isinstance(obj, Mapping):
        return obj
    # A Reduction's `metadata` is the dict itself; a Job's `_metadata` the one it fetched.
    cached = getattr(obj, "_metadata", None)
    if isinstance(cached, Mapping):
        return cached
    meta = getattr(obj, "metadata", None)
    if isinstance(meta, Mapping):
        return meta
    if callable(meta):  # an AsyncJob whose metadata was not fetched yet
        raise TypeError("fetch the job's metadata first: `await job.metadata()`, then pass the job or that dict")
    raise TypeError(f"expected a Job, a Reduction or a metadata dict, got {type(obj).__name__}")
