"""What needs no server: to_xarray, the request bodies the client builds."""

from __future__ import annotations

import hashlib
import io
import json
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
