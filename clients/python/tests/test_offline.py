"""What needs no server: to_xarray, the request bodies the client builds."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys

import numpy as np
import pytest

import hypermnf
from hypermnf._inputs import build_upload
from hypermnf._params import Params

META = {"eigenvalues": [9.0, 5.0, 3.0, 1.5, 1.0], "snr": [8.0, 4.0, 2.0, 0.5, 0.0], "bands_used": [0, 1, 2, 4, 5], "noise": "mean-filter"}


def test_to_xarray_components() -> None:
    xr = pytest.importorskip("xarray")
    result = np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)
    da = hypermnf.to_xarray(result, META)
    assert isinstance(da, xr.DataArray)
    assert da.dims == ("line", "sample", "component")
    assert list(da.component.values) == [0, 1, 2]
    assert list(da.eigenvalue.values) == [9.0, 5.0, 3.0]
    assert list(da.snr.values) == [8.0, 4.0, 2.0]
    assert da.attrs["noise"] == "mean-filter"
    np.testing.assert_array_equal(da.values, result)
    assert da.sel(component=1).shape == (2, 3)


def test_to_xarray_denoised_and_errors() -> None:
    pytest.importorskip("xarray")
    da = hypermnf.to_xarray(np.zeros((2, 2, 6), np.float32) + 1, META, product="denoised")
    assert da.dims == ("line", "sample", "band")
    with pytest.raises(ValueError):
        hypermnf.to_xarray(np.ones((2, 2, 9), np.float32), META)  # more components than eigenvalues
    with pytest.raises(ValueError):
        hypermnf.to_xarray(np.ones((2, 2), np.float32), META)


def test_to_xarray_without_xarray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xarray", None)  # makes `import xarray` fail
    with pytest.raises(ImportError, match=r"pip install 'hypermnf\[xarray\]'"):
        hypermnf.to_xarray(np.ones((2, 2, 3), np.float32), META)


def test_array_body_is_a_valid_npy_of_the_same_array() -> None:
    cube = np.arange(4 * 5 * 6, dtype=">i2").reshape(4, 5, 6)[:, ::-1, :]  # strided, big-endian
    upload = build_upload(cube, Params.build(7, None, "mean-filter", False, None, None, None, None))
    kwargs = upload.kwargs
    body = b"".join(kwargs["content"])
    assert kwargs["headers"]["Content-Length"] == str(len(body))
    assert kwargs["headers"]["Content-Type"] == "application/x-npy"
    # big-endian: sent as held, with the body's SHA-256 (the server's content digest is of little-endian samples)
    assert kwargs["headers"]["X-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert "X-Cube-Digest" not in kwargs["headers"]
    back = np.load(io.BytesIO(body), allow_pickle=False)
    np.testing.assert_array_equal(back, cube)
    assert back.dtype == cube.dtype
    assert kwargs["params"] == {"components": "7", "noise": "mean-filter"}


def test_little_endian_array_is_sent_canonical_with_its_content_digest() -> None:
    # The same array as the server's `content_digest_of_a_small_cube_is_pinned` (src/api/upload.rs), the same value.
    cube = np.arange(24, dtype="<i2").reshape(2, 3, 4)
    kwargs = build_upload(cube, Params.build(2, None, "mean-filter", False, None, None, None, None)).kwargs
    body = b"".join(kwargs["content"])
    assert kwargs["headers"]["X-Cube-Digest"] == "53b149a83047525a93da71e975a5269557f6f44851f32aeaf51fab90631e7db7"
    assert "X-Content-SHA256" not in kwargs["headers"]
    saved = io.BytesIO()
    np.save(saved, cube)
    assert body == saved.getvalue()  # NumPy writes the canonical header too


def test_cube_digest_over_several_leaves_follows_the_definition() -> None:
    from hypermnf._npy import LEAF_BYTES, TREE_TAG

    cube = np.random.default_rng(3).integers(-3000, 3000, size=(97, 128, 301)).astype("<i2")  # 7.5 MB: two leaves
    kwargs = build_upload(cube, Params.build(2, None, "mean-filter", False, None, None, None, None)).kwargs
    body = b"".join(kwargs["content"])
    leaves = b"".join(hashlib.sha256(body[i : i + LEAF_BYTES]).digest() for i in range(0, len(body), LEAF_BYTES))
    want = hashlib.sha256(TREE_TAG + len(body).to_bytes(8, "little") + leaves).hexdigest()
    assert kwargs["headers"]["X-Cube-Digest"] == want


def test_query_and_json_spelling_of_every_parameter() -> None:
    p = Params.build(hypermnf.client.DEFAULT_COMPONENTS, 2.5, "shift-difference", True, [3, 1], -9999, (1, 2, 30, 40), "cpu")
    assert p.to_json() == {
        "snr": 2.5, "noise": "shift-difference", "inverse": True, "bad_bands": [3, 1],
        "ignore_value": -9999.0, "noise_window": [1, 2, 30, 40], "backend": "cpu",
    }
    assert p.to_query() == {
        "snr": "2.5", "noise": "shift-difference", "inverse": "true", "bad_bands": "3,1",
        "ignore_value": "-9999.0", "noise_window": "1,2,30,40", "backend": "cpu",
    }
    # An explicit components=10 is sent even with snr (and the server refuses the pair).
    assert Params.build(10, 2.5, None, False, None, None, None, None).to_json() == {"components": 10, "snr": 2.5}
    assert Params.build(np.int64(3), None, None, False, [np.int32(2)], None, None, None).to_json() == {
        "components": 3, "bad_bands": [2]}


def test_href_body() -> None:
    upload = build_upload("file:///data/x.hdr", Params.build(4, None, None, True, None, None, None, None))
    assert json.loads(upload.kwargs["content"]) == {"input": {"href": "file:///data/x.hdr"}, "params": {"components": 4, "inverse": True}}


def test_ortho_is_sent_only_when_asked() -> None:
    p = Params.build(4, None, None, False, None, None, None, None)
    assert "ortho" not in p.to_json()
    o = dataclasses.replace(p, ortho=True)
    assert o.to_json() == {"components": 4, "ortho": True}
    assert o.to_query() == {"components": "4", "ortho": "true"}
    upload = build_upload("file:///data/granule.nc", o)
    assert json.loads(upload.kwargs["content"])["params"] == {"components": 4, "ortho": True}


def test_envi_upload_is_streamed_from_disk() -> None:
    import httpx

    from conftest import CUBES

    header = CUBES[0]
    upload = build_upload(header, Params.build(3, None, None, False, None, None, None, None))
    with upload.files:
        request = httpx.Request("POST", "http://x/v1/jobs", **upload.kwargs)
        chunks = [len(c) for c in request.stream]
    data = header.with_suffix(".img").stat().st_size
    assert int(request.headers["Content-Length"]) == sum(chunks) > data
    assert max(chunks) <= 1 << 20, "the data file is sent in pieces, never read whole"
    assert len(chunks) > data // (1 << 20)


# -- reading a streamed .npy result (hypermnf._npy.read_npy_stream, behind Job.result) --------------------


def _npy_bytes(array: np.ndarray) -> bytes:
    saved = io.BytesIO()
    np.save(saved, array, allow_pickle=False)
    return saved.getvalue()


def _split(data: bytes, sizes: list) -> list:
    """``data`` cut into chunks of the given sizes, cycled (a 0 makes an empty chunk)."""
    chunks, at, i = [], 0, 0
    while at < len(data):
        n = sizes[i % len(sizes)]
        chunks.append(data[at : at + n])
        at, i = at + n, i + 1
    return chunks


STREAM_ARRAYS = {
    "float32 C": np.random.default_rng(1).normal(size=(7, 5, 3)).astype(np.float32),
    "big-endian int16": np.arange(60, dtype=">i2").reshape(3, 4, 5),
    "fortran order": np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),
    "nan and inf": np.array([[np.nan, np.inf], [-np.inf, -0.0]], dtype=np.float32),
    "0-d": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 4, 3), dtype=np.float32),
    "structured": np.array([(1, 2.0), (3, 4.0)], dtype=[("a", "<i4"), ("b", ">f8")]),
}


@pytest.mark.parametrize("sizes", [[1], [3, 7, 0, 1], [64], [5000], [1 << 20]], ids=lambda s: ",".join(map(str, s)))
@pytest.mark.parametrize("name", list(STREAM_ARRAYS))
def test_streamed_npy_equals_np_load(name: str, sizes: list) -> None:
    from hypermnf._npy import read_npy_stream

    body = _npy_bytes(STREAM_ARRAYS[name])
    want = np.load(io.BytesIO(body), allow_pickle=False)
    for expected_length in (None, len(body)):
        got = read_npy_stream(iter(_split(body, sizes)), expected_length)  # chunks that split the preamble too
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes(order="A") == want.tobytes(order="A")  # bit for bit, NaNs and -0.0 included
        assert got.flags.c_contiguous == want.flags.c_contiguous and got.flags.f_contiguous == want.flags.f_contiguous
        assert got.flags.writeable and got.flags.owndata


def test_streamed_npy_versions_2_and_3() -> None:
    from hypermnf._npy import read_npy_stream

    array = np.arange(30, dtype="<f4").reshape(2, 3, 5)
    preamble = io.BytesIO()
    np.lib.format.write_array_header_2_0(preamble, np.lib.format.header_data_from_array_1_0(array))
    body = preamble.getvalue() + array.tobytes()
    assert body[6:8] == b"\x02\x00"
    np.testing.assert_array_equal(read_npy_stream(_split(body, [5]), len(body)), array)
    with pytest.warns(UserWarning, match="3.0"):
        body = _npy_bytes(np.arange(4, dtype="<f4").view([("\u540d", "<f4")]))  # a non-latin-1 name: version 3.0
    assert body[6:8] == b"\x03\x00"
    got = read_npy_stream(_split(body, [9]), len(body))
    assert got.dtype.names == ("\u540d",) and list(got["\u540d"]) == [0.0, 1.0, 2.0, 3.0]


def test_truncated_npy_stream_says_how_much_arrived() -> None:
    from hypermnf._npy import ShortBody, read_npy_stream

    body = _npy_bytes(np.ones((10, 10, 3), dtype=np.float32))
    with pytest.raises(ShortBody, match=rf"ended after {len(body) - 7} of {len(body)} bytes") as info:
        read_npy_stream(_split(body[:-7], [100]))
    assert (info.value.received, info.value.expected) == (len(body) - 7, len(body))
    with pytest.raises(ShortBody, match="ended after 50 of"):  # inside the preamble
        read_npy_stream([body[:20], body[20:50]], len(body))
    with pytest.raises(ShortBody, match="ended after 0 bytes"):
        read_npy_stream([])
    assert issubclass(ShortBody, ValueError)


def test_overlong_npy_stream_is_an_error() -> None:
    from hypermnf._npy import read_npy_stream

    body = _npy_bytes(np.ones((4, 4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=f"more than the {len(body)} bytes"):
        read_npy_stream(_split(body + b"\0", [33]))


def test_npy_size_is_checked_against_the_body_length_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    import hypermnf._npy as npy

    def no_allocation(*args: object, **kwargs: object) -> None:
        raise AssertionError("allocated before checking the size")

    # A header promising 4 EB: refused for disagreeing with the announced length, before np.empty is called.
    preamble = npy.canonical_header("<f4", (1 << 20, 1 << 20, 1 << 20))
    monkeypatch.setattr(npy.np, "empty", no_allocation)
    with pytest.raises(ValueError, match=r"the body is 1000 bytes but its \.npy header .* promises"):
        npy.read_npy_stream(iter([preamble, b"\0" * (1000 - len(preamble))]), 1000)
    body = _npy_bytes(np.ones((3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="promises"):
        npy.read_npy_stream([body], len(body) + 1)


def _preamble(header: str, version: bytes = b"\x01\x00") -> bytes:
    """A .npy preamble around ``header`` (the dict's text), with the right header length."""
    text = (header + "\n").encode("latin1")
    return b"\x93NUMPY" + version + len(text).to_bytes(2 if version[0] == 1 else 4, "little") + text


@pytest.mark.parametrize(
    "body,match",
    [
        (b"hello, this is not an npy file", "not a .npy"),
        (b"\x93NUMPY\x09\x00\x10\x00", "unsupported .npy version 9.0"),
        (b"\x93NUMPY\x02\x00\xff\xff\xff\x7f", "refused"),
        (_preamble("[1, 2]"), "not a dict"),
        (_preamble("{'descr': "), "cannot parse"),
        (_preamble("__import__('os').system('false')"), "cannot parse"),
        (_preamble("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2), }"), "invalid shape"),
        (_preamble("{'descr': '<f4', 'fortran_order': False, 'shape': [1, 2], }"), "invalid shape"),
        (_preamble("{'descr': '<f4', 'fortran_order': 0, 'shape': (1, 2), }"), "fortran_order"),
        (_preamble("{'descr': '<zz', 'fortran_order': False, 'shape': (1, 2), }"), "invalid descr"),
        (_preamble("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), 'x': 1}"), "not a dict"),
    ],
    ids=["garbage", "version", "huge header", "list", "syntax", "code", "negative", "list shape", "fortran", "descr", "extra key"],
)
def test_malformed_npy_preamble_is_a_clear_value_error(body: bytes, match: str) -> None:
    from hypermnf._npy import read_npy_stream

    with pytest.raises(ValueError, match=match):
        read_npy_stream(_split(body + b"\0" * 64, [3]))


def test_npy_of_python_objects_is_refused_unread() -> None:
    from hypermnf._npy import read_npy_stream

    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        read_npy_stream([pickled.getvalue()])
    nested = io.BytesIO()
    np.save(nested, np.array([(1, None)], dtype=[("a", "<i4"), ("b", "O")]), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        read_npy_stream([nested.getvalue()])


def test_load_npy_still_parses_whole_bytes() -> None:
    from hypermnf._npy import load_npy

    array = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    np.testing.assert_array_equal(load_npy(_npy_bytes(array)), array)


# -- ignore_value=nan (issue 34) ------------------------------------------------------------------------------


def test_ignore_value_nan_is_spelt_nan() -> None:
    p = Params.build(4, None, None, False, None, float("nan"), None, None)
    assert p.to_query() == {"components": "4", "ignore_value": "nan"}
    assert p.to_json() == {"components": 4, "ignore_value": "nan"}
    assert Params.build(4, None, None, False, None, np.float32("nan"), None, None).to_query()["ignore_value"] == "nan"
    # JSON bodies: the string "nan" (NaN is no JSON number).
    href = build_upload("file:///data/x.hdr", p)
    assert json.loads(href.kwargs["content"])["params"] == {"components": 4, "ignore_value": "nan"}
    from conftest import CUBES

    multipart = build_upload(CUBES[0], p)
    with multipart.files:
        (params_part,) = [f for f in multipart.kwargs["files"] if f[0] == "params"]
    assert json.loads(params_part[1][1]) == {"components": 4, "ignore_value": "nan"}
    assert build_upload(np.ones((2, 2, 2), np.float32), p).kwargs["params"]["ignore_value"] == "nan"
    # Other numbers as before; snr stays a number.
    assert Params.build(4, None, None, False, None, -9999, None, None).to_json()["ignore_value"] == -9999.0
    with pytest.raises(ValueError):
        Params.build(4, float("nan"), None, False, None, None, None, None)


# -- to_xarray: coordinates from the metadata's source (issue 34) ------------------------------------------


def _meta(source: dict, lines: int = 4, samples: int = 5, bands: int = 6) -> dict:
    return {**META, "input": {"lines": lines, "samples": samples, "bands": bands}, "components": 3, "source": source}


def test_to_xarray_map_coordinates_of_a_north_up_grid() -> None:
    pytest.importorskip("xarray")
    # Reference pixel (2.5, 3.5): the centre of line 2, sample 1; 30 m pixels; UTM 13 South on WGS-84.
    meta = _meta({"map_info": "UTM, 2.5, 3.5, 500000.0, 7000000.0, 30.0, 30.0, 13, South, WGS-84, units=Meters"})
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), meta)
    np.testing.assert_array_equal(da.x.values, 500000.0 + 30.0 * (np.arange(5) - 1))
    np.testing.assert_array_equal(da.y.values, 7000000.0 - 30.0 * (np.arange(4) - 2))
    assert da.x.dims == ("sample",) and da.y.dims == ("line",)
    wkt = da.attrs["crs_wkt"]
    assert "32713" in wkt and "10000000" in wkt, wkt  # southern hemisphere: false northing 10,000,000 m
    assert da.spatial_ref.attrs["GeoTransform"].split() == ["499955.0", "30.0", "0.0", "7000075.0", "0.0", "-30.0"]
    np.testing.assert_array_equal(da.line.values, np.arange(4))
    np.testing.assert_array_equal(da.sample.values, np.arange(5))


