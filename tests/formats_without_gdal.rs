//! A build without the `gdal` feature (the default): NetCDF, HDF5 and GeoTIFF inputs, and `.tif`
//! outputs, are refused with an error that names the feature — `cube::open`, `hypermnf run`, and the
//! service's 415 — rather than "not an ENVI header". (tests/formats_gdal/ tests the feature itself.)
#![cfg(not(feature = "gdal"))]

use hypermnf::cube::{self, CubeError};

mod common;

/// Files of each format, by extension and (for a stored upload without one) by signature alone.
fn samples(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let files: [(&str, &[u8]); 5] = [
        ("granule.nc", b"\x89HDF\r\n\x1a\nrest"),
        ("neon.h5", b"\x89HDF\r\n\x1a\nrest"),
        ("enmap.tif", b"II*\0rest"),
        ("upload-without-extension", b"MM\0*rest"),
        ("classic", b"CDF\x01rest"),
    ];
    files
        .iter()
        .map(|(name, bytes)| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect()
}

#[test]
fn gdal_formats_name_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    for p in samples(dir.path()) {
        let e = cube::open(&p).unwrap_err();
        assert!(matches!(e, CubeError::NeedsGdal(_)), "{}: {e:?}", p.display());
        assert!(e.to_string().contains("--features gdal"), "{e}");
        assert_eq!(e.code(), "needs_gdal_feature");
        assert!(matches!(cube::map(&p), Err(CubeError::NeedsGdal(_))));
    }
    // Anything else is still "not a cube file".
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, "hello").unwrap();
    assert!(matches!(cube::open(&other), Err(CubeError::Unsupported(_))));
}

#[test]
fn the_cli_refuses_a_tif_output_before_reading() {
    let out = tempfile::tempdir().unwrap();
    let hdr = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/salinasA_224_bip_be.hdr");
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["run", "--backend", "cpu"])
        .arg(&hdr)
        .arg("--out")
        .arg(out.path().join("mnf.tif"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success());
    assert!(stderr.contains("--features gdal"), "{stderr}");
    assert!(!stderr.contains("reading"), "refused before reading: {stderr}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_answers_415_naming_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let files = samples(dir.path());
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![dir.path().canonicalize().unwrap()];
    let srv = common::TestServer::start(args).await;
    let body = serde_json::json!({"input": {"href": format!("file://{}", files[2].display())}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::UNSUPPORTED_MEDIA_TYPE, "{j}");
    assert_eq!(j["code"], "needs_gdal_feature", "{j}");
    assert!(j.to_string().contains("--features gdal"), "{j}");
    // An upload by media type, refused before its body is read.
    let r = srv.client.post(srv.url("/v1/jobs")).header("content-type", "image/tiff").body(b"II*\0rest".to_vec()).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, j["code"].as_str()), (reqwest::StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("needs_gdal_feature")), "{j}");
    srv.stop().await;
}
