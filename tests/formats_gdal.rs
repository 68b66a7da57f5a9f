//! The formats read through GDAL (feature `gdal`): EMIT NetCDF-4, NEON HDF5, PRISMA HDF-EOS5 and
//! multi-band GeoTIFF in, Cloud-Optimized GeoTIFF out.
//!
//! - every real sample of `../shared/data/formats/` (EMIT obs/mask granules, NEON, EnMAP) is read with
//!   its expected shape, type, wavelengths, bad bands, no-data and CRS;
//! - the Apache-licensed AVIRIS-NG radiance chip is written at test time into the EMIT, NEON, GeoTIFF and
//!   PRISMA layouts by `tests/formats_gdal/make_layouts.py` (netCDF4, h5py and GDAL's Python bindings):
//!   each reader returns the ENVI original's values exactly, and the MNF results are identical bit for bit;
//! - COG results are opened with GDAL's Python bindings: CRS and transform of the source, band count and
//!   descriptions, and GDAL's own COG validation (`validate_cloud_optimized_geotiff`);
//! - bad files are refused with a clear error, and nothing is left behind.
//!
//! The shared samples and the Python modules are required when `HYPERMNF_REQUIRE_FORMATS=1` (CI): the
//! tests fail rather than skip without them. The Python is `HYPERMNF_GDAL_PYTHON`, else /usr/bin/python3
//! (Debian's python3-gdal, python3-netcdf4, python3-h5py).
#![cfg(feature = "gdal")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hypermnf::cube::{self, Cube, DataType};

fn required() -> bool {
    std::env::var("HYPERMNF_REQUIRE_FORMATS").as_deref() == Ok("1")
}

fn formats_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/formats");
    if dir.join("PROVENANCE.md").is_file() {
        return Some(dir);
    }
    assert!(!required(), "HYPERMNF_REQUIRE_FORMATS=1 but {} is missing", dir.display());
    eprintln!("skipped: {} is missing (the real samples are read from there)", dir.display());
    None
}