@pytest.mark.parametrize("map_info, epsg", [
    ("UTM, 1, 1, 0, 0, 1, 1, 13, North, WGS-84", "32613"),
    ("UTM, 1, 1, 0, 0, 1, 1, 33, North, North America 1983", "26933"),
    ("UTM, 1, 1, 0, 0, 1, 1, 17, North, North America 1927", "26717"),
    ("UTM, 1, 1, 0, 0, 1, 1, 17, North, units=Meters", "26717"),  # no datum: NAD27, as GDAL reads it
    ("Geographic Lat/Lon, 1, 1, -122.5, 37.5, 0.001, 0.001, WGS-84, units=Degrees", "4326"),
    ("Geographic Lat/Lon, 1, 1, -122.5, 37.5, 0.001, 0.001", "4326"),
])
def test_to_xarray_crs_from_a_map_info(map_info: str, epsg: str) -> None:
    pytest.importorskip("xarray")
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), _meta({"map_info": map_info}))
    assert f'"{epsg}"' in da.attrs["crs_wkt"] or f",{epsg}]" in da.attrs["crs_wkt"], da.attrs["crs_wkt"]


def test_to_xarray_unknown_projection_keeps_the_grid_without_a_crs() -> None:
    pytest.importorskip("xarray")
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), _meta({"map_info": "Arbitrary, 1, 1, 10, 20, 2, 2, units=Meters"}))
    np.testing.assert_array_equal(da.x.values, 10.0 + 2.0 * (np.arange(5) + 0.5))
    assert "crs_wkt" not in da.attrs and "crs_wkt" not in da.spatial_ref.attrs
    # A map info that is not one: no map coordinates at all.
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), _meta({"map_info": "UTM, nonsense"}))
    assert "x" not in da.coords and "spatial_ref" not in da.coords


