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
//! The tests are grouped by subject in tests/formats_gdal/: reading, outputs (the CLI's COGs), service,
//! batches; the helpers they share are here.
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


fn run_cli(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypermnf")).args(["run", "--backend", "cpu", "--components", "5"]).args(args).output().unwrap()
}

fn check_cog(py: &str, cog: &Path, src: &Path) -> serde_json::Value {
    serde_json::from_str(&py_run(py, CHECK_COG, &[cog, src])).unwrap()
}


#[path = "../common/mod.rs"]
mod common;

mod batches;
mod chunks;
mod outputs;
mod reading;
mod service;
