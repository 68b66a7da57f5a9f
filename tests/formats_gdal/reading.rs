//! Reading: the real samples, the chip in every layout, random GeoTIFFs, PRISMA and DESIS layouts.

use super::*;

#[test]
fn real_emit_granules_read_with_their_layout() {
    let Some(dir) = formats_dir() else { return };
    for (name, bands, names_key) in [
        ("emit/EMIT_L1B_OBS_001_20220827T060753_9999999_999.nc", 11, "obs"),
        ("emit/EMIT_L2A_MASK_001_20220827T060753_9999999_999.nc", 8, "mask"),
    ] {
        let c = cube::open(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((c.lines(), c.samples(), c.bands(), c.dtype()), (200, 200, bands, DataType::F32), "{name}");
        assert_eq!(c.meta.ignore_value, Some(-9999.0), "{name}");
        assert_eq!(c.meta.band_names.as_ref().map(Vec::len), Some(bands), "{name}: {names_key} band names");
        assert_eq!(c.meta.wavelength, None, "{name}");
        assert_eq!(c.meta.bbl, None, "{name}");
        // Sensor geometry: no map info; the granule's grid and GLT are carried.
        assert_eq!(c.meta.map_info, None, "{name}");
        assert_eq!(c.meta.extra_value("emit glt"), Some("318, 354"), "{name}");
        assert!(c.meta.extra_value("emit geotransform").unwrap().starts_with("61.6401744677027, 0.000542232520256367"), "{name}");
        assert!(c.meta.extra_value("emit spatial ref").unwrap().contains("WGS 84"), "{name}");
        // The GLT points into the granule: every filled cell is a pixel of its 200 x 200.
        let glt = hypermnf::cube::gdal::emit::read_glt(&dir.join(name), 200, 200).unwrap();
        assert_eq!((glt.rows, glt.cols), (318, 354), "{name}");
        let filled = glt.cells.iter().filter(|c| c.is_some()).count();
        assert!(filled > 200 * 200 / 2, "{name}: {filled} cells filled");
    }
    // obs band 0 (path length) at (0, 0), as netCDF4 reads it.
    if let Some(py) = python() {
        let p = dir.join("emit/EMIT_L1B_OBS_001_20220827T060753_9999999_999.nc");
        let want: f64 = py_run(&py, "import netCDF4,sys; d=netCDF4.Dataset(sys.argv[1]); d.set_auto_mask(False); print(repr(float(d['obs'][3,5,2])))", &[&p]).trim().parse().unwrap();
        let c = cube::open(&p).unwrap();
        let mut px = vec![0.0; 11];
        c.decode_pixel_f64(3, 5, &mut px);
        assert_eq!(px[2], want);
    }
}

#[test]
fn real_neon_reflectance_is_scaled_with_its_crs() {
    let Some(dir) = formats_dir() else { return };
    let p = dir.join("neon/neon_sjer_2017_reflectance_subset.h5");
    let c = cube::open(&p).unwrap();
    assert_eq!((c.lines(), c.samples(), c.bands(), c.dtype()), (30, 30, 426, DataType::F32));
    assert_eq!(c.meta.ignore_value, Some(-9999.0));
    let wl = c.meta.wavelength.as_ref().unwrap();
    assert_eq!(wl.len(), 426);
    assert!(wl[0] > 370.0 && wl[0] < 390.0 && wl[425] > 2490.0 && wl[425] < 2520.0, "{} .. {}", wl[0], wl[425]);
    assert_eq!(c.meta.wavelength_units.as_deref(), Some("Nanometers"));
    assert!(c.meta.map_info.as_deref().unwrap().starts_with("UTM"));
    assert_eq!(c.meta.extra_value("epsg code"), Some("32611"));
    assert!(c.meta.extra_value("coordinate system string").unwrap().contains("UTM zone 11N"));
    let g = hypermnf::cube::gdal::georef::of_meta(&c.meta).unwrap().unwrap();
    assert_eq!(g.geotransform, [257000.0, 1.0, 0.0, 4112000.0, 0.0, -1.0]);
    // Reflectance = stored / Scale_Factor (10000); -9999 stays no-data.
    let Some(py) = python() else { return };
    let raw: Vec<f64> = py_run(&py, "import h5py,sys; d=h5py.File(sys.argv[1])['SJER/Reflectance/Reflectance_Data']; print(' '.join(str(int(v)) for v in d[:].ravel()))", &[&p])
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let got = c.to_f64();
    assert_eq!(raw.len(), got.len());
    for (r, g) in raw.iter().zip(&got) {
        let want = if *r == -9999.0 { -9999.0 } else { (r * (1.0 / 10000.0)) as f32 as f64 };
        assert_eq!(*g, want);
    }
}

#[test]
fn real_enmap_geotiff_reads_band_metadata_scale_and_crs() {
    let Some(dir) = formats_dir() else { return };
    let p = dir.join("enmap/enmap_potsdam_tile_128_0.tif");
    let c = cube::open(&p).unwrap();
    assert_eq!((c.lines(), c.samples(), c.bands(), c.dtype()), (32, 32, 224, DataType::F32));
    assert_eq!(c.meta.ignore_value, Some(-32768.0));
    assert_eq!(c.meta.wavelength.as_ref().unwrap()[0], 418.24);
    assert_eq!(c.meta.fwhm.as_ref().unwrap()[0], 6.99561);
    assert_eq!(c.meta.wavelength_units.as_deref(), Some("Nanometers"));
    assert_eq!(c.meta.bbl.as_ref().unwrap().len(), 224);
    assert_eq!(c.meta.band_names.as_ref().unwrap()[0], "band 1 (418.24 Nanometers)");
    assert!(c.meta.map_info.as_deref().unwrap().contains("33"), "{:?}", c.meta.map_info);
    let g = hypermnf::cube::gdal::georef::of_meta(&c.meta).unwrap().unwrap();
    assert_eq!(g.geotransform, [366015.0, 30.0, 0.0, 5809965.0, 0.0, -30.0]);
    assert!(g.wkt.unwrap().contains("UTM zone 33N"));
    let Some(py) = python() else { return };
    let raw: Vec<f64> = py_run(&py, "from osgeo import gdal; import sys,numpy as np; a=gdal.Open(sys.argv[1]).ReadAsArray().transpose(1,2,0); print(' '.join(repr(float(v)) for v in a.ravel()))", &[&p])
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    for (r, g) in raw.iter().zip(c.to_f64()) {
        let want = if *r == -32768.0 { -32768.0 } else { (r * 0.0001) as f32 as f64 };
        assert_eq!(g, want);
    }
}

// ---------------------------------------------------------------- round trips

#[test]
fn the_chip_in_every_layout_reads_as_its_envi_original_and_gives_the_same_mnf() {
    let Some(l) = layouts() else { return };
    let original = cube::open(&l.original).unwrap();
    let reference = mnf(&original);
    for name in ["emit_rdn.nc", "emit_rfl.nc", "neon_refl.h5", "cube.tif"] {
        let c = cube::open(&l.dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        same_samples(&original, &c, name);
        assert_eq!(c.dtype(), DataType::F32, "{name}");
        assert_eq!(c.meta.ignore_value, Some(-9999.0), "{name}");
        let (w0, w1) = (original.meta.wavelengths_nm().unwrap(), c.meta.wavelengths_nm().unwrap());
        assert!(w0.iter().zip(&w1).all(|(a, b)| (a - b).abs() < 1e-3) && w0.len() == w1.len(), "{name}: wavelengths");
        let r = mnf(&c);
        assert_eq!(r.k, reference.k, "{name}");
        assert_eq!(bits(&r.components), bits(&reference.components), "{name}: components differ");
        assert_eq!(bits(r.denoised.as_ref().unwrap()), bits(reference.denoised.as_ref().unwrap()), "{name}: denoised differs");
        assert_eq!(r.metadata.eigenvalues, reference.metadata.eigenvalues, "{name}: eigenvalues");
    }
    // The georeferenced layouts carry the original's place on the ground.
    let want = hypermnf::cube::gdal::georef::of_meta(&original.meta).unwrap().unwrap();
    for name in ["neon_refl.h5", "cube.tif"] {
        let c = cube::open(&l.dir.join(name)).unwrap();
        let g = hypermnf::cube::gdal::georef::of_meta(&c.meta).unwrap().unwrap();
        assert_eq!(g.geotransform, want.geotransform, "{name}");
    }
}

/// A fresh random float32 cube as an ENVI BIL original and as GeoTIFFs band-interleaved (strips,
/// uncompressed: read band by band through a mapping of the file), band-interleaved in deflated 16 x 16
/// tiles (through GDAL's block cache), and pixel-interleaved (read pixel by pixel).
const RANDOM_TIFFS: &str = r#"
import os, sys
import numpy as np
from osgeo import gdal
gdal.UseExceptions()
out = sys.argv[1]
lines, samples, bands = 45, 33, 12
rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
cube = (rng.standard_normal((lines, samples, bands)) * rng.uniform(1, 100, bands)).astype(np.float32)
cube.transpose(0, 2, 1).tofile(out + "/orig.img")
open(out + "/orig.hdr", "w").write(f"ENVI\nsamples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\n"
                                   "file type = ENVI Standard\ndata type = 4\ninterleave = bil\nbyte order = 0\n")
for name, opts in (("band.tif", ["INTERLEAVE=BAND"]), ("band_tiled.tif", ["INTERLEAVE=BAND", "TILED=YES", "BLOCKXSIZE=16", "BLOCKYSIZE=16", "COMPRESS=DEFLATE"]),
                   ("pixel.tif", ["INTERLEAVE=PIXEL"])):
    ds = gdal.GetDriverByName("GTiff").Create(out + "/" + name, samples, lines, bands, gdal.GDT_Float32, opts)
    ds.WriteRaster(0, 0, samples, lines, np.ascontiguousarray(cube.transpose(2, 0, 1)).tobytes())
    ds = None
"#;

#[test]
fn band_and_pixel_interleaved_geotiffs_of_a_random_cube_give_the_envi_originals_mnf_bit_for_bit() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    py_run(&py, RANDOM_TIFFS, &[dir.path()]);
    let original = cube::open(&dir.path().join("orig.hdr")).unwrap();
    assert!(original.to_f64().iter().any(|v| *v != 0.0), "the random cube is not zeros");
    let reference = mnf(&original);
    for name in ["band.tif", "band_tiled.tif", "pixel.tif"] {
        let c = cube::open(&dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        same_samples(&original, &c, name);
        let r = mnf(&c);
        assert_eq!(bits(&r.components), bits(&reference.components), "{name}: components differ");
        assert_eq!(bits(r.denoised.as_ref().unwrap()), bits(reference.denoised.as_ref().unwrap()), "{name}: denoised differs");
        assert_eq!(r.metadata.eigenvalues, reference.metadata.eigenvalues, "{name}: eigenvalues");
    }
}

#[test]
fn prisma_layout_joins_vnir_and_swir_in_wavelength_order() {
    let Some(l) = layouts() else { return };
    let c = cube::open(&l.dir.join("prisma_l2d.he5")).unwrap();
    let expected = cube::open(&l.dir.join("prisma_expected.npy")).unwrap();
    same_samples(&expected, &c, "prisma");
    let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(l.dir.join("prisma_expected.npy.json")).unwrap()).unwrap();
    let wl = c.meta.wavelength.as_ref().unwrap();
    let want: Vec<f64> = want["wavelength"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(wl.len(), want.len());
    assert!(wl.windows(2).all(|w| w[0] < w[1]), "increasing");
    assert!(wl.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-3));
    let g = hypermnf::cube::gdal::georef::of_meta(&c.meta).unwrap().unwrap();
    assert_eq!(g.geotransform[1], 30.0);
}

/// A DESIS L2A product as DLR's product description lays it out and EnMAP-Box's DESIS import reads it:
/// `…-SPECTRAL_IMAGE.tif`, 235 int16 bands, pixel-interleaved and compressed, in UTM, with no spectral
/// metadata of its own, and beside it `…-SPECTRAL_IMAGE.hdr`, an ENVI header with the wavelengths, fwhm,
/// per-band gains and offsets and the no-data value. No real DESIS granule is available here.
const DESIS: &str = r#"
import sys
import numpy as np
from osgeo import gdal, osr
out = sys.argv[1]
lines, samples, bands = 7, 5, 235
rng = np.random.default_rng(235)
v = rng.integers(0, 10000, size=(bands, lines, samples), dtype=np.int16)
v[:, 0, 0] = -32768
ds = gdal.GetDriverByName("GTiff").Create(out + ".tif", samples, lines, bands, gdal.GDT_Int16, ["INTERLEAVE=PIXEL", "COMPRESS=DEFLATE"])
ds.SetGeoTransform((399960.0, 30.0, 0.0, 4500000.0, 0.0, -30.0))
srs = osr.SpatialReference(); srs.ImportFromEPSG(32633)
ds.SetProjection(srs.ExportToWkt())
for b in range(bands):
    ds.GetRasterBand(b + 1).WriteArray(v[b])
ds = None
wl = [401.275 + 2.553 * i for i in range(bands)]
fwhm = [2.5 + 0.001 * i for i in range(bands)]
gain = [0.0001 * (1 + i % 3) for i in range(bands)]
offset = [0.001 * (i % 2) for i in range(bands)]
lst = lambda xs: "{" + ", ".join(repr(x) for x in xs) + "}"
with open(out + ".hdr", "w") as f:
    f.write("ENVI\ndescription = {DESIS L2A surface reflectance}\n")
    f.write(f"samples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\nfile type = TIFF\n")
    f.write("data type = 2\ninterleave = bip\nbyte order = 0\nwavelength units = Nanometers\n")
    f.write(f"wavelength = {lst(wl)}\nfwhm = {lst(fwhm)}\n")
    f.write(f"data gain values = {lst(gain)}\ndata offset values = {lst(offset)}\ndata ignore value = -32768\n")
phys = np.where(v == -32768, -32768.0, v.astype(np.float64) * np.array(gain)[:, None, None] + np.array(offset)[:, None, None])
np.save(out + "-expected.npy", phys.astype(np.float32).transpose(1, 2, 0))
"#;

#[test]
fn desis_layout_reads_its_spectra_gains_and_nodata_from_the_envi_header_beside_it() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("DESIS-HSI-L2A-DT0000000000_001-20200101T000000-V0215-SPECTRAL_IMAGE");
    py_run(&py, DESIS, &[&stem]);
    let tif = stem.with_extension("tif");
    let c = cube::open(&tif).unwrap();
    assert_eq!((c.lines(), c.samples(), c.bands()), (7, 5, 235));
    assert_eq!(c.dtype(), DataType::F32, "int16 with gains reads as float32");
    let wl = c.meta.wavelengths_nm().unwrap();
    assert_eq!(wl.len(), 235);
    assert!((wl[0] - 401.275).abs() < 1e-9 && (wl[234] - (401.275 + 2.553 * 234.0)).abs() < 1e-9, "{} .. {}", wl[0], wl[234]);
    assert_eq!(c.meta.fwhm.as_ref().map(Vec::len), Some(235));
    assert_eq!(c.meta.ignore_value, Some(-32768.0));
    assert!(c.meta.map_info.as_deref().is_some_and(|m| m.starts_with("UTM")), "{:?}", c.meta.map_info);
    // Every sample is stored × gain + offset of its band, the no-data pixel left as it is.
    let expected = cube::open(&dir.path().join(format!("{}-expected.npy", stem.file_name().unwrap().to_string_lossy()))).unwrap();
    same_samples(&expected, &c, "DESIS");
    // The header describes the raster: one of another size is refused, naming both.
    let hdr = stem.with_extension("hdr");
    let text = std::fs::read_to_string(&hdr).unwrap().replace("lines = 7", "lines = 8");
    std::fs::write(&hdr, text).unwrap();
    let e = cube::open(&tif).unwrap_err().to_string();
    assert!(e.contains("8 x 5 x 235") && e.contains("7 x 5 x 235"), "{e}");
}
