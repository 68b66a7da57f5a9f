"""Files written by NumPy and Spectral Python are read by hypermnf as the same cube, whatever the
dtype, byte order, memory order or ENVI interleave; and hypermnf's outputs read back in NumPy and SPy.

Identical values must give bit-identical components (the CPU backend is deterministic), so any
mis-read sample or permutation shows up as a difference."""

import json
import subprocess

import numpy as np
import pytest
import spectral.io.envi as envi

SHAPE = (21, 23, 6)


def cube(dtype: str) -> np.ndarray:
    """Random values that fit every dtype tested (non-negative for unsigned, no zeros)."""
    rng = np.random.default_rng(7)
    base = rng.integers(1, 120, SHAPE).astype(np.float64)
    smooth = np.add.outer(np.sin(np.arange(SHAPE[0]) / 5.0), np.cos(np.arange(SHAPE[1]) / 7.0))
    return (base + 40 * smooth[:, :, None] * np.arange(1, SHAPE[2] + 1) + 100).astype(dtype)


def run(bin_path: str, path, out) -> bytes:
    subprocess.run([bin_path, "run", str(path), "--components", "3", "--backend", "cpu", "--out", str(out)],
                   check=True, capture_output=True)
    return out.read_bytes()


@pytest.mark.parametrize("dtype", ["u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">u4", "<i8", "<f4", ">f4", "<f8", ">f8"])
def test_numpy_files_in_every_dtype_and_order(dtype, tmp_path, hypermnf_bin):
    a = cube(dtype)
    ref_path = tmp_path / "ref.npy"
    np.save(ref_path, a.astype("<f8"))
    reference = run(hypermnf_bin, ref_path, tmp_path / "ref_out.npy")
    for order in ("C", "F"):
        for version in ((1, 0), (2, 0)):
            p = tmp_path / f"a_{order}_{version[0]}.npy"
            with open(p, "wb") as f:
                np.lib.format.write_array(f, np.asarray(a, order=order), version=version)
            got = run(hypermnf_bin, p, tmp_path / f"out_{order}_{version[0]}.npy")
            assert got == reference, f"{dtype} {order}-order v{version}: components differ"


@pytest.mark.parametrize("interleave", ["bsq", "bil", "bip"])
@pytest.mark.parametrize("byteorder", [0, 1])
def test_spectral_python_envi_files(interleave, byteorder, tmp_path, hypermnf_bin):
    a = cube("<i2")
    np.save(tmp_path / "ref.npy", a)
    reference = run(hypermnf_bin, tmp_path / "ref.npy", tmp_path / "ref_out.npy")
    hdr = tmp_path / "spy.hdr"
    envi.save_image(str(hdr), a, dtype=np.int16, interleave=interleave, byteorder=byteorder, force=True,
                    metadata={"band names": [f"b{i}" for i in range(SHAPE[2])], "sensor type": "test"})
    assert run(hypermnf_bin, hdr, tmp_path / "envi_out.npy") == reference


def test_outputs_read_back_in_numpy_and_spy(tmp_path, hypermnf_bin):
    a = cube("<i2")
    np.save(tmp_path / "in.npy", a)
    subprocess.run([hypermnf_bin, "run", str(tmp_path / "in.npy"), "--components", "4", "--inverse",
                    "--backend", "cpu", "--out", str(tmp_path / "mnf.hdr")], check=True, capture_output=True)
    md = json.loads((tmp_path / "mnf.json").read_text())
    img = envi.open(str(tmp_path / "mnf.hdr"), str(tmp_path / "mnf.img"))
    z = np.asarray(img.load())
    assert z.shape == (SHAPE[0], SHAPE[1], 4) and img.metadata["interleave"] == "bsq"
    assert img.metadata["band names"] == ["MNF 1", "MNF 2", "MNF 3", "MNF 4"]
    ev = [float(v) for v in img.metadata["mnf eigenvalues"]]
    np.testing.assert_allclose(ev, md["eigenvalues"][:4], rtol=1e-12)
    # The ENVI components equal the .npy ones, and both equal Tᵀ(x − μ) from the metadata.
    subprocess.run([hypermnf_bin, "run", str(tmp_path / "in.npy"), "--components", "4", "--backend", "cpu",
                    "--out", str(tmp_path / "mnf.npy")], check=True, capture_output=True)
    zn = np.load(tmp_path / "mnf.npy")
    np.testing.assert_array_equal(zn, z)
    t = np.asarray(md["transform"])
    expect = (a.reshape(-1, SHAPE[2]).astype(np.float64)[:, md["bands_used"]] - np.asarray(md["means"])) @ t
    np.testing.assert_allclose(zn.reshape(-1, 4), expect, rtol=1e-4, atol=1e-3)
    den = envi.open(str(tmp_path / "mnf-denoised.hdr"), str(tmp_path / "mnf-denoised.img")).load()
    assert den.shape == SHAPE