def test_to_xarray_rotated_grid() -> None:
    pytest.importorskip("xarray")
    from hypermnf._geo import MapInfo

    # Reference pixel (1.5, 1.5) = the centre of the first pixel; rotated 90° counter-clockwise, so that
    # samples go north and lines go east.
    meta = _meta({"map_info": "UTM, 1.5, 1.5, 1000.0, 2000.0, 10.0, 20.0, 13, North, WGS-84, rotation=90.0"})
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), meta)
    assert da.x.dims == ("line", "sample")
    line, sample = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
    np.testing.assert_allclose(da.x.values, 1000.0 + 20.0 * line, atol=1e-9)
    np.testing.assert_allclose(da.y.values, 2000.0 + 10.0 * sample, atol=1e-9)
    # 180°: upside down, read as GDAL reads it (lines flipped, no rotation).
    flipped = MapInfo.parse("{UTM, 1, 1, 100, 200, 1, 1, 13, North, WGS-84, rotation=180}")
    assert flipped.geotransform() == (100.0, 1.0, 0.0, 200.0, 0.0, 1.0)


def test_to_xarray_bands_of_the_denoised_cube_and_a_reduction() -> None:
    pytest.importorskip("xarray")
    source = {"wavelength": [400.0, 500.0, 600.0, 700.0, 800.0, 900.0], "wavelength_units": "nm",
              "fwhm": [10.0] * 6, "band_names": list("abcdef"), "description": "a scene"}
    meta = _meta(source)
    denoised = hypermnf.to_xarray(np.ones((4, 5, 6), np.float32), meta, product="denoised")
    np.testing.assert_array_equal(denoised.band.values, np.arange(6))
    np.testing.assert_array_equal(denoised.wavelength.values, source["wavelength"])
    assert denoised.wavelength.attrs["units"] == "nm" and list(denoised.band_name.values) == list("abcdef")
    assert denoised.attrs["description"] == "a scene"
    # Wavelengths that do not match the bands are left out rather than misplaced.
    short = _meta({**source, "wavelength": [400.0, 500.0]})
    assert "wavelength" not in hypermnf.to_xarray(np.ones((4, 5, 6), np.float32), short, product="denoised").coords
    # A Reduction carries its metadata and its product.
    r = hypermnf.Reduction.from_metadata(meta, np.ones((4, 5, 3), np.float32))
    np.testing.assert_array_equal(r.wavelengths, [400.0, 500.0, 600.0, 800.0, 900.0])  # bands_used 0, 1, 2, 4, 5
    assert hypermnf.to_xarray(r).dims == ("line", "sample", "component")
    assert r.to_xarray().dims == ("line", "sample", "component")
    rd = hypermnf.Reduction.from_metadata(meta, np.ones((4, 5, 6), np.float32), product="denoised")
    assert rd.components is None and hypermnf.to_xarray(rd).dims == ("line", "sample", "band")
    with pytest.raises(ValueError, match="holds the denoised"):
        hypermnf.to_xarray(rd, product="components")


