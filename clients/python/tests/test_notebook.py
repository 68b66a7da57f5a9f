"""What comes back is exactly what was asked (issue 34), against a live server: the cache flag after a wait,
`reduce(full=True)`, xarray coordinates from the source's header (bands, map coordinates, CRS), the inputs a
notebook holds (xarray, Spectral Python, an ENVI data file), quicklooks, the eigenvalue plot and NaN as
the no-data value.

The tests marked `needs_source` read the metadata's `source` member (the request's own ENVI header
metadata), and those marked `needs_nan_nodata` need `ignore_value=nan` and NaN pixels taken as no-data:
both are the server's from 2026-11-26 on."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import hypermnf
from conftest import CUBES, assert_same
from envi import read_cube, read_header
from test_jobs import textured_cube

JASPER = next(c for c in CUBES if c.stem.startswith("jasper"))  # BIL uint16, 100 x 100 x 198, with band names
SALINAS = next(c for c in CUBES if c.stem.startswith("salinas"))  # BIP big-endian int16
ABU = next(c for c in CUBES if c.stem.startswith("abu"))  # BSQ int16

# What the georeferenced copy of Jasper Ridge says (made up, but of the usual form).
WAVELENGTHS = [round(400.0 + 9.87 * i, 3) for i in range(198)]
FWHM = [round(9.5 + 0.01 * i, 3) for i in range(198)]
UTM_MAP_INFO = "UTM, 1.000, 1.000, 560025.000, 4140015.000, 1.7000000000e+01, 1.7000000000e+01, 10, North, WGS-84, units=Meters"
ESRI_WKT = (
    'PROJCS["WGS_1984_UTM_Zone_10N",GEOGCS["GCS_WGS_1984",DATUM["D_WGS_1984",SPHEROID["WGS_1984",6378137.0,298.257223563]],'
    'PRIMEM["Greenwich",0.0],UNIT["Degree",0.0174532925199433]],PROJECTION["Transverse_Mercator"],'
    'PARAMETER["False_Easting",500000.0],PARAMETER["False_Northing",0.0],PARAMETER["Central_Meridian",-123.0],'
    'PARAMETER["Scale_Factor",0.9996],PARAMETER["Latitude_Of_Origin",0.0],UNIT["Meter",1.0]]'
)

needs_source = pytest.mark.needs_source
needs_nan_nodata = pytest.mark.needs_nan_nodata


def envi_copy(tmp_path: Path, source: Path, extra: Dict[str, str]) -> Path:
    """A copy of the ENVI pair ``source`` with header fields ``extra`` appended; returns the new header."""
    header = tmp_path / source.name
    text = source.read_text().rstrip("\n") + "\n" + "".join(f"{k} = {v}\n" for k, v in extra.items())
    header.write_text(text)
    shutil.copyfile(source.with_suffix(".img"), header.with_suffix(".img"))
    return header


def braced(values: List) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


@pytest.fixture(scope="module")
def georeferenced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Jasper Ridge with wavelengths, FWHM, their units and a UTM map info in its header."""
    return envi_copy(tmp_path_factory.mktemp("geo"), JASPER, {
        "wavelength units": "Nanometers",
        "wavelength": braced(WAVELENGTHS),
        "fwhm": braced(FWHM),
        "map info": "{" + UTM_MAP_INFO + "}",
    })


# -- 1. job.cached after a refresh ---------------------------------------------------------------------


def test_cached_stays_true_after_wait_status_and_refresh(client: hypermnf.Client) -> None:
    cube = textured_cube(36, 28, 10, seed=340)
    first = client.submit(cube, components=3)
    first.wait(timeout=120, progress=False)
    assert first.cached is False
    again = client.submit(cube, components=3)
    assert again.id == first.id and again.cached is True
    assert again.wait(timeout=120, progress=False) is again
    assert again.cached is True, "wait() refreshed the job document and lost the submission's answer"
    assert again.status() == "succeeded" and again.cached is True
    again.refresh(wait=0.1)
    assert again.cached is True
    assert first.status() == "succeeded" and first.cached is False
    # A lookup is not a submission: nothing was answered from the cache.
    assert client.job(first.id).cached is False


# -- 2. reduce(full=True) ----------------------------------------------------------------------------


