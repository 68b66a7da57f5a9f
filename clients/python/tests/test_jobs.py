"""Job life cycle through the client: the cache, looking jobs up, listing, waiting (with its bar, time-out,
failure and cancellation), downloading and deleting."""

from __future__ import annotations

import io
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

import numpy as np
import pytest

import hypermnf
from conftest import CUBES, assert_same


def textured_cube(lines: int, samples: int, bands: int, seed: int) -> np.ndarray:
    """A cube with spatially smooth signal in a few spectral shapes plus noise (never all zeros)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:lines, 0:samples].astype(np.float32)
    maps = np.stack([np.sin(x / 17.0 + i) * np.cos(y / 23.0 - i) for i in range(4)], axis=-1)
    spectra = rng.uniform(100, 1000, size=(4, bands)).astype(np.float32)
    cube = maps @ spectra + 2000.0 + rng.normal(0, 20, size=(lines, samples, bands)).astype(np.float32)
    return cube.astype(np.int16)


@pytest.fixture(scope="module")
def big_cube() -> np.ndarray:
    """Large enough (~130 MB, about a second of CPU work) to keep the server's one worker busy."""
    return textured_cube(640, 800, 128, seed=1)


@contextmanager
def queued_job(client: hypermnf.Client, cube: np.ndarray, components: int) -> Iterator[hypermnf.Job]:
    """A job that is still queued: it waits behind a job on ``cube`` that occupies the server's one
    worker (the fixture starts it with --workers 1). Both are canceled afterwards."""
    blocker = client.submit(cube, components=components)
    job = client.submit(cube, components=components + 1)
    try:
        yield job
    finally:
        for j in (job, blocker):
            if j.status() in ("queued", "running"):
                j.cancel()


def test_identical_request_returns_the_same_job_cached(client: hypermnf.Client) -> None:
    cube = textured_cube(40, 30, 12, seed=2)
    first = client.submit(cube, components=4)
    assert first.cached is False
    first.wait(timeout=120, progress=False)
    again = client.submit(cube.copy(), components=4)
    assert again.id == first.id
    assert again.cached is True
    other = client.submit(cube, components=5)
    assert other.id != first.id


def test_an_array_is_asked_for_without_its_body_first(client: hypermnf.Client) -> None:
    # Each POST's body length: a new job costs one empty request (409 body_needed from a server with no
    # GPU) before the body; a job the server has already needs no body at all.
    sent: List[int] = []
    client._http.event_hooks["request"].append(
        lambda r: sent.append(int(r.headers.get("content-length", "-1"))) if r.method == "POST" else None
    )
    cube = textured_cube(30, 20, 10, seed=21)
    saved = io.BytesIO()
    np.save(saved, np.ascontiguousarray(cube, dtype=cube.dtype.newbyteorder("<")))
    first = client.submit(cube, components=3)
    assert sent == [0, len(saved.getvalue())]
    first.wait(timeout=120, progress=False)
    sent.clear()
    again = client.submit(cube, components=3)
    assert (again.id, again.cached, sent) == (first.id, True, [0])


def test_job_lookup_and_status(client: hypermnf.Client) -> None:
    job = client.submit(textured_cube(30, 20, 10, seed=3), components=3)
    found = client.job(job.id)
    assert found.id == job.id
    assert found.status() in ("queued", "running", "succeeded")
    job.wait(timeout=120, progress=False)
    assert found.status() == "succeeded"
    assert found.progress == 1.0
    assert found.document["input"]["lines"] == 30
    assert found.document["input"]["samples"] == 20
    assert found.document["input"]["bands"] == 10
    assert repr(found) == f"<hypermnf.Job {job.id} succeeded>"


def test_unknown_job_is_a_404(client: hypermnf.Client) -> None:
    with pytest.raises(hypermnf.APIError) as info:
        client.job("01890000-0000-7000-8000-000000000000")
    assert info.value.status == 404
    assert info.value.code
    with pytest.raises(hypermnf.APIError) as info:
        client.job("not-a-job-id")
    assert info.value.status in (400, 404)


def test_jobs_lists_newest_first_and_filters(client: hypermnf.Client) -> None:
    made = [client.submit(textured_cube(20, 20, 8, seed=10 + i), components=2) for i in range(3)]
    for job in made:
        job.wait(timeout=120, progress=False)
    listed = [j.id for j in client.jobs()]
    positions = [listed.index(j.id) for j in made]
    assert positions == sorted(positions, reverse=True), "newest first"
    succeeded = client.jobs(status="succeeded")
    assert all(j.document["status"] == "succeeded" for j in succeeded)
    assert {j.id for j in made} <= {j.id for j in succeeded}
    assert not {j.id for j in made} & {j.id for j in client.jobs(status="failed")}
    assert len(client.jobs(limit=2)) == 2
    # With a limit, the client asks page by page and stops at the limit; without one it follows every page.
    assert [j.id for j in client.jobs(limit=len(listed))] == listed


