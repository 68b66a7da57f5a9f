"""Batches through the client: a pooled batch against a NumPy float64 reference of the pooled statistics,
"each" against separate jobs, listing, the progress bar, refusals with the server's codes, deletion, the
asyncio client, and ``fit``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest

import hypermnf
from conftest import Server
from hypermnf.batches import batch_request, cube_href


def cube(lines: int, samples: int, bands: int, seed: int) -> np.ndarray:
    """Smooth signal in a few spectral shapes, an offset per cube and noise: int16, never degenerate."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:lines, 0:samples].astype(np.float64)
    maps = np.stack([np.sin(x / (5.0 + i) + seed) * np.cos(y / (7.0 + i) - i) for i in range(3)], axis=-1)
    spectra = rng.uniform(100, 900, size=(3, bands))
    noisy = maps @ spectra + 1500.0 + 40.0 * seed + rng.normal(0, 15, size=(lines, samples, bands))
    return np.round(noisy).astype(np.int16)


def put(server: Server, name: str, array: np.ndarray) -> Path:
    """Writes ``array`` as ``<name>.npy`` under the server's second input root."""
    path = server.inputs / f"{name}.npy"
    np.save(path, array)
    return path


def pooled_reference(cubes: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """The pooled MNF from its definition, in float64: the data covariance of every cube's pixels about
    the pooled mean; the noise covariance of each cube's own shift differences x[l, s] - x[l+1, s+1]
    (never across two cubes), halved; the generalized eigenvalues of (C_D, C_N) through C_N^(-1/2).
    Returns (eigenvalues, largest first; pooled means)."""
    bands = cubes[0].shape[2]
    pixels = np.concatenate([c.astype(np.float64).reshape(-1, bands) for c in cubes])
    residuals = np.concatenate(
        [(c[:-1, :-1].astype(np.float64) - c[1:, 1:].astype(np.float64)).reshape(-1, bands) for c in cubes]
    )
    means = pixels.mean(axis=0)
    c_d = np.cov(pixels, rowvar=False, ddof=1)
    c_n = np.cov(residuals, rowvar=False, ddof=1) / 2.0
    d, v = np.linalg.eigh(c_n)
    p = v / np.sqrt(d)
    adjusted = p.T @ c_d @ p
    eigenvalues = np.linalg.eigvalsh(0.5 * (adjusted + adjusted.T))[::-1]
    return eigenvalues, means


@pytest.fixture(scope="module")
def pooled_cubes(server: Server) -> Tuple[List[np.ndarray], List[Path]]:
    cubes = [cube(24, 20, 8, 1), cube(17, 20, 8, 2), cube(30, 11, 8, 3)]
    return cubes, [put(server, f"pooled{i}", c) for i, c in enumerate(cubes)]


def test_a_pooled_batch_equals_the_float64_reference_of_the_pooled_statistics(client: hypermnf.Client, pooled_cubes) -> None:
    cubes, paths = pooled_cubes
    batch = client.batch(paths, statistics="pooled", components=4, noise="shift-difference")
    assert isinstance(batch, hypermnf.Batch)
    assert batch.statistics == "pooled"
    assert [j.document.get("href") for j in batch.jobs] == [p.as_uri() for p in paths]
    batch.wait(timeout=120, progress=False)
    assert batch.status == "succeeded"
    assert batch.progress == 1.0 and batch.system_ready
    assert batch.counts["succeeded"] == 3

    want_eigenvalues, want_means = pooled_reference(cubes)
    metadata = batch.metadata()
    for i, meta in enumerate(metadata):
        assert meta["statistics"]["source"] == "pooled", meta["statistics"]
        # One system: the same eigenvalues, to the bit, in every member.
        assert meta["eigenvalues"] == metadata[0]["eigenvalues"], f"cube {i}"
        got = np.asarray(meta["eigenvalues"], dtype=np.float64)
        np.testing.assert_allclose(got, want_eigenvalues[: got.size], rtol=1e-9, atol=0, err_msg=f"cube {i}")
        np.testing.assert_allclose(np.asarray(meta["means"], dtype=np.float64), want_means, rtol=1e-9, atol=0, err_msg=f"cube {i}")
    components = batch.components()
    assert [c.shape for c in components] == [(c.shape[0], c.shape[1], 4) for c in cubes]
    # Each member is an ordinary job that names its batch.
    member = batch.jobs[1]
    member.refresh()
    assert member.document["batch"]["id"] == batch.id and member.document["batch"]["position"] == 1


def test_each_equals_separate_jobs(client: hypermnf.Client, server: Server) -> None:
    paths = [put(server, f"each{i}", cube(21, 19, 7, 10 + i)) for i in range(2)]
    batch = client.batch([str(p) for p in paths], components=3)  # plain path strings: file:// URLs too
    assert batch.statistics == "each"
    batch.wait(timeout=120, progress=False)
    for path, components in zip(paths, batch.components()):
        plain = client.submit(path.as_uri(), components=3)
        plain.wait(timeout=120, progress=False)
        np.testing.assert_array_equal(components, plain.result())
    first, second = batch.metadata()
    assert first["eigenvalues"] != second["eigenvalues"], "independent systems"


def test_wait_shows_one_progress_bar_over_the_batch(client: hypermnf.Client, server: Server, capsys) -> None:
    paths = [put(server, f"bar{i}", cube(300, 200, 32, 20 + i)) for i in range(3)]
    batch = client.batch(paths, statistics="pooled", components=2)
    batch.wait(timeout=120, progress=True)
    err = capsys.readouterr().err
    # Three cubes of 300 x 200 x 32 keep a debug build's one worker busy past the first poll.
    assert f"batch {batch.id[:8]}" in err and "3/3 jobs done" in err, err
    assert batch.status == "succeeded"


def test_batches_lists_them_and_delete_removes_the_batch_and_its_jobs(client: hypermnf.Client, server: Server) -> None:
    paths = [put(server, f"del{i}", cube(15, 14, 6, 30 + i)) for i in range(2)]
    batch = client.batch(paths, components=2)
    listed = {b.id: b for b in client.batches()}
    assert batch.id in listed and listed[batch.id].statistics == "each"
    assert [b.id for b in client.batches(limit=1)] == [batch.id], "newest first"
    batch.wait(timeout=120, progress=False)
    members = [j.id for j in batch.jobs]
    batch.delete()
    assert batch.id not in {b.id for b in client.batches()}
    with pytest.raises(hypermnf.APIError) as e:
        batch.refresh()
    assert (e.value.status, e.value.code) == (404, "not_found")
    for job_id in members:
        with pytest.raises(hypermnf.APIError) as e:
            client.job(job_id)
        assert e.value.status == 404


def test_wait_raises_the_failed_members_error(client: hypermnf.Client, server: Server) -> None:
    good = put(server, "fail_good", cube(16, 15, 6, 50))
    constant = put(server, "fail_constant", np.full((16, 15, 6), 7, dtype=np.int16))  # no band left to use
    batch = client.batch([good, constant], components=2)
    with pytest.raises(hypermnf.JobFailed) as e:
        batch.wait(timeout=120, progress=False)
    assert batch.status == "failed"
    failed = batch.jobs[1]
    assert e.value.job_id == failed.id and e.value.code == failed.document["error"]["code"], e.value
    batch.delete()


@pytest.mark.parametrize(
    "case, status, code",
    [
        ("bands differ", 422, "batch_mismatch"),
        ("outside the roots", 403, "forbidden_path"),
        ("missing file", 400, "input_not_found"),
        ("bad parameters", 422, "invalid_params"),
    ],
)
def test_refusals_raise_the_servers_code(client: hypermnf.Client, server: Server, tmp_path: Path, case: str, status: int, code: int) -> None:
    a = put(server, "refuse_a", cube(16, 16, 6, 40))
    cubes: list = [a]
    params = {"components": 2}
    if case == "bands differ":
        cubes.append(put(server, "refuse_b", cube(16, 16, 7, 41)))
    elif case == "outside the roots":
        outside = tmp_path / "outside.npy"
        np.save(outside, cube(16, 16, 6, 42))
        cubes.append(outside)
    elif case == "missing file":
        cubes.append(server.inputs / "no-such-cube.npy")
    else:
        params = {"components": 0}
    before = {b.id for b in client.batches()}
    with pytest.raises(hypermnf.APIError) as e:
        client.batch(cubes, statistics="pooled", **params)
    assert (e.value.status, e.value.code) == (status, code), e.value
    if case != "bad parameters":
        assert e.value.message.startswith("input 1"), e.value.message  # names the input
    assert {b.id for b in client.batches()} == before, "a refused batch leaves nothing"


def test_the_request_the_client_builds() -> None:
    body = batch_request([Path("/data/a.hdr"), "s3://bucket/b.hdr", "https://host/c.npy"], "pooled", {"snr": 2.0})
    assert body == {
        "inputs": [{"href": "file:///data/a.hdr"}, {"href": "s3://bucket/b.hdr"}, {"href": "https://host/c.npy"}],
        "statistics": "pooled",
        "params": {"snr": 2.0, "noise": "mean-filter"},
    }
    assert cube_href(Path("/data/a b%.hdr")) == "file:///data/a%20b%25.hdr"
    with pytest.raises(ValueError):
        batch_request(["s3://b/a.hdr"], "mean", {})
    with pytest.raises(TypeError):
        batch_request("s3://b/a.hdr", "each", {})
    with pytest.raises(TypeError):
        batch_request(["s3://b/a.hdr"], "each", {"colour": 1})


def test_the_async_client(server: Server, pooled_cubes) -> None:
    _, paths = pooled_cubes

    async def go() -> Tuple[List[np.ndarray], List[str]]:
        async with hypermnf.AsyncClient(server.url) as client:
            batch = await client.batch(paths[:2], statistics="pooled", components=3)
            assert isinstance(batch, hypermnf.AsyncBatch)
            await batch.wait(timeout=120, progress=False)
            arrays = await batch.components()
            ids = [b.id for b in await client.batches()]
            await batch.delete()
            return arrays, ids

    arrays, ids = asyncio.run(go())
    assert [a.shape[2] for a in arrays] == [3, 3]
    assert ids, "listed"


def test_fit_returns_the_pooled_system(client: hypermnf.Client, pooled_cubes) -> None:
    cubes, paths = pooled_cubes
    system = client.fit(paths, components=4, noise="shift-difference", progress=False, timeout=120)
    want_eigenvalues, want_means = pooled_reference(cubes)
    np.testing.assert_allclose(system.eigenvalues, want_eigenvalues[: system.eigenvalues.size], rtol=1e-9, atol=0)
    np.testing.assert_allclose(system.arrays["pooled_data_mean"], want_means, rtol=1e-9, atol=0)
    assert system.source.get("batch")
    # The batch's system lent to a batch of independent jobs (statistics_from names the pooled batch).
    lent = client.batch(paths[:1], statistics_from=system.source["batch"], components=4).wait(timeout=120, progress=False)
    assert lent.status == "succeeded"
    np.testing.assert_array_equal(lent.jobs[0].metadata["eigenvalues"], system.eigenvalues)
