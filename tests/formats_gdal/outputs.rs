//! COG outputs from the CLI, refusals of bad files, and a failed COG write.

use super::*;

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