fn python() -> Option<String> {
    static PY: OnceLock<Option<String>> = OnceLock::new();
    PY.get_or_init(|| {
        let py = std::env::var("HYPERMNF_GDAL_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
        let ok = Command::new(&py)
            .args(["-c", "import osgeo.gdal, netCDF4, h5py, numpy; from osgeo_utils.samples import validate_cloud_optimized_geotiff"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(py);
        }
        assert!(!required(), "HYPERMNF_REQUIRE_FORMATS=1 but {py} lacks osgeo (python3-gdal), netCDF4 or h5py");
        eprintln!("skipped: {py} lacks osgeo, netCDF4 or h5py");
        None
    })
    .clone()
}

fn py_run(py: &str, script: &str, args: &[&Path]) -> String {
    let out = Command::new(py).arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "python failed: {}\n{}", String::from_utf8_lossy(&out.stderr), script);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const CHIP: &str = "aviris-ng/ang20160910t185702_2rdn_img.hdr";

/// The AVIRIS-NG chip in every layout, written once per test binary.
struct Layouts {
    dir: PathBuf,
    original: PathBuf,
}

fn layouts() -> Option<&'static Layouts> {
    static L: OnceLock<Option<Layouts>> = OnceLock::new();
    L.get_or_init(|| {
        let formats = formats_dir()?;
        let py = python()?;
        let original = formats.join(CHIP);
        let cube = cube::open(&original).unwrap();
        let dir = tempfile::tempdir().unwrap().keep();
        let meta = serde_json::json!({
            "wavelength": cube.meta.wavelengths_nm().unwrap(),
            "fwhm": cube.meta.fwhm,
            "map_info": cube.meta.map_info,
        });
        std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/formats_gdal/make_layouts.py");
        let out = Command::new(&py).arg(&script).arg(original.with_extension("")).arg(dir.join("meta.json")).arg(&dir).output().unwrap();
        assert!(out.status.success(), "make_layouts.py: {}", String::from_utf8_lossy(&out.stderr));
        Some(Layouts { dir, original })
    })
    .as_ref()
}

fn same_samples(a: &Cube, b: &Cube, what: &str) {
    assert_eq!((a.lines(), a.samples(), a.bands()), (b.lines(), b.samples(), b.bands()), "{what}: shape");
    let (x, y) = (a.to_f64(), b.to_f64());
    let differ = x.iter().zip(&y).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
    assert_eq!(differ, 0, "{what}: {differ} samples differ from the ENVI original");
}

fn mnf(cube: &Cube) -> hypermnf::mnf::MnfOutput {
    let params = hypermnf::mnf::MnfParams { components: Some(8), inverse: true, ..Default::default() };
    let backend = hypermnf::backend::cpu::CpuBackend::new();
    hypermnf::mnf::run(cube, &params, &backend, &hypermnf::mnf::Monitor::silent()).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---------------------------------------------------------------- real samples

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

// ---------------------------------------------------------------- COG outputs

const CHECK_COG: &str = r#"
import sys, json
from osgeo import gdal, osr
from osgeo_utils.samples import validate_cloud_optimized_geotiff as v
gdal.UseExceptions()
cog, src = sys.argv[1], sys.argv[2]
warnings, errors, _ = v.validate(cog, full_check=True)
d = gdal.Open(cog)
out = {"errors": errors, "bands": d.RasterCount, "size": [d.RasterXSize, d.RasterYSize],
       "gt": list(d.GetGeoTransform()) if d.GetProjection() else None,
       "layout": d.GetMetadataItem("LAYOUT", "IMAGE_STRUCTURE"),
       "descriptions": [d.GetRasterBand(i + 1).GetDescription() for i in range(d.RasterCount)],
       "md": d.GetMetadata(), "type": gdal.GetDataTypeName(d.GetRasterBand(1).DataType)}
if d.GetProjection() and src != "-":
    s = gdal.Open(src)
    out["same_crs"] = bool(osr.SpatialReference(wkt=d.GetProjection()).IsSame(osr.SpatialReference(wkt=s.GetProjection())))
    out["src_gt"] = list(s.GetGeoTransform())
print(json.dumps(out))
"#;

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

fn run_cli(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypermnf")).args(["run", "--backend", "cpu", "--components", "5"]).args(args).output().unwrap()
}

fn check_cog(py: &str, cog: &Path, src: &Path) -> serde_json::Value {
    serde_json::from_str(&py_run(py, CHECK_COG, &[cog, src])).unwrap()
}

#[test]
fn cog_results_carry_the_source_crs_and_pass_gdal_validation() {
    let Some(l) = layouts() else { return };
    let py = python().unwrap();
    let out = tempfile::tempdir().unwrap();
    let envi_data = l.original.with_extension("");
    for (name, input) in [("envi", l.original.clone()), ("neon", l.dir.join("neon_refl.h5")), ("tif", l.dir.join("cube.tif"))] {
        let cog = out.path().join(format!("{name}.tif"));
        let r = run_cli(&[input.as_os_str(), "--inverse".as_ref(), "--out".as_ref(), cog.as_os_str()]);
        assert!(r.status.success(), "{name}: {}", String::from_utf8_lossy(&r.stderr));
        let v = check_cog(&py, &cog, &envi_data);
        assert_eq!(v["errors"], serde_json::json!([]), "{name}: {v}");
        assert_eq!(v["layout"], "COG", "{name}");
        assert_eq!(v["type"], "Float32", "{name}");
        assert_eq!(v["bands"], 5, "{name}");
        assert_eq!(v["descriptions"], serde_json::json!(["MNF 1", "MNF 2", "MNF 3", "MNF 4", "MNF 5"]), "{name}");
        assert_eq!(v["md"]["MNF_EIGENVALUES"].as_str().unwrap().split(',').count(), 5, "{name}");
        assert!(v["md"]["MNF_SNR"].is_string(), "{name}");
        assert_eq!(v["same_crs"], true, "{name}: {v}");
        assert_eq!(v["gt"], v["src_gt"], "{name}: {v}");
        let den = out.path().join(format!("{name}-denoised.tif"));
        let d = check_cog(&py, &den, &envi_data);
        assert_eq!((d["errors"].clone(), d["bands"].clone(), d["same_crs"].clone()), (serde_json::json!([]), serde_json::json!(425), serde_json::json!(true)), "{name} denoised: {d}");
        // The denoised COG reads back as a cube with the source's wavelengths.
        let back = cube::open(&den).unwrap();
        assert_eq!(back.meta.wavelength.as_ref().map(Vec::len), Some(425));
    }
}

#[test]
fn emit_results_stay_in_sensor_geometry_unless_ortho_applies_the_glt() {
    let Some(l) = layouts() else { return };
    let py = python().unwrap();
    let out = tempfile::tempdir().unwrap();
    let nc = l.dir.join("emit_rdn.nc");
    let sensor = out.path().join("sensor.tif");
    let r = run_cli(&[nc.as_os_str(), "--out".as_ref(), sensor.as_os_str()]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v = check_cog(&py, &sensor, Path::new("-"));
    assert_eq!(v["errors"], serde_json::json!([]));
    assert_eq!(v["gt"], serde_json::Value::Null, "sensor geometry has no CRS: {v}");
    assert!(v["md"]["HYPERMNF_GEOMETRY"].as_str().unwrap().contains("sensor geometry"));
    assert_eq!(v["size"], serde_json::json!([30, 25]));

    let ortho = out.path().join("ortho.tif");
    let r = run_cli(&[nc.as_os_str(), "--ortho".as_ref(), "--out".as_ref(), ortho.as_os_str()]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v = check_cog(&py, &ortho, &l.original.with_extension(""));
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["size"], serde_json::json!([32, 27]), "the GLT's grid");
    assert_eq!(v["same_crs"], true, "{v}");
    // make_layouts.py put the grid one cell up and left of the chip's own.
    let src = v["src_gt"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>();
    let gt = v["gt"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>();
    assert_eq!(gt, vec![src[0] - src[1], src[1], 0.0, src[3] - src[5], 0.0, src[5]]);
    // Cell (1, 1) of the grid is pixel (0, 0) of the sensor geometry; the border is no-data.
    let vals = py_run(&py, "from osgeo import gdal; import sys; a=gdal.Open(sys.argv[1]).ReadAsArray(); b=gdal.Open(sys.argv[2]).ReadAsArray(); print(repr(float(a[0,1,1])), repr(float(b[0,0,0])), repr(float(a[0,0,0])))", &[&ortho, &sensor]);
    let vals: Vec<&str> = vals.split_whitespace().collect();
    assert_eq!(vals[0], vals[1]);
    assert_eq!(vals[2], "nan");

    // --ortho on an input without a GLT is refused before anything is written.
    let tif = l.dir.join("cube.tif");
    let bad = out.path().join("no-glt.tif");
    let r = run_cli(&[tif.as_os_str(), "--ortho".as_ref(), "--out".as_ref(), bad.as_os_str()]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("geometry lookup table"));
    assert!(!bad.exists());
}

// ---------------------------------------------------------------- bad files

#[test]
fn bad_files_are_refused_clearly_and_leave_nothing_behind() {
    let Some(l) = layouts() else { return };
    for (name, says) in [
        ("bad_truncated.nc", "not a readable NetCDF file"),
        ("bad_truncated.h5", "not a readable HDF5 file"),
        ("bad_rank.nc", "EMIT's are (downtrack, crosstrack, bands)"),
        ("bad_one_band.tif", "a raster of 1 band: MNF needs a multi-band"),
        ("bad_not_raster.tif", "not a raster GDAL can read"),
    ] {
        let p = l.dir.join(name);
        let e = cube::open(&p).err().unwrap_or_else(|| panic!("{name} was read"));
        assert!(e.to_string().contains(says), "{name}: {e}");
        assert!(matches!(e, cube::CubeError::Header(_) | cube::CubeError::Unsupported(_)), "{name}: a 4xx error, not {e:?}");
        assert!(!e.to_string().contains('\n'), "{name}: one line: {e}");
        let out = tempfile::tempdir().unwrap();
        let r = run_cli(&[p.as_os_str(), "--out".as_ref(), out.path().join("o.tif").as_os_str()]);
        assert!(!r.status.success(), "{name}");
        assert!(String::from_utf8_lossy(&r.stderr).contains(says), "{name}: {}", String::from_utf8_lossy(&r.stderr));
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "{name}: something was left behind");
    }
}

#[test]
fn a_failed_cog_write_leaves_no_partial_file() {
    let out = tempfile::tempdir().unwrap();
    let p = out.path().join("x.tif");
    let meta = hypermnf::cube::gdal::cog::CogMeta::default();
    // Wrong length: refused before anything is written.
    assert!(hypermnf::cube::gdal::cog::write(&p, 2, 2, 2, &[0.0; 7], &meta).is_err());
    // A directory that does not exist: GDAL fails, and no .partial stays.
    assert!(hypermnf::cube::gdal::cog::write(&out.path().join("no/such/x.tif"), 2, 2, 2, &[0.0; 8], &meta).is_err());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    hypermnf::cube::gdal::cog::write(&p, 2, 2, 2, &[1.0; 8], &meta).unwrap();
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 1);
}

// ---------------------------------------------------------------- the service

mod common;

/// A GeoTIFF and an EMIT NetCDF by `href` (the native API and the OGC process), the result as a COG
/// (`?format=cog`) with the source's CRS; a file that claims more than the upload limit is refused
/// before it is read; a bad file is a 4xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reads_gdal_hrefs_and_serves_cog_results() {
    let Some(l) = layouts() else { return };
    let py = python().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![l.dir.canonicalize().unwrap()];
    let srv = common::TestServer::start(args).await;
    let work = tempfile::tempdir().unwrap();
    for (name, params) in [("cube.tif", serde_json::json!({"components": 4})), ("emit_rdn.nc", serde_json::json!({"components": 3}))] {
        let body = serde_json::json!({"input": {"href": format!("file://{}", l.dir.join(name).display())}, "params": params});
        let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
        let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
        assert_eq!(s, reqwest::StatusCode::ACCEPTED, "{name}: {j}");
        let id = j["id"].as_str().unwrap().to_string();
        let done = srv.wait(&id).await;
        assert_eq!(done["status"], "succeeded", "{name}: {done}");
        let r = srv.client.get(srv.url(&format!("/v1/jobs/{id}/result?format=cog"))).send().await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::OK, "{name}");
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("image/tiff; application=geotiff"));
        let cog = work.path().join(format!("{name}.tif"));
        std::fs::write(&cog, r.bytes().await.unwrap()).unwrap();
        let v = check_cog(&py, &cog, &l.original.with_extension(""));
        assert_eq!(v["errors"], serde_json::json!([]), "{name}: {v}");
        assert_eq!(v["bands"], params["components"], "{name}");
        if name == "cube.tif" {
            assert_eq!(v["same_crs"], true, "{name}: {v}");
            assert_eq!(v["gt"], v["src_gt"], "{name}: {v}");
        } else {
            assert_eq!(v["gt"], serde_json::Value::Null, "EMIT in sensor geometry: {v}");
        }
    }
    // A single-file upload with its media type: decoded once, then an ordinary ENVI input.
    let bytes = std::fs::read(l.dir.join("neon_refl.h5")).unwrap();
    let r = srv.client.post(srv.url("/v1/jobs?components=6")).header("content-type", "application/x-hdf5").body(bytes).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "{j}");
    assert_eq!((j["input"]["lines"].as_u64(), j["input"]["bands"].as_u64()), (Some(25), Some(425)), "{j}");
    let done = srv.wait(j["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (_, md) = srv.get_json(&format!("/v1/jobs/{}/metadata", j["id"].as_str().unwrap())).await;
    assert!(md["source"]["map_info"].as_str().unwrap().starts_with("UTM"), "{md}");
    assert_eq!(md["pixels"]["ignore_value"], -9999.0, "{md}");
    // A truncated one: 400, nothing kept.
    let bytes = std::fs::read(l.dir.join("bad_truncated.nc")).unwrap();
    let r = srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-netcdf").body(bytes).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::BAD_REQUEST, "{j}");
    assert!(j.to_string().contains("the upload: not a readable NetCDF"), "{j}");
    assert!(!j.to_string().contains("scratch"), "no server path in the message: {j}");
    let scratch = tmp.path().join("objects/scratch");
    let left = std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "the refused upload left files in {}", scratch.display());
    // The OGC process advertises COG outputs, takes a GeoTIFF href and gives the COG by reference.
    let (_, d) = srv.get_json("/processes/mnf").await;
    assert!(d["outputs"]["components"].to_string().contains("image/tiff; application=geotiff; profile=cloud-optimized"));
    let exec = serde_json::json!({
        "inputs": {"cube": {"href": format!("file://{}", l.dir.join("cube.tif").display())}, "components": 2},
        "outputs": {"components": {"transmissionMode": "reference", "format": {"mediaType": "image/tiff; application=geotiff; profile=cloud-optimized"}}},
        "response": "document"
    });
    let r = srv.client.post(srv.url("/processes/mnf/execution")).json(&exec).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert!(s.is_success(), "{s} {j}");
    let href = j["components"]["href"].as_str().unwrap_or_else(|| panic!("{j}"));
    assert!(href.ends_with("/result?format=cog"), "{j}");
    assert!(j["components"]["type"].as_str().unwrap().starts_with("image/tiff"), "{j}");
    let r = srv.client.get(href).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let cog = work.path().join("ogc.tif");
    std::fs::write(&cog, r.bytes().await.unwrap()).unwrap();
    let v = check_cog(&py, &cog, &l.original.with_extension(""));
    assert_eq!((v["errors"].clone(), v["bands"].clone(), v["same_crs"].clone()), (serde_json::json!([]), serde_json::json!(2), serde_json::json!(true)), "{v}");
    // A bad file by href: 4xx, with the reader's message.
    let body = serde_json::json!({"input": {"href": format!("file://{}", l.dir.join("bad_one_band.tif").display())}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert!(s.is_client_error(), "{s} {j}");
    assert!(j.to_string().contains("MNF needs a multi-band"), "{j}");
    srv.stop().await;

    // A server with a small limit refuses the file from its header, before reading it.
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![l.dir.canonicalize().unwrap()];
    args.max_upload_bytes = 100_000;
    let srv = common::TestServer::start(args).await;
    let body = serde_json::json!({"input": {"href": format!("file://{}", l.dir.join("emit_rdn.nc").display())}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
    srv.stop().await;
}

/// Two GeoTIFFs' pixels (NaN equal to NaN), geotransforms and CRS compared.
const SAME_RASTER: &str = r#"
import sys, json
import numpy as np
from osgeo import gdal, osr
a, b = gdal.Open(sys.argv[1]), gdal.Open(sys.argv[2])
print(json.dumps({
    "same_pixels": bool(np.array_equal(a.ReadAsArray(), b.ReadAsArray(), equal_nan=True)),
    "gt": [list(a.GetGeoTransform()), list(b.GetGeoTransform())],
    "same_crs": bool(osr.SpatialReference(wkt=a.GetProjection()).IsSame(osr.SpatialReference(wkt=b.GetProjection()))),
    "size": [[a.RasterXSize, a.RasterYSize, a.RasterCount], [b.RasterXSize, b.RasterYSize, b.RasterCount]],
    "geometry": a.GetMetadataItem("HYPERMNF_GEOMETRY"),
}))
"#;

/// `ortho=true` in the service: the COG of an EMIT granule, by `file://` href and by upload, is the one
/// `hypermnf run --ortho` writes (pixels, geotransform, CRS); `ortho` is part of the job's identity; it
/// is refused (422) without a GLT, and the job's sensor-geometry downloads are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ortho_in_the_service_gives_the_clis_orthorectified_cog() {
    let Some(l) = layouts() else { return };
    let py = python().unwrap();
    let work = tempfile::tempdir().unwrap();
    let nc = l.dir.join("emit_rdn.nc");
    let cli = work.path().join("cli.tif");
    let r = run_cli(&[nc.as_os_str(), "--ortho".as_ref(), "--out".as_ref(), cli.as_os_str()]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![l.dir.canonicalize().unwrap()];
    let srv = common::TestServer::start(args).await;
    let href = format!("file://{}", nc.display());
    let by_href = |ortho: bool| serde_json::json!({"input": {"href": href}, "params": {"components": 5, "backend": "cpu", "ortho": ortho}});
    let cog_of = |id: String, name: &str| {
        let (srv, path) = (&srv, work.path().join(name));
        async move {
            let done = srv.wait(&id).await;
            assert_eq!(done["status"], "succeeded", "{done}");
            assert_eq!(done["params"]["ortho"], true, "{done}");
            let r = srv.client.get(srv.url(&format!("/v1/jobs/{id}/result?format=cog"))).send().await.unwrap();
            assert_eq!(r.status(), reqwest::StatusCode::OK);
            std::fs::write(&path, r.bytes().await.unwrap()).unwrap();
            path
        }
    };
    let same_as_cli = |cog: &Path| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&py_run(&py, SAME_RASTER, &[cog, &cli])).unwrap();
        assert_eq!(v["same_pixels"], true, "{v}");
        assert_eq!(v["gt"][0], v["gt"][1], "{v}");
        assert_eq!(v["same_crs"], true, "{v}");
        assert_eq!(v["size"][0], v["size"][1], "{v}");
        assert!(v["geometry"].as_str().unwrap().contains("orthorectified"), "{v}");
        v
    };

    // By href.
    let r = srv.client.post(srv.url("/v1/jobs")).json(&by_href(true)).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "{j}");
    let ortho_id = j["id"].as_str().unwrap().to_string();
    let cog = cog_of(ortho_id.clone(), "href.tif").await;
    same_as_cli(&cog);
    assert_eq!(check_cog(&py, &cog, Path::new("-"))["errors"], serde_json::json!([]), "a valid COG");
    // Its .npy and ENVI downloads (sensor geometry) are refused rather than given as the result.
    for format in ["npy", "envi"] {
        let r = srv.client.get(srv.url(&format!("/v1/jobs/{ortho_id}/result?format={format}"))).send().await.unwrap();
        let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
        assert_eq!((s, j["code"].as_str()), (reqwest::StatusCode::UNPROCESSABLE_ENTITY, Some("ortho_needs_cog")), "{format}: {j}");
    }
    // The same request is the same job; without ortho it is another, whose COG stays in sensor geometry.
    let r = srv.client.post(srv.url("/v1/jobs")).json(&by_href(true)).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, j["id"].as_str()), (reqwest::StatusCode::OK, Some(ortho_id.as_str())), "{j}");
    let r = srv.client.post(srv.url("/v1/jobs")).json(&by_href(false)).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "a job of its own: {j}");
    assert_ne!(j["id"].as_str(), Some(ortho_id.as_str()));
    assert!(j["params"].get("ortho").is_none(), "ortho=false is the default, left out of the params: {j}");
    let sensor_id = j["id"].as_str().unwrap().to_string();
    assert_eq!(srv.wait(&sensor_id).await["status"], "succeeded");
    let r = srv.client.get(srv.url(&format!("/v1/jobs/{sensor_id}/result?format=cog"))).send().await.unwrap();
    let sensor = work.path().join("sensor.tif");
    std::fs::write(&sensor, r.bytes().await.unwrap()).unwrap();
    let v = check_cog(&py, &sensor, Path::new("-"));
    assert_eq!(v["gt"], serde_json::Value::Null, "sensor geometry, no CRS: {v}");
    assert!(v["md"]["HYPERMNF_GEOMETRY"].as_str().unwrap().contains("sensor geometry"), "{v}");

    // By upload: the GLT is kept with the job (the upload itself is removed once the job has run).
    // The same cube and parameters would be answered by the href's job: it goes first.
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{ortho_id}"))).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let bytes = std::fs::read(&nc).unwrap();
    let r = srv
        .client
        .post(srv.url("/v1/jobs?components=5&backend=cpu&ortho=true"))
        .header("content-type", "application/x-netcdf")
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "{j}");
    let upload_id = j["id"].as_str().unwrap().to_string();
    let cog = cog_of(upload_id.clone(), "upload.tif").await;
    same_as_cli(&cog);
    assert!(tmp.path().join(format!("objects/geometry/{upload_id}/glt.tif")).is_file(), "the GLT kept with the job");
    // Deleting the job deletes its GLT.
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{upload_id}"))).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert!(!tmp.path().join(format!("objects/geometry/{upload_id}")).exists(), "the GLT went with the job");

    // No GLT: 422, nothing created.
    let tif = format!("file://{}", l.dir.join("cube.tif").display());
    let r = srv.client.post(srv.url("/v1/jobs")).json(&serde_json::json!({"input": {"href": tif}, "params": {"ortho": true}})).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, j["code"].as_str()), (reqwest::StatusCode::UNPROCESSABLE_ENTITY, Some("ortho_needs_glt")), "{j}");
    let h5 = std::fs::read(l.dir.join("neon_refl.h5")).unwrap();
    let r = srv.client.post(srv.url("/v1/jobs?ortho=true")).header("content-type", "application/x-hdf5").body(h5).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, j["code"].as_str()), (reqwest::StatusCode::UNPROCESSABLE_ENTITY, Some("ortho_needs_glt")), "{j}");
    let npy = work.path().join("c.npy");
    hypermnf::cube::npy::write_f32(&npy, &[4, 4, 3], &[1.0; 48]).unwrap();
    let r = srv.client.post(srv.url("/v1/jobs?ortho=true")).header("content-type", "application/x-npy").body(std::fs::read(&npy).unwrap()).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY);
    // The OGC process takes ortho, and only with GeoTIFF outputs.
    let exec = |outputs: serde_json::Value| serde_json::json!({"inputs": {"cube": {"href": href}, "components": 5, "backend": "cpu", "ortho": true}, "outputs": outputs, "response": "document"});
    let r = srv.client.post(srv.url("/processes/mnf/execution")).json(&exec(serde_json::json!({}))).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert!(s.is_client_error() && j.to_string().contains("ortho=true gives the result as a Cloud-Optimized GeoTIFF"), "{s} {j}");
    let cog_out = serde_json::json!({"components": {"transmissionMode": "reference", "format": {"mediaType": "image/tiff; application=geotiff; profile=cloud-optimized"}}});
    let r = srv.client.post(srv.url("/processes/mnf/execution")).json(&exec(cog_out)).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert!(s.is_success(), "{s} {j}");
    let r = srv.client.get(j["components"]["href"].as_str().unwrap_or_else(|| panic!("{j}"))).send().await.unwrap();
    let ogc = work.path().join("ogc.tif");
    std::fs::write(&ogc, r.bytes().await.unwrap()).unwrap();
    same_as_cli(&ogc);
    srv.stop().await;
}

