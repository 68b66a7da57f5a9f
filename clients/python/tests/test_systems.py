"""Eigen systems through the client (hypermnf.systems): a job's system exported as a System, saved and
loaded, applied to another cube with statistics_from, imported, listed and deleted; the components equal
`hypermnf run --system` with the same file, exactly."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

import hypermnf
from conftest import CliRunner, Server, assert_same


def scene(lines: int, samples: int, bands: int, seed: int) -> np.ndarray:
    """Smooth signal in a few spectral shapes plus noise: another scene of the same sensor per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:lines, 0:samples].astype(np.float32)
    maps = np.stack([np.sin(x / 7.0 + i) * np.cos(y / 9.0 - i) for i in range(3)], axis=-1)
    spectra = np.stack([np.linspace(200, 900, bands) * (i + 1) % 700 + 100 for i in range(3)]).astype(np.float32)
    cube = maps @ spectra + 1500.0 + rng.normal(0, 15, size=(lines, samples, bands)).astype(np.float32)
    return cube.astype(np.int16)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype="<f8").view("<u8")


def test_a_system_is_exported_applied_imported_and_deleted(client: hypermnf.Client, cli: CliRunner, tmp_path: Path) -> None:
    first, other = scene(40, 36, 16, seed=11), scene(30, 44, 16, seed=12)
    job = client.submit(first, components=4, bad_bands=[0])
    job.wait(progress=False)

    system = client.system(job.id)
    assert system.id == job.id and system.bands == 16
    assert list(system.bands_used) == list(range(1, 16))
    assert system.transform.shape == (15, 15) and system.transform.dtype == np.dtype("<f8")
    assert np.array_equal(system.eigenvalues, job.eigenvalues)
    # numpy reads the file's arrays as the format says.
    doc = system.to_json()
    means = np.load(io.BytesIO(base64.b64decode(doc["arrays"]["means"]["npy"])))
    assert np.array_equal(bits(means), bits(system.means))
    path = tmp_path / "system.json"
    system.save(path)
    loaded = hypermnf.System.load(path)
    assert np.array_equal(bits(loaded.transform), bits(system.transform))
    assert json.loads(path.read_text())["format"] == "hypermnf-system"

    # Applied to another scene, by the service and by the CLI with the saved file: the same values.
    (applied,) = client.apply(system, [other], components=3)
    applied.wait(progress=False)
    assert applied.metadata["statistics"]["from"] == job.id
    cube_path = tmp_path / "other.npy"
    np.save(cube_path, other)
    reference = cli(cube_path, "--components", "3", "--system", str(path))
    assert_same(applied.result(), reference.components)

    # Imported: the same arrays under a new id, which applies the same way.
    imported = client.import_system(loaded)
    assert imported.id not in (None, job.id) and imported.source == {"system": imported.id}
    for name in ("means", "eigenvalues", "transform", "noise_covariance"):
        assert np.array_equal(bits(imported.arrays[name]), bits(system.arrays[name])), name
    (again,) = client.apply(imported.id, [other], components=3)
    again.wait(progress=False)
    assert_same(again.result(), reference.components)
    assert any(s["id"] == imported.id for s in client.systems())

    client.delete_system(imported.id)
    with pytest.raises(hypermnf.APIError) as refused:
        client.get_system(imported.id)
    assert (refused.value.status, refused.value.code) == (404, "system_not_found")


def test_a_cube_of_other_bands_is_refused(client: hypermnf.Client) -> None:
    job = client.submit(scene(24, 24, 12, seed=13), components=3)
    job.wait(progress=False)
    with pytest.raises(hypermnf.APIError) as refused:
        client.apply(job.id, [scene(24, 24, 11, seed=14)], components=3)
    assert (refused.value.status, refused.value.code) == (422, "system_mismatch")
    assert "11 bands" in refused.value.message


def test_a_file_that_is_not_a_system_is_refused_offline() -> None:
    with pytest.raises(ValueError, match="not a hypermnf system file"):
        hypermnf.System({"format": "other"})
    with pytest.raises(ValueError, match="version"):
        hypermnf.System({"format": "hypermnf-system", "version": 9, "arrays": {}})


def test_the_async_client_applies_a_system_too(server: Server, client: hypermnf.Client) -> None:
    job = client.submit(scene(24, 20, 10, seed=15), components=3)
    job.wait(progress=False)
    other = scene(18, 26, 10, seed=16)
    (blocking,) = client.apply(job.id, [other], components=2)
    blocking.wait(progress=False)

    async def run() -> np.ndarray:
        async with hypermnf.AsyncClient(server.url) as ac:
            j = await ac.submit(other, components=2, inverse=True, statistics_from=job.id)
            await j.wait(progress=False)
            return await j.result()

    result = asyncio.run(asyncio.wait_for(run(), timeout=600))
    assert_same(result, blocking.result())
