"""Georeferencing from an ENVI header: pixel coordinates from ``map info`` and the CRS as WKT.

``map info = {projection, ref x, ref y, easting, northing, x size, y size[, zone, North|South][, datum],
units=..., rotation=...}``: the reference pixel is in 1-based file coordinates, where (1, 1) is the upper
left corner of the first pixel and (1.5, 1.5) its centre; ``rotation`` is in degrees, counter-clockwise,
as GDAL's ENVI driver reads it. The CRS is the header's ``coordinate system string`` (WKT) when there is
one, else derived from a UTM or geographic ``map info`` and its datum, as GDAL does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

GeoTransform = Tuple[float, float, float, float, float, float]


@dataclass(frozen=True)
class MapInfo:
    """One ENVI ``map info`` value, parsed."""

    projection: str
    ref_x: float  # 1-based file coordinates of the reference pixel
    ref_y: float
    easting: float  # map coordinates of the reference pixel
    northing: float
    dx: float  # pixel sizes (positive), in map units
    dy: float
    zone: Optional[int] = None
    north: Optional[bool] = None
    datum: Optional[str] = None
    units: Optional[str] = None
    rotation: float = 0.0  # degrees

    @classmethod
    def parse(cls, text: str) -> "MapInfo":
        """Parses ``text`` (with or without its braces). Raises ValueError when it is not a map info."""
        fields = [f.strip() for f in text.strip().strip("{}").split(",")]
        named = {}
        positional: List[str] = []
        for f in fields:
            if "=" in f:
                key, _, value = f.partition("=")
                named[key.strip().lower()] = value.strip()
            elif f:
                positional.append(f)
        if len(positional) < 7:
            raise ValueError(f"a map info has at least 7 fields, got {text!r}")
        try:
            ref_x, ref_y, easting, northing, dx, dy = (float(v) for v in positional[1:7])
            rotation = float(named.get("rotation", "0") or 0)
        except ValueError:
            raise ValueError(f"map info fields 2..7 (and rotation) must be numbers: {text!r}") from None
        projection = positional[0]
        extra = positional[7:]
        zone = north = datum = None
        if projection.upper().startswith("UTM") and len(extra) >= 2:
            try:
                zone = int(float(extra[0]))
            except ValueError:
                raise ValueError(f"a UTM map info's 8th field is the zone: {text!r}") from None
            north = extra[1].strip().lower() != "south"
            datum = extra[2] if len(extra) >= 3 else None
        elif extra:
            datum = extra[0]
        return cls(projection, ref_x, ref_y, easting, northing, dx, dy, zone, north, datum, named.get("units"), rotation)

    def geotransform(self) -> GeoTransform:
        """GDAL's affine transform: x = g0 + col·g1 + row·g2, y = g3 + col·g4 + row·g5, where (col, row) = (0, 0)
        is the upper left corner of the first pixel."""
        if abs(self.rotation) == 180.0:  # upside down: as GDAL reads it (lines flipped, no rotation)
            return (self.easting - (self.ref_x - 1) * self.dx, self.dx, 0.0,
                    self.northing + (self.ref_y - 1) * self.dy, 0.0, self.dy)
        phi = math.radians(self.rotation)
        c, s = math.cos(phi), math.sin(phi)
        if self.rotation == 0.0:
            c, s = 1.0, 0.0
        u0, v0 = (1.0 - self.ref_x) * self.dx, (1.0 - self.ref_y) * self.dy
        return (self.easting + c * u0 + s * v0, c * self.dx, s * self.dy,
                self.northing + s * u0 - c * v0, s * self.dx, -c * self.dy)

    def pixel_centres(self, lines: int, samples: int) -> Tuple[np.ndarray, np.ndarray]:
        """Map x and y of each pixel's centre: 1-D (x along samples, y along lines) for a north-up grid,
        else 2-D (lines, samples) each."""
        g0, g1, g2, g3, g4, g5 = self.geotransform()
        col = np.arange(samples, dtype=np.float64) + 0.5
        row = np.arange(lines, dtype=np.float64) + 0.5
        if g2 == 0.0 and g4 == 0.0:
            return g0 + col * g1, g3 + row * g5
        rr, cc = np.meshgrid(row, col, indexing="ij")
        return g0 + cc * g1 + rr * g2, g3 + cc * g4 + rr * g5


# Datums of ENVI map infos, as GDAL names them (SetENVIDatum), for the CRSs derived here.
_DATUMS = {
    "wgs-84": "WGS84", "wgs84": "WGS84",
    "north america 1983": "NAD83", "nad-83": "NAD83", "nad83": "NAD83", "grs 80": "NAD83",
    "north america 1927": "NAD27", "nad-27": "NAD27", "nad27": "NAD27",
}
# name, datum name, datum EPSG, ellipsoid name, a, 1/f, ellipsoid EPSG, geographic CRS EPSG, UTM base
_GEOG = {
    "WGS84": ("WGS 84", "WGS_1984", 6326, "WGS 84", 6378137.0, 298.257223563, 7030, 4326, (32600, 32700)),
    "NAD83": ("NAD83", "North_American_Datum_1983", 6269, "GRS 1980", 6378137.0, 298.257222101, 7019, 4269, (26900, None)),
    "NAD27": ("NAD27", "North_American_Datum_1927", 6267, "Clarke 1866", 6378206.4, 294.978698213898, 7008, 4267, (26700, None)),
}


def _datum_key(datum: Optional[str], default: str) -> Optional[str]:
    if datum is None:
        return default
    name = datum.strip().lower()
    if name in _DATUMS:
        return _DATUMS[name]
    if "nad27" in name or "nad-27" in name:
        return "NAD27"
    return None


def epsg_of(info: MapInfo) -> Optional[int]:
    """The EPSG code of a UTM or geographic map info with a known datum, else None. Without a datum, a UTM
    map info is NAD27 and a geographic one WGS 84 (GDAL's defaults)."""
    projection = info.projection.upper()
    if projection.startswith("UTM"):
        key = _datum_key(info.datum, "NAD27")
        if key is None or info.zone is None or not 1 <= info.zone <= 60:
            return None
        north_base, south_base = _GEOG[key][8]
        base = north_base if info.north else south_base
        return None if base is None else base + info.zone
    if projection.startswith("GEOGRAPHIC LAT"):
        key = _datum_key(info.datum, "WGS84")
        return None if key is None else _GEOG[key][7]
    return None


def _geogcs(key: str) -> str:
    name, datum, datum_code, ellipsoid, a, invf, ellipsoid_code, code, _ = _GEOG[key]
    return (
        f'GEOGCS["{name}",DATUM["{datum}",SPHEROID["{ellipsoid}",{a!r},{invf!r},AUTHORITY["EPSG","{ellipsoid_code}"]],'
        f'AUTHORITY["EPSG","{datum_code}"]],PRIMEM["Greenwich",0,AUTHORITY["EPSG","8901"]],'
        f'UNIT["degree",0.0174532925199433,AUTHORITY["EPSG","9122"]],AUTHORITY["EPSG","{code}"]]'
    )


def wkt_of_epsg(code: int) -> Optional[str]:
    """WKT1 (as GDAL writes it) for the EPSG codes :func:`epsg_of` gives: pyproj's when it is installed, else
    written here."""
    try:
        import pyproj
    except ImportError:
        pass
    else:
        try:
            return str(pyproj.CRS.from_epsg(code).to_wkt(version="WKT1_GDAL"))
        except Exception:  # pragma: no cover - an incomplete PROJ database: fall back to the text below
            pass
    for key, (name, *_rest, geog_code, (north_base, south_base)) in _GEOG.items():
        if code == geog_code:
            return _geogcs(key)
        for base, hemisphere in ((north_base, "N"), (south_base, "S")):
            if base is not None and base < code <= base + 60:
                zone = code - base
                return (
                    f'PROJCS["{name} / UTM zone {zone}{hemisphere}",{_geogcs(key)},PROJECTION["Transverse_Mercator"],'
                    f'PARAMETER["latitude_of_origin",0],PARAMETER["central_meridian",{6 * zone - 183}],'
                    f'PARAMETER["scale_factor",0.9996],PARAMETER["false_easting",500000],'
                    f'PARAMETER["false_northing",{10000000 if hemisphere == "S" else 0}],'
                    f'UNIT["metre",1,AUTHORITY["EPSG","9001"]],AXIS["Easting",EAST],AXIS["Northing",NORTH],'
                    f'AUTHORITY["EPSG","{code}"]]'
                )
    return None


def crs_wkt(map_info: Optional[MapInfo], coordinate_system_string: Optional[str]) -> Optional[str]:
    """The CRS as WKT: the header's ``coordinate system string`` when present, else derived from the map info."""
    if coordinate_system_string and coordinate_system_string.strip().strip("{}").strip():
        return coordinate_system_string.strip().strip("{}").strip()
    if map_info is None:
        return None
    code = epsg_of(map_info)
    return None if code is None else wkt_of_epsg(code)