def test_wait_times_out_then_cancel(client: hypermnf.Client, big_cube: np.ndarray) -> None:
    with queued_job(client, big_cube, components=6) as job:
        started = time.monotonic()
        with pytest.raises(hypermnf.TimeoutError) as info:
            job.wait(timeout=0.2, progress=False)
        assert time.monotonic() - started < 5
        assert isinstance(info.value, TimeoutError)
        assert job.id in str(info.value)
        job.cancel()
        with pytest.raises(hypermnf.JobCanceled) as canceled:
            job.wait(timeout=120, progress=False)
        assert canceled.value.job_id == job.id
        assert job.status() == "canceled"


def test_wait_is_a_long_poll(client: hypermnf.Client, big_cube: np.ndarray) -> None:
    """The server holds ``GET /v1/jobs/{id}?wait=`` until the job ends, so wait() sends one request per
    hold instead of polling: a queued job is answered after the hold, and waiting for a job queued
    behind about a second of work takes one or two requests (back-off polling would send about eight)."""
    with queued_job(client, big_cube, components=7) as job:
        started = time.monotonic()
        document = job.refresh(wait=0.3)
        if document["status"] == "queued":
            assert time.monotonic() - started >= 0.3
        sent: list = []
        hooks = client._http.event_hooks
        client._http.event_hooks = {"request": [sent.append], "response": []}
        try:
            job.wait(timeout=300, progress=False)
        finally:
            client._http.event_hooks = hooks
        assert job.document["status"] == "succeeded"
        assert 1 <= len(sent) <= 3, [str(r.url) for r in sent]
        assert all("wait=" in str(r.url) for r in sent)


def test_result_before_the_job_succeeded_is_not_ready(client: hypermnf.Client, big_cube: np.ndarray) -> None:
    with queued_job(client, big_cube, components=8) as job:
        with pytest.raises(hypermnf.APIError) as info:
            job.result()
        assert info.value.status == 409
        assert info.value.code == "not_ready"


def test_wait_shows_progress_and_stage(client: hypermnf.Client, capsys: pytest.CaptureFixture) -> None:
    job = client.submit(textured_cube(200, 160, 48, seed=4), components=5)
    job.wait(timeout=300, progress=True)
    err = capsys.readouterr().err
    if job.cached or "job " not in err:
        pytest.skip("the job finished before the first poll, so no bar was drawn")
    assert f"job {job.id[:8]}" in err
    assert "100%" in err


def test_failed_job_raises_job_failed(client: hypermnf.Client) -> None:
    # Every band constant: no band is left for the transform, which only the worker finds out.
    cube = np.full((16, 16, 6), 7, dtype=np.int16)
    job = client.submit(cube, components=2)
    with pytest.raises(hypermnf.JobFailed) as info:
        job.wait(timeout=120, progress=False)
    assert info.value.job_id == job.id
    assert info.value.code and info.value.code != "failed"
    assert info.value.message
    assert job.status() == "failed"


def test_download_npy_and_envi(client: hypermnf.Client, tmp_path: Path) -> None:
    job = client.submit(CUBES[0], components=3).wait(timeout=300, progress=False)
    npy = job.download(tmp_path / "c.npy")
    assert_same(np.load(npy), job.result())
    archive = job.download(tmp_path / "c.zip", format="envi")
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
    assert any(n.endswith(".hdr") for n in names) and any(n.endswith(".img") for n in names)


def test_denoised_without_inverse_is_an_error(client: hypermnf.Client) -> None:
    job = client.submit(textured_cube(20, 20, 8, seed=5), components=2).wait(timeout=120, progress=False)
    with pytest.raises(hypermnf.APIError) as info:
        job.result(product="denoised")
    assert info.value.status in (404, 409)


def test_bad_product_and_format_are_refused_locally(client: hypermnf.Client) -> None:
    job = client.submit(textured_cube(20, 20, 8, seed=5), components=2)
    with pytest.raises(ValueError):
        job.result(product="noise")
    with pytest.raises(ValueError):
        job.download("x", format="tiff")


def test_delete_a_finished_job(client: hypermnf.Client) -> None:
    job = client.submit(textured_cube(20, 20, 8, seed=6), components=2).wait(timeout=120, progress=False)
    job.delete()
    with pytest.raises(hypermnf.APIError) as info:
        job.status()
    assert info.value.status == 404


def test_info_health_and_xarray_from_a_job(client: hypermnf.Client) -> None:
    info = client.info()
    assert isinstance(info["version"], str) and info["version"]
    assert "cpu" in {b["name"] for b in info["backends"]}
    assert client.health() is True
    xr = pytest.importorskip("xarray")
    job = client.submit(CUBES[1], components=4).wait(timeout=300, progress=False)
    da = hypermnf.to_xarray(job.result(), job)
    assert isinstance(da, xr.DataArray) and da.dims == ("line", "sample", "component")
    np.testing.assert_array_equal(da.eigenvalue.values, job.eigenvalues[:4])
    assert da.attrs["components"] == 4