def test_to_xarray_writes_the_crs_with_rioxarray_when_installed() -> None:
    pytest.importorskip("rioxarray")
    meta = _meta({"map_info": "UTM, 1, 1, 500000.0, 4000000.0, 30.0, 30.0, 13, North, WGS-84"})
    da = hypermnf.to_xarray(np.zeros((4, 5, 3), np.float32), meta)
    assert da.rio.crs.to_epsg() == 32613
    assert tuple(da.rio.transform(recalc=False))[:6] == (30.0, 0.0, 500000.0, 0.0, -30.0, 4000000.0)


# -- plot_eigenvalues (issue 34) --------------------------------------------------------------------------


def test_plot_eigenvalues_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install 'hypermnf\[plot\]'"):
        hypermnf.plot_eigenvalues(META)
    with pytest.raises(TypeError, match="Job, a Reduction or a metadata dict"):
        hypermnf.plot_eigenvalues([9.0, 5.0])


def test_plot_eigenvalues_of_a_metadata_dict() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = hypermnf.plot_eigenvalues({**META, "components": 2})
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), META["eigenvalues"])
    assert ax.get_yscale() == "log"
    import matplotlib.pyplot as plt

    plt.close("all")


# -- inputs a notebook holds (issue 34) ----------------------------------------------------------------