/// A pooled batch of EMIT NetCDF granules by `file://` reference: GDAL reads each whole file where it
/// is, at submit (to check it) and in the run; every member's components are, byte for byte, what
/// `hypermnf run --system` writes with the batch's system file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_of_netcdf_granules_by_file_reference() {
    let Some(l) = layouts() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![l.dir.canonicalize().unwrap()];
    let srv = common::TestServer::start(args).await;
    let files = [l.dir.join("emit_rdn.nc"), l.dir.join("emit_rfl.nc")];
    let hrefs: Vec<String> = files.iter().map(|f| format!("file://{}", f.display())).collect();
    let b = run_batch(&srv, &hrefs, "pooled", serde_json::json!({"components": 4, "backend": "cpu"})).await;
    members_equal_run_with_system(&srv, &b, &files).await;
    srv.stop().await;
}

// ---------------------------------------------------------------- GDAL formats by s3:// and https://

use common::https_site::Https;
use common::s3::{s3_bucket, s3_client, s3_put};
use common::scratch_entries;

/// Posts a batch of `hrefs` and waits for every member to finish: the batch's document, which must
/// say succeeded.
async fn run_batch(srv: &common::TestServer, hrefs: &[String], statistics: &str, params: serde_json::Value) -> serde_json::Value {
    let inputs: Vec<serde_json::Value> = hrefs.iter().map(|h| serde_json::json!({"href": h})).collect();
    let body = serde_json::json!({"inputs": inputs, "statistics": statistics, "params": params});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, b) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::CREATED, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(150);
    let b = loop {
        let (_, b) = srv.get_json(&format!("/v1/batches/{id}")).await;
        if b["jobs"].as_array().unwrap().iter().all(|j| matches!(j["status"].as_str(), Some("succeeded" | "failed" | "canceled"))) {
            break b;
        }
        assert!(std::time::Instant::now() < deadline, "the batch did not finish: {b}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(b["status"], "succeeded", "{b}");
    assert_eq!(b["jobs"].as_array().unwrap().len(), hrefs.len(), "{b}");
    b
}

/// Every member of the pooled batch `b` (4 components, CPU) gives, byte for byte, what
/// `hypermnf run --system` writes for the same file (`files`, in the batch's order) with the batch's
/// exported system.
async fn members_equal_run_with_system(srv: &common::TestServer, b: &serde_json::Value, files: &[PathBuf]) {
    let (s, system) = srv.get_bytes(&format!("/v1/batches/{}/system", b["id"].as_str().unwrap())).await;
    assert_eq!(s, reqwest::StatusCode::OK, "{}", String::from_utf8_lossy(&system));
    let work = tempfile::tempdir().unwrap();
    let system_path = work.path().join("system.json");
    std::fs::write(&system_path, &system).unwrap();
    for (i, job) in b["jobs"].as_array().unwrap().iter().enumerate() {
        let out = work.path().join(format!("m{i}.npy"));
        let o = Command::new(env!("CARGO_BIN_EXE_hypermnf"))
            .args(["run", files[i].to_str().unwrap(), "--out", out.to_str().unwrap(), "--components", "4", "--backend", "cpu", "--system", system_path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (s, got) = srv.get_bytes(&format!("/v1/jobs/{}/result", job["id"].as_str().unwrap())).await;
        assert_eq!(s, reqwest::StatusCode::OK);
        assert!(got == std::fs::read(&out).unwrap(), "member {i} ({}) differs from hypermnf run --system", files[i].display());
    }
}

/// The components of a finished job.
async fn job_components(srv: &common::TestServer, id: &str) -> Vec<u8> {
    let done = srv.wait(id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (s, bytes) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
    assert_eq!(s, reqwest::StatusCode::OK);
    bytes
}

async fn counts(srv: &common::TestServer) -> (usize, usize) {
    let (_, jobs) = srv.get_json("/v1/jobs").await;
    let (_, batches) = srv.get_json("/v1/batches").await;
    (jobs["jobs"].as_array().unwrap().len(), batches["batches"].as_array().unwrap().len())
}

/// GDAL objects by reference (`url` names the layout file `name` where the test put it), through a
/// server allowed to read them:
/// - a pooled batch of the two EMIT NetCDF granules: every member equals `hypermnf run --system` with
///   the batch's system;
/// - an "each" batch of the GeoTIFF: its member equals the single job of the same href (submitted
///   after it: the single job's path, which digests the object at submit) and `hypermnf run`; the
///   single job asked again is answered with itself;
/// - a batch whose second input is the truncated NetCDF is refused naming that input, and leaves no
///   job, batch or scratch file.
async fn gdal_objects_by_reference(srv: &common::TestServer, data_dir: &Path, l: &Layouts, url: impl Fn(&str) -> String) {
    let params = serde_json::json!({"components": 4, "backend": "cpu"});
    let b = run_batch(srv, &[url("emit_rdn.nc"), url("emit_rfl.nc")], "pooled", params.clone()).await;
    members_equal_run_with_system(srv, &b, &[l.dir.join("emit_rdn.nc"), l.dir.join("emit_rfl.nc")]).await;

    let tif = url("cube.tif");
    let b = run_batch(srv, std::slice::from_ref(&tif), "each", params.clone()).await;
    let member = job_components(srv, b["jobs"][0]["id"].as_str().unwrap()).await;
    let body = serde_json::json!({"input": {"href": tif}, "params": params});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "a batch's member answers no other request: {j}");
    let bands = cube::open(&l.dir.join("cube.tif")).unwrap().bands();
    assert_eq!(j["input"]["bands"].as_u64(), Some(bands as u64), "the object was decoded at submit: {j}");
    let single = j["id"].as_str().unwrap().to_string();
    assert!(job_components(srv, &single).await == member, "the \"each\" member differs from the single job of the same href");
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, again) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, again["id"].as_str()), (reqwest::StatusCode::OK, Some(single.as_str())), "{again}");
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("cli.npy");
    let o = Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["run", l.dir.join("cube.tif").to_str().unwrap(), "--out", out.to_str().unwrap(), "--components", "4", "--backend", "cpu"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(member == std::fs::read(&out).unwrap(), "the \"each\" member differs from hypermnf run");

    let before = counts(srv).await;
    let inputs = [serde_json::json!({"href": url("emit_rdn.nc")}), serde_json::json!({"href": url("bad_truncated.nc")})];
    let body = serde_json::json!({"inputs": inputs, "statistics": "pooled", "params": {"components": 4}});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, e) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::BAD_REQUEST, "{e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("input 1: ") && message.contains("not a readable NetCDF"), "{e}");
    assert!(!message.contains("scratch"), "no server path in the message: {e}");
    assert_eq!(counts(srv).await, before, "the refused batch left jobs or a batch");
    assert_eq!(scratch_entries(data_dir), Vec::<PathBuf>::new(), "the refused batch left scratch files");
}