@needs_source
def test_reduce_full_returns_the_components_with_their_metadata(client: hypermnf.Client, cli, georeferenced: Path) -> None:
    expected = cli(georeferenced, "--components", "4", "--bad-bands", "0,5,17")
    plain = client.reduce(georeferenced, components=4, bad_bands=[0, 5, 17], progress=False)
    assert isinstance(plain, np.ndarray), "full=False (the default) keeps returning the array"
    r = client.reduce(georeferenced, components=4, bad_bands=[0, 5, 17], progress=False, full=True)
    assert isinstance(r, hypermnf.Reduction)
    assert_same(r.components, expected.components)
    assert_same(r.components, plain)
    assert r.denoised is None and r.k == 4
    meta = expected.metadata
    np.testing.assert_array_equal(r.eigenvalues, meta["eigenvalues"])
    np.testing.assert_array_equal(r.snr, meta["snr"])
    assert r.bands_used == meta["bands_used"] and not {0, 5, 17} & set(r.bands_used)
    assert r.wavelengths is not None and r.wavelengths.dtype == np.float64
    np.testing.assert_array_equal(r.wavelengths, np.asarray(WAVELENGTHS)[r.bands_used])
    assert r.metadata["components"] == 4 and r.metadata["transform"] == meta["transform"]
    assert r.source["wavelength_units"] == "Nanometers" and r.source["map_info"].startswith("UTM")
    assert client.job(r.job_id).id == r.job_id


@needs_source
def test_reduce_full_of_the_denoised_cube(client: hypermnf.Client, cli, georeferenced: Path) -> None:
    expected = cli(georeferenced, "--components", "5", "--inverse")
    r = client.reduce(georeferenced, components=5, product="denoised", progress=False, full=True)
    assert r.components is None
    assert_same(r.denoised, expected.denoised)
    np.testing.assert_array_equal(r.wavelengths, np.asarray(WAVELENGTHS)[r.bands_used])


def test_reduce_full_of_an_array_without_a_header_has_no_wavelengths(client: hypermnf.Client) -> None:
    cube = textured_cube(30, 24, 9, seed=341)
    r = client.reduce(cube, components=2, progress=False, full=True)
    assert r.wavelengths is None and r.components.shape == (30, 24, 2)
    assert r.source["wavelength"] is None


def test_reduce_refuses_an_unknown_product_before_sending(client: hypermnf.Client) -> None:
    sent = []
    client._http.event_hooks["request"].append(sent.append)
    with pytest.raises(ValueError, match="product"):
        client.reduce(textured_cube(10, 10, 5, seed=1), product="eigenvectors", full=True)
    assert sent == []


# -- 3. to_xarray: coordinates from the source ---------------------------------------------------------


def expected_utm_centres(lines: int, samples: int):
    # UTM_MAP_INFO: pixel (1, 1) (the upper left corner of the first pixel) is at (560025, 4140015), 17 m pixels.
    x = 560025.0 + (np.arange(samples) + 0.5) * 17.0
    y = 4140015.0 - (np.arange(lines) + 0.5) * 17.0
    return x, y


@needs_source
def test_to_xarray_of_a_georeferenced_cube(client: hypermnf.Client, georeferenced: Path) -> None:
    xr = pytest.importorskip("xarray")
    r = client.reduce(georeferenced, components=5, inverse=True, progress=False, full=True)
    job = client.job(r.job_id)
    da = hypermnf.to_xarray(r)
    assert isinstance(da, xr.DataArray) and da.dims == ("line", "sample", "component")
    np.testing.assert_array_equal(da.line.values, np.arange(100))
    np.testing.assert_array_equal(da.sample.values, np.arange(100))
    x, y = expected_utm_centres(100, 100)
    assert da.x.dims == ("sample",) and da.y.dims == ("line",)
    np.testing.assert_allclose(da.x.values, x, rtol=0, atol=1e-6)
    np.testing.assert_allclose(da.y.values, y, rtol=0, atol=1e-6)
    wkt = da.attrs["crs_wkt"]
    assert "UTM zone 10N" in wkt and "32610" in wkt
    # (rioxarray, when installed, writes its own spelling of the same CRS there)
    assert "32610" in da.spatial_ref.attrs["crs_wkt"] and "32610" in da.spatial_ref.attrs["spatial_ref"]
    assert [float(v) for v in da.spatial_ref.attrs["GeoTransform"].split()] == [560025.0, 17.0, 0.0, 4140015.0, 0.0, -17.0]
    assert da.attrs["map_info"] == UTM_MAP_INFO
    # The denoised cube: the source's bands along `band`.
    denoised = hypermnf.to_xarray(job.result(product="denoised"), job, product="denoised")
    assert denoised.dims == ("line", "sample", "band")
    np.testing.assert_array_equal(denoised.band.values, np.arange(198))
    np.testing.assert_array_equal(denoised.wavelength.values, WAVELENGTHS)
    assert denoised.wavelength.attrs["units"] == "Nanometers"
    np.testing.assert_array_equal(denoised.fwhm.values, FWHM)
    names = [n.strip() for n in read_header(JASPER)["band names"].strip("{}").split(",")]
    assert list(denoised.band_name.values) == names and names[0] == "AVIRIS channel 4"
    assert denoised.swap_dims(band="wavelength").sel(wavelength=WAVELENGTHS[3]).shape == (100, 100)
    np.testing.assert_allclose(denoised.x.values, x, atol=1e-6)
    assert denoised.attrs["crs_wkt"] == wkt


