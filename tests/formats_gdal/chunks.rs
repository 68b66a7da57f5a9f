//! NetCDF-4 / HDF5 arrays read through HDF5's direct chunk reads (deflate and shuffle undone by
//! hypermnf): random cubes in EMIT's and NEON's layouts give their ENVI originals' samples and MNF bit
//! for bit, and a filter the fast path does not undo (fletcher32), or chunks never written, are read
//! through GDAL as before. Each test checks which path read the array
//! (`hypermnf::cube::gdal::last_read_path`), so that a silent fall back to GDAL fails it.

use super::*;
use hypermnf::cube::gdal::{last_read_path, ReadPath};

/// Writes, from one random cube, its ENVI original and the chunked layouts the tests read.
const RANDOM_CHUNKED: &str = r#"
import sys
import h5py, netCDF4, numpy as np
from osgeo import gdal
gdal.UseExceptions()
out = sys.argv[1]
rng = np.random.default_rng(30)

def envi(name, cube):
    lines, samples, bands = cube.shape
    cube.astype("<f4").tofile(f"{out}/{name}.img")
    open(f"{out}/{name}.hdr", "w").write(f"ENVI\nsamples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\n"
                                         "file type = ENVI Standard\ndata type = 4\ninterleave = bip\nbyte order = 0\n"
                                         "data ignore value = -9999\n")

# EMIT: float32 with fill values, shuffle + deflate, chunks of 7 whole lines (45 lines: the last chunk
# has 3), and the same big-endian.
lines, samples, bands = 45, 23, 17
cube = (rng.normal(size=(lines, samples, bands)) * 40.0 + 100.0).astype(np.float32)
cube[3, 4, :] = -9999.0
cube[44, 22, 5] = -9999.0
envi("emit_orig", cube)
for name, endian in (("emit_shuffle.nc", "native"), ("emit_big.nc", "big")):
    with netCDF4.Dataset(f"{out}/{name}", "w", format="NETCDF4") as nc:
        for d, n in (("downtrack", lines), ("crosstrack", samples), ("bands", bands)):
            nc.createDimension(d, n)
        v = nc.createVariable("radiance", "f4", ("downtrack", "crosstrack", "bands"), zlib=True, complevel=1, shuffle=True,
                              chunksizes=(7, samples, bands), fill_value=-9999.0, endian=endian)
        v[:] = cube
# The same with fletcher32 checksums, which the fast path does not check: GDAL reads it.
with netCDF4.Dataset(f"{out}/emit_fletcher32.nc", "w", format="NETCDF4") as nc:
    for d, n in (("downtrack", lines), ("crosstrack", samples), ("bands", bands)):
        nc.createDimension(d, n)
    v = nc.createVariable("radiance", "f4", ("downtrack", "crosstrack", "bands"), zlib=True, shuffle=True, fletcher32=True,
                          chunksizes=(7, samples, bands), fill_value=-9999.0)
    v[:] = cube

# NEON: int32 in (13, 13, 13) chunks, gzip 4, no shuffle, every dimension ending in a partial chunk;
# reflectance = stored / Scale_Factor, Data_Ignore_Value kept.
lines, samples, bands = 30, 28, 27
raw = rng.integers(-2000, 12000, size=(lines, samples, bands), dtype=np.int32)
raw[0, 0, :] = -9999
raw[29, 27, 26] = -9999
expected = np.where(raw == -9999, -9999.0, raw.astype(np.float64) * (1.0 / 10000.0)).astype(np.float32)
envi("neon_orig", expected)
def neon(name, **kw):
    with h5py.File(f"{out}/{name}", "w") as f:
        d = f.create_group("SITE/Reflectance").create_dataset("Reflectance_Data", data=raw, chunks=(13, 13, 13), **kw)
        d.attrs["Scale_Factor"] = np.float32(10000.0)
        d.attrs["Data_Ignore_Value"] = np.float32(-9999.0)
neon("neon_int32.h5", compression="gzip", compression_opts=4)
# Shuffled big-endian samples, and no filter at all.
with h5py.File(f"{out}/neon_shuffle_be.h5", "w") as f:
    d = f.create_group("SITE/Reflectance").create_dataset("Reflectance_Data", data=raw.astype(">i4"), chunks=(13, 13, 13),
                                                          compression="gzip", shuffle=True)
    d.attrs["Scale_Factor"] = np.float32(10000.0)
    d.attrs["Data_Ignore_Value"] = np.float32(-9999.0)
neon("neon_plain.h5")
# Only the first 13 lines written: the other chunks are not stored and read as the fill value.
with h5py.File(f"{out}/neon_partial.h5", "w") as f:
    d = f.create_group("SITE/Reflectance").create_dataset("Reflectance_Data", shape=raw.shape, dtype=np.int32, chunks=(13, 13, 13),
                                                          compression="gzip", fillvalue=-9999)
    d[:13] = raw[:13]
    d.attrs["Scale_Factor"] = np.float32(10000.0)
    d.attrs["Data_Ignore_Value"] = np.float32(-9999.0)