/// GDAL objects by `https://` reference, from the test's own https server (allowed by IP literal, its
/// CA trusted), in batches and as a single job; one the policy forbids (a port not allowed) is
/// refused in a batch naming its input, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gdal_objects_by_https_reference_in_batches() {
    let Some(l) = layouts() else { return };
    let site = Https::start().await;
    for name in ["emit_rdn.nc", "emit_rfl.nc", "cube.tif", "bad_truncated.nc"] {
        site.put(&format!("/granules/{name}"), std::fs::read(l.dir.join(name)).unwrap());
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_hosts = vec![site.addr.to_string()];
    args.input_ca_certs = vec![site.ca.clone()];
    let srv = common::TestServer::start(args).await;
    gdal_objects_by_reference(&srv, tmp.path(), l, |name| site.url(&format!("/granules/{name}"))).await;

    let before = counts(&srv).await;
    let elsewhere = format!("https://127.0.0.1:{}/granules/emit_rfl.nc", site.addr.port() + 1);
    let body = serde_json::json!({"inputs": [{"href": site.url("/granules/emit_rdn.nc")}, {"href": elsewhere}], "statistics": "pooled"});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, e) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, e["code"].as_str()), (reqwest::StatusCode::FORBIDDEN, Some("forbidden_reference")), "{e}");
    assert!(e["message"].as_str().unwrap_or_default().starts_with("input 1: "), "{e}");
    assert_eq!(counts(&srv).await, before, "the refused batch left jobs or a batch");
    assert_eq!(scratch_entries(tmp.path()), Vec::<PathBuf>::new(), "the refused batch left scratch files");
    srv.stop().await;
}

/// The same with `s3://` references, the objects put in the test S3 server (scripts/lib/garage.sh) by
/// the test's own client; skipped without one, unless `HYPERMNF_REQUIRE_S3=1` (scripts/test.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gdal_objects_by_s3_reference_in_batches() {
    let Some(l) = layouts() else { return };
    let Some(bucket) = s3_bucket("gdal_objects_by_s3_reference_in_batches") else { return };
    let store = s3_client(&bucket);
    let prefix = format!("formats-gdal-{}", uuid::Uuid::new_v4());
    let names = ["emit_rdn.nc", "emit_rfl.nc", "cube.tif", "bad_truncated.nc"];
    for name in names {
        s3_put(store.as_ref(), &format!("{prefix}/{name}"), std::fs::read(l.dir.join(name)).unwrap()).await;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_buckets = vec![bucket.clone()];
    let srv = common::TestServer::start(args).await;
    gdal_objects_by_reference(&srv, tmp.path(), l, |name| format!("s3://{bucket}/{prefix}/{name}")).await;
    srv.stop().await;
    for name in names {
        store.delete(&object_store::path::Path::from(format!("{prefix}/{name}"))).await.unwrap();
    }
}
