//! The service: GDAL hrefs, COG results and the orthorectified COG.

use super::*;


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