def test_a_spectral_python_bip_image_is_sent_from_its_memory_map() -> None:
    spectral = pytest.importorskip("spectral")
    from conftest import CUBES
    from envi import read_cube
    from hypermnf._inputs import prepare
    from hypermnf._npy import as_cube

    for header in CUBES:
        prepared = prepare(spectral.open_image(str(header)))
        assert isinstance(prepared.cube, np.memmap)
        np.testing.assert_array_equal(prepared.cube, read_cube(header))
        sent = as_cube(prepared.cube)
        # BIP is already (lines, samples, bands) in C order: sent from the map itself, never copied.
        assert np.shares_memory(sent, prepared.cube) == header.stem.endswith(("bip", "bip_be"))
    jasper = next(c for c in CUBES if c.stem.startswith("jasper"))
    prepared = prepare(spectral.open_image(str(jasper)))
    assert prepared.source["band_names"][:2] == ["AVIRIS channel 4", "AVIRIS channel 5"]
    assert prepared.ignore_value is None and prepared.bad_bands == []


def _geotiff_module(name: str):
    """rasterio or osgeo.gdal, to write a test GeoTIFF. Missing, the test is skipped, unless
    HYPERMNF_REQUIRE_GDAL_PY=1 (scripts/ci-python.sh, which installs rasterio with the test extra)
    requires at least one of them: then the test fails rather than skips when neither is there."""
    pytest.importorskip("xarray")
    try:
        __import__(name)
        return sys.modules[name]
    except ImportError:
        pass
    if os.environ.get("HYPERMNF_REQUIRE_GDAL_PY") == "1" and not any(_importable(m) for m in ("rasterio", "osgeo.gdal")):
        pytest.fail("HYPERMNF_REQUIRE_GDAL_PY=1 but neither rasterio nor osgeo (GDAL's Python bindings) is installed")
    pytest.skip(f"{name} is not installed")


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _write_geotiff(writer: str, path: str, values: np.ndarray, gt: tuple, epsg: int, tags: dict) -> None:
    """values (line, sample, component) as a float32 GeoTIFF with bands `MNF k`, written with `writer`."""
    lines, samples, k = values.shape
    if writer == "rasterio":
        rasterio = _geotiff_module("rasterio")
        from rasterio.crs import CRS
        from rasterio.transform import Affine

        with rasterio.open(path, "w", driver="GTiff", width=samples, height=lines, count=k, dtype="float32",
                           crs=CRS.from_epsg(epsg), transform=Affine.from_gdal(*gt)) as ds:
            ds.update_tags(**tags)
            for b in range(k):
                ds.write(values[:, :, b], b + 1)
                ds.set_band_description(b + 1, f"MNF {b + 1}")
        return
    gdal = _geotiff_module("osgeo.gdal")
    from osgeo import osr

    ds = gdal.GetDriverByName("GTiff").Create(path, samples, lines, k, gdal.GDT_Float32)
    ds.SetGeoTransform(gt)
    srs = osr.SpatialReference()
    srs.ImportFromEPSG(epsg)
    ds.SetProjection(srs.ExportToWkt())
    ds.SetMetadata(tags)
    for b in range(k):
        band = ds.GetRasterBand(b + 1)
        band.WriteArray(values[:, :, b])
        band.SetDescription(f"MNF {b + 1}")
    ds = None