partial = raw.copy()
partial[13:] = -9999
envi("neon_partial_orig", np.where(partial == -9999, -9999.0, partial.astype(np.float64) * (1.0 / 10000.0)).astype(np.float32))
"#;

/// The random layouts, written once per test binary.
fn random_chunked() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = python()?;
        let dir = tempfile::tempdir().unwrap().keep();
        py_run(&py, RANDOM_CHUNKED, &[&dir]);
        Some(dir)
    })
    .as_deref()
}

/// Reads `name` of `dir`, checks it against the ENVI original `orig` (samples, then MNF bit for bit),
/// and returns the path that read it.
fn read_as_original(dir: &Path, name: &str, orig: &str) -> ReadPath {
    let original = cube::open(&dir.join(format!("{orig}.hdr"))).unwrap();
    let values = original.to_f64();
    assert!(values.iter().filter(|v| **v != 0.0 && **v != -9999.0).count() > values.len() / 3, "{orig} is random");
    let c = cube::open(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let path = last_read_path().unwrap_or_else(|| panic!("{name}: no path recorded"));
    same_samples(&original, &c, name);
    assert_eq!(c.dtype(), DataType::F32, "{name}");
    assert_eq!(c.meta.ignore_value, Some(-9999.0), "{name}");
    let (a, b) = (mnf(&original), mnf(&c));
    assert_eq!(b.k, a.k, "{name}");
    assert_eq!(bits(&b.components), bits(&a.components), "{name}: components differ");
    assert_eq!(bits(b.denoised.as_ref().unwrap()), bits(a.denoised.as_ref().unwrap()), "{name}: denoised differs");
    assert_eq!(b.metadata.eigenvalues, a.metadata.eigenvalues, "{name}: eigenvalues");
    path
}

#[test]
fn emit_layout_with_shuffle_and_deflate_in_line_chunks_reads_through_direct_chunk_reads_bit_for_bit() {
    let Some(dir) = random_chunked() else { return };
    for name in ["emit_shuffle.nc", "emit_big.nc"] {
        assert_eq!(read_as_original(dir, name, "emit_orig"), ReadPath::DirectChunks, "{name}");
    }
}

#[test]
fn neon_layout_in_chunks_across_all_three_dims_reads_through_direct_chunk_reads_bit_for_bit() {
    let Some(dir) = random_chunked() else { return };
    for name in ["neon_int32.h5", "neon_shuffle_be.h5", "neon_plain.h5"] {
        assert_eq!(read_as_original(dir, name, "neon_orig"), ReadPath::DirectChunks, "{name}");
    }
}

#[test]
fn filters_the_fast_path_does_not_undo_and_unwritten_chunks_are_read_through_gdal() {
    let Some(dir) = random_chunked() else { return };
    match read_as_original(dir, "emit_fletcher32.nc", "emit_orig") {
        ReadPath::Gdal(why) => assert!(why.contains("fletcher32"), "{why}"),
        other => panic!("emit_fletcher32.nc: {other:?}"),
    }
    match read_as_original(dir, "neon_partial.h5", "neon_partial_orig") {
        ReadPath::Gdal(why) => assert!(why.contains("chunks are stored"), "{why}"),
        other => panic!("neon_partial.h5: {other:?}"),
    }
}

#[test]
fn the_chip_layouts_and_prisma_read_through_direct_chunk_reads() {
    // netCDF4's and h5py's own chunking of the AVIRIS-NG chip (zlib, gzip): the round-trip test checks
    // their samples; this one that the fast path read them.
    let Some(l) = layouts() else { return };
    for name in ["emit_rdn.nc", "neon_refl.h5", "prisma_l2d.he5"] {
        cube::open(&l.dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(last_read_path(), Some(ReadPath::DirectChunks), "{name}");
    }
}

#[test]
fn netcdf_hdf5_and_geotiff_reads_at_once_all_finish() {
    // The GeoTIFF reader places its planes on rayon's pool while it holds the GDAL lock, and the chunk
    // reader of a NetCDF/HDF5 read waits for that lock: the chunk decoders must not be rayon's workers.
    let (Some(l), Some(dir)) = (layouts(), random_chunked()) else { return };
    let names = [l.dir.join("cube.tif"), dir.join("neon_int32.h5"), l.dir.join("emit_rdn.nc"), dir.join("emit_shuffle.nc")];
    std::thread::scope(|s| {
        for name in &names {
            s.spawn(move || {
                for _ in 0..6 {
                    cube::open(name).unwrap_or_else(|e| panic!("{}: {e}", name.display()));
                }
            });
        }
    });
}