@needs_source
def test_to_xarray_takes_the_crs_from_the_coordinate_system_string(client: hypermnf.Client, tmp_path: Path) -> None:
    pytest.importorskip("xarray")
    header = envi_copy(tmp_path, JASPER, {
        "map info": "{UTM, 11.5, 21.5, 560212.0, 4139684.0, 17.0, 17.0, 10, North, WGS-84, units=Meters, rotation=30.0}",
        "coordinate system string": "{" + ESRI_WKT + "}",
    })
    job = client.submit(header, components=3).wait(timeout=300, progress=False)
    da = hypermnf.to_xarray(job.result(), job)
    assert da.attrs["crs_wkt"] == ESRI_WKT
    # Rotated 30°: 2-D coordinates; the reference pixel (file 11.5, 21.5) is the centre of line 20, sample 10.
    assert da.x.dims == ("line", "sample") and da.y.dims == ("line", "sample")
    assert (float(da.x[20, 10]), float(da.y[20, 10])) == pytest.approx((560212.0, 4139684.0), abs=1e-6)
    c, s = np.cos(np.radians(30.0)), np.sin(np.radians(30.0))
    step_sample = (float(da.x[20, 11] - da.x[20, 10]), float(da.y[20, 11] - da.y[20, 10]))
    step_line = (float(da.x[21, 10] - da.x[20, 10]), float(da.y[21, 10] - da.y[20, 10]))
    assert step_sample == pytest.approx((17.0 * c, 17.0 * s), abs=1e-6)
    assert step_line == pytest.approx((17.0 * s, -17.0 * c), abs=1e-6)


def test_to_xarray_of_a_cube_without_a_map_has_no_map_coordinates(client: hypermnf.Client) -> None:
    pytest.importorskip("xarray")
    job = client.submit(ABU, components=3).wait(timeout=300, progress=False)
    da = hypermnf.to_xarray(job.result(), job)
    assert set(da.coords) == {"line", "sample", "component", "eigenvalue", "snr"}
    assert "crs_wkt" not in da.attrs


# -- 4. what a notebook holds ----------------------------------------------------------------------------


def test_a_dataarray_is_sent_as_its_lines_samples_bands(client: hypermnf.Client) -> None:
    xr = pytest.importorskip("xarray")
    cube = read_cube(SALINAS)
    array_job = client.submit(cube, components=6).wait(timeout=300, progress=False)
    wavelengths = np.linspace(400.0, 2500.0, cube.shape[2])
    # Bands first, named "wavelength", and y/x: transposed to (lines, samples, bands) by the client.
    da = xr.DataArray(cube.transpose(2, 0, 1), dims=("wavelength", "y", "x"), coords={"wavelength": wavelengths})
    job = client.submit(da, components=6)
    assert job.id == array_job.id and job.cached, "the same cube, so the same job"
    assert_same(job.wait(timeout=300, progress=False).result(), array_job.result())
    # Named line/sample/band, in another order; and a band coordinate of names.
    names = [f"b{i}" for i in range(cube.shape[2])]
    da2 = xr.DataArray(cube.transpose(1, 2, 0), dims=("sample", "band", "line"), coords={"band": names})
    assert client.submit(da2, components=6).id == array_job.id
    # The DataArray's wavelengths reach the Reduction (an array upload has no header for the server to read).
    r = client.reduce(da, components=6, progress=False, full=True)
    np.testing.assert_array_equal(r.wavelengths, wavelengths[r.bands_used])
    assert r.source["band_names"] is None
    assert client.reduce(da2, components=6, progress=False, full=True).source["band_names"] == names


