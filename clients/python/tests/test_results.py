"""The service's results equal `hypermnf run`'s, bit for bit, for the repo's three real AVIRIS cubes,
whichever way the cube is sent: as a NumPy array, as an ENVI .hdr upload, or as a file:// href.

The server caches by decoded cube and parameters, so after the array upload the same cube sent another way
is usually answered by the same job: equality then still proves that the other form decoded to exactly the
same values (a different decoding would be a different digest, hence a fresh job, compared all the same).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hypermnf
from conftest import CUBES, assert_same
from envi import read_cube

IDS = [c.stem for c in CUBES]


def test_the_three_real_cubes_are_there() -> None:
    # A missing tests/data would otherwise turn the parametrized tests below into zero tests.
    assert len(CUBES) == 3, CUBES


@pytest.mark.parametrize("header", CUBES, ids=IDS)
def test_array_upload_equals_cli(client: hypermnf.Client, cli, header: Path) -> None:
    expected = cli(header, "--components", "10")
    job = client.submit(read_cube(header), components=10, backend="cpu")
    job.wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)
    assert job.result().shape[2] == 10


@pytest.mark.parametrize("header", CUBES, ids=IDS)
def test_envi_upload_equals_cli(client: hypermnf.Client, cli, header: Path) -> None:
    expected = cli(header, "--components", "10")
    job = client.submit(header, components=10, backend="cpu")
    job.wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)


@pytest.mark.parametrize("header", CUBES, ids=IDS)
def test_href_equals_cli(client: hypermnf.Client, cli, header: Path) -> None:
    expected = cli(header, "--components", "10")
    job = client.submit(header.resolve().as_uri(), components=10, backend="cpu")
    job.wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)


@pytest.mark.parametrize("header", CUBES, ids=IDS)
def test_metadata_equals_cli(client: hypermnf.Client, cli, header: Path) -> None:
    expected = cli(header, "--components", "10")
    job = client.submit(header, components=10, backend="cpu").wait(timeout=300, progress=False)
    # Everything but the stage timings, which differ from run to run, the input's file layout (the same
    # decoded cube sent earlier as an array, test_array_upload_equals_cli, is a cache hit whose metadata
    # tells the layout of that first upload) and the service's note that the statistics were reused from
    # an earlier job of the same cube (the job cache's statistics level; the CLI never writes it).
    strip = lambda meta: {k: v for k, v in meta.items() if k not in ("timings_ms", "input", "statistics")}  # noqa: E731
    assert strip(job.metadata) == strip(expected.metadata)
    if "statistics" in job.metadata:
        assert job.metadata["statistics"]["reused"] is True
    shape = lambda meta: {k: meta["input"][k] for k in ("lines", "samples", "bands", "data_type")}  # noqa: E731
    assert shape(job.metadata) == shape(expected.metadata)
    assert job.metadata["components"] == 10
    eig = job.eigenvalues
    assert eig.dtype == np.float64 and eig.ndim == 1 and eig.size >= 10
    assert np.all(np.diff(eig) <= 0), "eigenvalues are sorted largest first"
    assert np.allclose(job.snr, eig - 1.0)
    bands = job.bands_used
    assert 10 <= len(bands) <= int(job.document["input"]["bands"])
    assert bands == sorted(set(bands))


def test_reduce_in_one_call(client: hypermnf.Client, cli) -> None:
    header = CUBES[0]
    expected = cli(header, "--components", "4")
    got = client.reduce(read_cube(header), components=4, backend="cpu", progress=False)
    assert_same(got, expected.components)


# Each parameter reaches the server with its meaning intact: the result equals the CLI's with the same flags,
# and differs from the CLI's without the parameter (so a parameter the client dropped would be caught).
# Each case is sent in the query string (array upload), in the multipart params part and in JSON (href).
# 376 is band 0's most common value in Salinas-A (368 pixels).
PARAM_CASES = [
    ({"snr": 2.0}, ["--snr", "2"], []),
    ({"components": 5, "noise": "shift-difference"}, ["--components", "5", "--noise", "shift-difference"], ["--components", "5"]),
    ({"components": 6, "bad_bands": [0, 1, 2, 100]}, ["--components", "6", "--bad-bands", "0,1,2,100"], ["--components", "6"]),
    ({"components": 3, "noise_window": (5, 10, 60, 70)}, ["--components", "3", "--noise-window", "5,10,60,70"], ["--components", "3"]),
    ({"components": 4, "ignore_value": 376.0}, ["--components", "4", "--ignore-value", "376"], ["--components", "4"]),
]


@pytest.mark.parametrize("form", ["array", "href", "envi"])
@pytest.mark.parametrize("params,flags,baseline", PARAM_CASES, ids=[",".join(p) for p, _, _ in PARAM_CASES])
def test_parameters_reach_the_server(client: hypermnf.Client, cli, params, flags, baseline, form: str) -> None:
    header = next(c for c in CUBES if c.stem.startswith("salinas"))
    expected = cli(header, *flags)
    without = cli(header, *baseline).components
    assert expected.components.shape != without.shape or not np.array_equal(expected.components, without, equal_nan=True)
    cube = {"array": lambda: read_cube(header), "href": header.resolve().as_uri, "envi": lambda: header}[form]()
    job = client.submit(cube, backend="cpu", **params).wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)


def test_snr_with_default_components_sends_only_snr(client: hypermnf.Client, cli) -> None:
    header = CUBES[1]
    expected = cli(header, "--snr", "5")
    job = client.submit(header, snr=5.0, backend="cpu").wait(timeout=300, progress=False)
    assert_same(job.result(), expected.components)


def test_inverse_gives_the_denoised_cube(client: hypermnf.Client, cli) -> None:
    header = CUBES[2]
    expected = cli(header, "--components", "8", "--inverse")
    assert expected.denoised is not None
    job = client.submit(header, components=8, inverse=True, backend="cpu").wait(timeout=300, progress=False)
    assert_same(job.result(product="denoised"), expected.denoised)
    assert_same(job.result(), expected.components)
    got = client.reduce(header, components=8, product="denoised", backend="cpu", progress=False)
    assert_same(got, expected.denoised)


def test_streamed_result_is_the_npy_the_server_sends(client: hypermnf.Client) -> None:
    # job.result() reads the body into one preallocated array; it must give what np.load of the whole body
    # gives, bit for bit, as a writable C-ordered array of its own, for both products.
    import io

    header = CUBES[2]
    job = client.submit(header, components=8, inverse=True, backend="cpu").wait(timeout=300, progress=False)
    for product in ("components", "denoised"):
        query = {} if product == "components" else {"product": product}
        body = client._request("GET", job._path("/result"), expect=(200,), params=query).content
        want = np.load(io.BytesIO(body), allow_pickle=False)
        got = job.result(product=product)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert got.flags.c_contiguous and got.flags.writeable and got.flags.owndata