@pytest.mark.parametrize("writer", ["rasterio", "osgeo"])
def test_cog_to_xarray_takes_x_y_and_the_crs_from_the_geotiff(tmp_path, writer: str) -> None:
    """A GeoTIFF result as hypermnf writes it (bands `MNF k`, MNF_EIGENVALUES, a UTM CRS, a rotated
    geotransform), written with rasterio or GDAL's bindings (each case skipped without its module, unless
    HYPERMNF_REQUIRE_GDAL_PY=1 and neither is there) and read back with whichever cog_to_xarray finds."""
    path = str(tmp_path / "mnf.tif")
    values = np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2)  # (line, sample, component)
    gt = (500000.0, 30.0, 3.0, 4000000.0, 2.0, -30.0)
    _write_geotiff(writer, path, values, gt, 32633, {"MNF_EIGENVALUES": "9,5", "MNF_SNR": "8,4"})
    da = hypermnf.cog_to_xarray(path)
    assert da.dims == ("line", "sample", "component")
    np.testing.assert_array_equal(da.values, values)
    assert list(da.band_name.values) == ["MNF 1", "MNF 2"]
    assert list(da.eigenvalue.values) == [9.0, 5.0]
    # Pixel centres through the rotated transform: 2-D x and y.
    assert da.x.dims == ("line", "sample")
    assert float(da.x[1, 2]) == gt[0] + 2.5 * gt[1] + 1.5 * gt[2]
    assert float(da.y[1, 2]) == gt[3] + 2.5 * gt[4] + 1.5 * gt[5]
    assert "UTM zone 33N" in da.attrs["crs_wkt"]