def test_a_dataarray_without_a_band_dimension_is_refused() -> None:
    xr = pytest.importorskip("xarray")
    client = hypermnf.Client("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="band dimension"):
        client.submit(xr.DataArray(np.ones((3, 4, 5), np.float32), dims=("a", "b", "c")))
    with pytest.raises(ValueError, match="3 dims"):
        client.submit(xr.DataArray(np.ones((3, 4), np.float32), dims=("y", "band")))


@pytest.mark.parametrize("header", CUBES, ids=[c.stem for c in CUBES])
def test_a_spectral_python_image_equals_cli(client: hypermnf.Client, cli, header: Path) -> None:
    spectral = pytest.importorskip("spectral")
    image = spectral.open_image(str(header))
    expected = cli(header, "--components", "7")
    job = client.submit(image, components=7).wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)
    assert job.metadata["bands_used"] == expected.metadata["bands_used"]


def test_a_spectral_python_image_keeps_its_bad_bands_and_no_data_value(client: hypermnf.Client, tmp_path: Path) -> None:
    spectral = pytest.importorskip("spectral")
    cube = read_cube(ABU)
    nodata = int(cube[7, 9, 0])  # a value that occurs: the pixels holding it in band 0 become no-data
    bbl = [0 if b in (2, 40, 41) else 1 for b in range(cube.shape[2])]
    header = envi_copy(tmp_path, ABU, {"bbl": braced(bbl), "data ignore value": str(nodata)})
    envi_job = client.submit(header, components=5).wait(timeout=300, progress=False)
    image = spectral.open_image(str(header))
    spy_job = client.submit(image, components=5).wait(timeout=300, progress=False)
    assert spy_job.metadata["pixels"]["masked"] == envi_job.metadata["pixels"]["masked"] > 0
    assert spy_job.bands_used == envi_job.bands_used and not {2, 40, 41} & set(spy_job.bands_used)
    assert_same(spy_job.result(), envi_job.result())
    # The caller's own no-data value wins over the header's.
    other = client.submit(image, components=5, ignore_value=-32768).wait(timeout=300, progress=False)
    assert other.metadata["pixels"]["masked"] == 0


def test_an_envi_data_file_is_sent_with_its_header(client: hypermnf.Client, cli, tmp_path: Path) -> None:
    by_header = client.submit(JASPER, components=4).wait(timeout=300, progress=False)
    by_data = client.submit(JASPER.with_suffix(".img"), components=4)
    assert by_data.id == by_header.id and by_data.cached
    # NAME.img.hdr beside NAME.img (the other ENVI naming), and a str path.
    tmp = tmp_path / "scene.img"
    shutil.copyfile(SALINAS.with_suffix(".img"), tmp)
    shutil.copyfile(SALINAS, tmp_path / "scene.img.hdr")
    job = client.submit(str(tmp), components=4).wait(timeout=300, progress=False)
    assert_same(job.result(), cli(SALINAS, "--components", "4").components)


# -- 5. quicklooks and the eigenvalue plot ---------------------------------------------------------------


