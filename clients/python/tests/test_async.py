"""hypermnf.AsyncClient against a live server: the same jobs and the same bytes as the blocking client,
for every form of cube, run concurrently on one event loop (asyncio.run; no pytest plugin)."""

from __future__ import annotations

import asyncio
import zipfile
from pathlib import Path

import numpy as np
import pytest

import hypermnf
from conftest import CUBES, Server, assert_same, free_port
from envi import read_cube
from test_jobs import textured_cube
from test_notebook import png_header


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=600))


def test_async_submit_wait_result_metadata_equal_the_blocking_client(server: Server, client: hypermnf.Client) -> None:
    cube = textured_cube(44, 36, 12, seed=3401)
    blocking = client.submit(cube, components=4).wait(timeout=120, progress=False)

    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            job = await ac.submit(cube, components=4)
            assert isinstance(job, hypermnf.AsyncJob)
            assert job.id == blocking.id and job.cached
            assert await job.wait(timeout=120, progress=False) is job
            assert job.cached, "wait() keeps the submission's answer"
            result = await job.result()
            with pytest.raises(RuntimeError, match="await job.metadata"):
                job.eigenvalues
            meta = await job.metadata()
            assert await job.status() == "succeeded"
            found = await ac.job(job.id)
            listed = await ac.jobs(status="succeeded", limit=1000)
            return result, meta, job.eigenvalues, job.bands_used, found, listed

    result, meta, eigenvalues, bands_used, found, listed = run(main())
    assert_same(result, blocking.result())
    assert meta == blocking.metadata
    np.testing.assert_array_equal(eigenvalues, blocking.eigenvalues)
    assert bands_used == blocking.bands_used
    assert found.id == blocking.id and found.document["status"] == "succeeded"
    assert blocking.id in {j.id for j in listed}


@pytest.mark.parametrize("form", ["array", "envi", "envi data file", "npy file", "href"])
def test_async_every_form_of_cube_equals_cli(server: Server, cli, tmp_path: Path, form: str) -> None:
    header = next(c for c in CUBES if c.stem.startswith("jasper"))
    expected = cli(header, "--components", "5")
    if form == "array":
        cube = read_cube(header)
    elif form == "envi":
        cube = header
    elif form == "envi data file":
        cube = header.with_suffix(".img")
    elif form == "npy file":
        cube = tmp_path / "cube.npy"
        np.save(cube, read_cube(header))
    else:
        cube = header.resolve().as_uri()

    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            return await ac.reduce(cube, components=5, progress=False)

    assert_same(run(main()), expected.components)


def test_async_jobs_run_concurrently_on_one_loop(server: Server, cli) -> None:
    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            jobs = await asyncio.gather(*(ac.submit(h, components=3) for h in CUBES))
            return await asyncio.gather(*(j.wait_result(timeout=300) for j in jobs))

    results = run(main())
    for header, result in zip(CUBES, results):
        assert_same(result, cli(header, "--components", "3").components)


def test_async_reduce_full_denoised_preview_download(server: Server, cli, tmp_path: Path) -> None:
    header = next(c for c in CUBES if c.stem.startswith("abu"))
    expected = cli(header, "--components", "6", "--inverse")

    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            r = await ac.reduce(header, components=6, product="denoised", progress=False, full=True)
            job = await ac.job(r.job_id)
            png = await job.preview(1)
            path = await job.download(tmp_path / "mnf.zip", format="envi")
            components = await job.result()
            return r, png, path, components

    r, png, path, components = run(main())
    assert isinstance(r, hypermnf.Reduction) and r.components is None
    assert_same(r.denoised, expected.denoised)
    np.testing.assert_array_equal(r.eigenvalues, expected.metadata["eigenvalues"])
    assert r.bands_used == expected.metadata["bands_used"]
    assert png_header(png)[:2] == (150, 150)
    assert sorted(n.rsplit(".", 1)[-1] for n in zipfile.ZipFile(path).namelist()) == ["hdr", "img"]
    assert_same(components, expected.components)


def test_async_errors_are_the_same_exceptions(server: Server) -> None:
    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            with pytest.raises(hypermnf.APIError) as info:
                await ac.job("no-such-job")
            assert info.value.status == 404
            with pytest.raises(hypermnf.APIError) as info:
                await ac.submit(textured_cube(8, 8, 4, seed=3), components=0)
            assert info.value.status in (400, 422)
            assert await ac.health() is True
            assert isinstance((await ac.info())["version"], str)
        async with hypermnf.AsyncClient(f"http://127.0.0.1:{free_port()}", timeout=5) as down:
            with pytest.raises(hypermnf.ConnectionError, match="cannot reach hypermnf"):
                await down.info()

    run(main())


def test_async_wait_times_out_then_cancel(server: Server) -> None:
    # A job queued behind a large one on the server's single worker.
    big = textured_cube(512, 640, 128, seed=3402)

    async def main():
        async with hypermnf.AsyncClient(server.url) as ac:
            blocker = await ac.submit(big, components=3)
            queued = await ac.submit(big, components=4, noise="shift-difference")
            try:
                with pytest.raises(hypermnf.TimeoutError, match="still"):
                    await queued.wait(timeout=0.2, progress=False)
                await queued.cancel()
                with pytest.raises(hypermnf.JobCanceled):
                    await queued.wait(timeout=60, progress=False)
            finally:
                await blocker.cancel()

    run(main())