def png_header(png: bytes):
    """(width, height, bit depth, colour type) from a PNG's IHDR chunk, checking its CRC."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:16]
    length, kind = struct.unpack(">I4s", png[8:16])
    assert kind == b"IHDR" and length == 13
    body = png[16:29]
    assert struct.unpack(">I", png[29:33])[0] == zlib.crc32(kind + body)
    width, height, depth, colour = struct.unpack(">IIBB", body[:10])
    return width, height, depth, colour


def test_preview_is_the_png_of_one_component(client: hypermnf.Client) -> None:
    cube = textured_cube(33, 47, 12, seed=342)
    job = client.submit(cube, components=3).wait(timeout=120, progress=False)
    first, second = job.preview(0), job.preview(component=2)
    assert png_header(first) == (47, 33, 8, 0)  # samples wide, lines high, 8-bit greyscale
    assert png_header(second) == (47, 33, 8, 0)
    assert first != second
    assert job.preview() == first
    with pytest.raises(hypermnf.APIError) as info:
        job.preview(3)  # only 3 components were kept
    assert info.value.status in (400, 404)
    with pytest.raises(TypeError):
        job.preview("1")


def test_plot_eigenvalues(client: hypermnf.Client) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    job = client.submit(textured_cube(30, 30, 14, seed=343), components=4).wait(timeout=120, progress=False)
    ax = hypermnf.plot_eigenvalues(job)
    curve = ax.lines[0]
    np.testing.assert_array_equal(curve.get_ydata(), job.eigenvalues)
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(1, job.eigenvalues.size + 1))
    assert ax.get_yscale() == "log"
    kept = [line for line in ax.lines if list(line.get_xdata()) == [4.5, 4.5]]
    assert kept, "the number of components kept is marked"
    assert ax.get_xlabel() == "component"
    # The same from the metadata dict, into given Axes, on a linear scale.
    fig, given = plt.subplots()
    assert hypermnf.plot_eigenvalues(job.metadata, ax=given, log=False) is given
    assert given.get_yscale() == "linear"
    np.testing.assert_array_equal(given.lines[0].get_ydata(), job.eigenvalues)
    plt.close("all")


# -- 9. NaN as the no-data value ----------------------------------------------------------------------------


def nan_cube() -> tuple:
    cube = textured_cube(40, 32, 10, seed=344).astype(np.float32)
    holes = [(3, 4), (10, 11), (39, 31), (20, 0)]
    for line, sample in holes:
        cube[line, sample, :] = np.nan
    cube[25, 7, 4] = np.nan  # one band of a pixel is enough
    return cube, holes + [(25, 7)]


def assert_masked_where_nan(job: hypermnf.Job, holes: list) -> None:
    assert job.metadata["pixels"]["masked"] == len(holes)
    result = job.result()
    masked = {(int(line), int(sample)) for line, sample in zip(*np.nonzero(np.isnan(result).any(axis=2)))}
    assert masked == set(holes)
    assert np.isnan(result[tuple(zip(*holes))]).all()


@needs_nan_nodata
def test_ignore_value_nan_reaches_the_server(client: hypermnf.Client, tmp_path: Path) -> None:
    cube, holes = nan_cube()
    sent: List[str] = []
    client._http.event_hooks["request"].append(lambda r: sent.append(str(r.url)) if r.method == "POST" else None)
    job = client.submit(cube, components=3, ignore_value=float("nan")).wait(timeout=120, progress=False)
    assert "ignore_value=nan" in sent[-1]
    assert_masked_where_nan(job, holes)
    # As an ENVI upload (JSON params: "ignore_value": "nan").
    header = tmp_path / "nan.hdr"
    header.write_text(
        "ENVI\nsamples = 32\nlines = 40\nbands = 10\nheader offset = 0\nfile type = ENVI Standard\n"
        "data type = 4\ninterleave = bip\nbyte order = 0\n"
    )
    cube.astype("<f4").tofile(tmp_path / "nan.img")
    envi_job = client.submit(header, components=3, ignore_value=np.nan).wait(timeout=120, progress=False)
    assert_masked_where_nan(envi_job, holes)
    assert_same(envi_job.result(), job.result())


@needs_nan_nodata
def test_nan_pixels_of_a_float_cube_are_no_data_by_default(client: hypermnf.Client) -> None:
    cube, holes = nan_cube()
    job = client.submit(cube, components=3, noise="shift-difference").wait(timeout=120, progress=False)
    assert_masked_where_nan(job, holes)
    assert_same(job.result(), client.reduce(cube, components=3, noise="shift-difference", ignore_value=float("nan"), progress=False))


# -- 6. the estimator that reproduces Spectral Python (README) ------------------------------------------------


def test_shift_difference_reproduces_spectral_python(client: hypermnf.Client) -> None:
    spectral = pytest.importorskip("spectral")
    image = spectral.open_image(str(ABU))
    X = np.asarray(image.load())  # float32 (lines, samples, bands), as Spectral Python reads it
    spy = spectral.mnf(spectral.calc_stats(X), spectral.noise_from_diffs(X))
    expected = spy.reduce(X, num=8)
    r = client.reduce(image, components=8, noise="shift-difference", progress=False, full=True)
    spy_eigenvalues = np.sort(spy.napc.eigenvalues)[::-1][: r.eigenvalues.size]
    np.testing.assert_allclose(r.eigenvalues, spy_eigenvalues, rtol=1e-4)
    for k in range(8):  # equal up to the sign of each component
        correlation = np.corrcoef(expected[..., k].ravel(), r.components[..., k].ravel())[0, 1]
        assert abs(correlation) > 0.9999, (k, correlation)
    # The default estimator (the mean filter) is another noise model: other eigenvalues.
    default = client.reduce(image, components=8, progress=False, full=True)
    assert not np.allclose(default.eigenvalues[:8], spy_eigenvalues[:8], rtol=1e-2)
