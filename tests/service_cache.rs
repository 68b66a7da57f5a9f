//! The job cache through the HTTP service: a real server on a loopback port with its real SQLite
//! database in a temporary data dir, on the CPU backend.
//!
//! * statistics level: a request that changes only `components`, `snr` or `inverse` reuses the eigen
//!   system of an earlier job of the same cube: the same bytes as a cold run of that request in a
//!   fresh data dir, metadata that says so, and a shorter job;
//! * the indexes are rebuilt from the database when the server starts again on the same data dir;
//! * a different noise estimator, noise window, bad bands or no-data value is a miss;
//! * deleting the job that computed an eigen system takes the system with it;
//! * `/metrics` counts hits and misses per level.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{json, Value};

mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

/// A statistics-level hit gives the bytes of a cold run of the same request, says that it reused
/// the statistics (and of which job), and takes less time than the cold run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statistics_hit_is_bit_identical_to_a_cold_run_and_faster() {
    let npy = npy_bytes(&synthetic_cube(TIMED.0, TIMED.1, TIMED.2, 7));
    let tmp = tempfile::tempdir().unwrap(); // every data dir of this test, removed at its end
    let warm = TestServer::start(args(&tmp.path().join("warm"))).await;

    let first = warm.run_npy(&npy, "components=5").await;
    assert!(metadata_of(&warm, &first).await.get("statistics").is_none(), "the first job computes its statistics");
    assert_eq!(warm.metric("hypermnf_job_cache_misses_total", "statistics").await, 1.0);
    assert_eq!(warm.metric("hypermnf_job_cache_entries", "statistics").await, 1.0);

    // Only the projection parameters change: three hits on the first job's eigen system.
    let requests = ["components=3", "snr=2&inverse=true", "components=7&inverse=true"];
    let mut hits = Vec::new();
    for (i, q) in requests.iter().enumerate() {
        let id = warm.run_npy(&npy, q).await;
        let md = metadata_of(&warm, &id).await;
        assert_eq!(md["statistics"], json!({"reused": true, "from_job": first, "source": "storage"}), "{q}");
        let t = md["timings_ms"].as_object().unwrap();
        assert!(!t.contains_key("statistics") && !t.contains_key("eigen") && t.contains_key("projection"), "{q}: {t:?}");
        assert_eq!(warm.metric("hypermnf_job_cache_hits_total", "statistics").await, (i + 1) as f64);
        hits.push(id);
    }
    assert_eq!(warm.metric("hypermnf_job_cache_misses_total", "statistics").await, 1.0);

    // Each request again, cold, in a fresh data dir: the same bytes.
    let mut timing = None;
    for (q, warm_id) in requests.iter().zip(&hits) {
        let cold = TestServer::start(args(&tmp.path().join(format!("cold-{warm_id}")))).await;
        let cold_id = cold.run_npy(&npy, q).await;
        let cold_md = metadata_of(&cold, &cold_id).await;
        assert!(cold_md.get("statistics").is_none());
        let warm_md = metadata_of(&warm, warm_id).await;
        assert_eq!(comparable(warm_md.clone()), comparable(cold_md.clone()), "{q}: metadata");
        for product in ["", "?product=denoised", "?format=envi"] {
            let (w, c) = (warm.result(warm_id, product).await, cold.result(&cold_id, product).await);
            assert_eq!(w.0, c.0, "{q} {product}");
            if w.0 == StatusCode::OK {
                // The ENVI zip names its entries after the job: compare what is inside.
                let same = if product == "?format=envi" { unzip_values(&w.1) == unzip_values(&c.1) } else { w.1 == c.1 };
                assert!(same, "{q} {product}: the cached run's bytes differ from a cold run's");
            }
        }
        if *q == "components=3" {
            timing = Some((warm.job_ms(warm_id).await, cold.job_ms(&cold_id).await, warm_md, cold_md));
        }
        cold.stop().await;
    }
    // Faster: the reused job skipped both covariance passes and the eigen decomposition, which the
    // cold run of the same request spent most of its time in (no ratio asserted: the machine is shared).
    let (warm_ms, cold_ms, warm_md, cold_md) = timing.unwrap();
    let stage = |md: &Value, s: &str| md["timings_ms"][s].as_f64().unwrap_or(0.0);
    eprintln!(
        "components=3 on {TIMED:?} int16, CPU: cold job {cold_ms:.0} ms (statistics {:.0} + eigen {:.0} + projection {:.0} ms), \
         statistics-level hit {warm_ms:.0} ms (projection {:.0} ms): {:.1}x",
        stage(&cold_md, "statistics"),
        stage(&cold_md, "eigen"),
        stage(&cold_md, "projection"),
        stage(&warm_md, "projection"),
        cold_ms / warm_ms.max(1.0)
    );
    assert!(stage(&cold_md, "statistics") > 0.0);
    assert!(warm_ms < cold_ms, "the statistics-level hit took {warm_ms} ms, the cold run {cold_ms} ms");

    // The result level: the identical request is the existing job, at once.
    let (s, again) = warm.post_npy(&npy, "components=3").await;
    assert_eq!((s, again["id"].as_str(), again["cached"].as_bool()), (StatusCode::OK, Some(hits[0].as_str()), Some(true)));
    assert_eq!(warm.metric("hypermnf_job_cache_hits_total", "result").await, 1.0);
    warm.stop().await;
}

/// Both indexes are rebuilt from the database: after a restart on the same data dir, the identical
/// request and the statistics are found again; deleting the job that computed the eigen system then
/// takes both away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_survives_a_restart_and_goes_with_its_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let npy = npy_bytes(&synthetic_cube(40, 30, 16, 3));
    let srv = TestServer::start(args(&dir)).await;
    let first = srv.run_npy(&npy, "components=4").await;
    let other = srv.run_npy(&npy_bytes(&synthetic_cube(40, 30, 16, 4)), "components=4").await;
    srv.stop().await;

    let srv = TestServer::start(args(&dir)).await;
    assert_eq!(srv.metric("hypermnf_job_cache_entries", "result").await, 2.0);
    assert_eq!(srv.metric("hypermnf_job_cache_entries", "statistics").await, 2.0);
    let (s, again) = srv.post_npy(&npy, "components=4").await;
    assert_eq!((s, again["id"].as_str()), (StatusCode::OK, Some(first.as_str())));
    assert_eq!(srv.metric("hypermnf_job_cache_hits_total", "result").await, 1.0);
    let reused = srv.run_npy(&npy, "components=2").await;
    assert_eq!(metadata_of(&srv, &reused).await["statistics"]["from_job"].as_str(), Some(first.as_str()));
    assert_eq!(srv.metric("hypermnf_job_cache_hits_total", "statistics").await, 1.0);

    // The job that computed the eigen system goes: its system and its result go with it.
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{first}"))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(srv.metric("hypermnf_job_cache_entries", "statistics").await, 1.0);
    let stored = dir.join("objects/results").join(&first);
    assert!(!stored.exists(), "{} is left behind", stored.display());
    let recomputed = srv.run_npy(&npy, "components=3").await;
    assert!(metadata_of(&srv, &recomputed).await.get("statistics").is_none(), "the deleted job's statistics were used");
    // ... and the identical request to the deleted job is a new job.
    let (s, fresh) = srv.post_npy(&npy, "components=4").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_ne!(fresh["id"].as_str(), Some(first.as_str()));
    srv.wait(fresh["id"].as_str().unwrap()).await;
    // The other cube's system is still there.
    let still = srv.run_npy(&npy_bytes(&synthetic_cube(40, 30, 16, 4)), "components=2").await;
    assert_eq!(metadata_of(&srv, &still).await["statistics"]["from_job"].as_str(), Some(other.as_str()));
    srv.stop().await;
}

/// Everything the statistics depend on is in the key: another noise estimator, noise window, set of
/// bad bands or no-data value computes its own statistics (and is then reused in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_noise_model_is_a_miss() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(args(tmp.path())).await;
    let npy = npy_bytes(&synthetic_cube(40, 30, 16, 5));
    let base = srv.run_npy(&npy, "components=3").await;
    let variants = [
        "noise=shift-difference",
        "noise_window=0,0,20,20",
        "bad_bands=2,5",
        "ignore_value=-1",
    ];
    for (i, v) in variants.iter().enumerate() {
        let id = srv.run_npy(&npy, &format!("components=3&{v}")).await;
        assert!(metadata_of(&srv, &id).await.get("statistics").is_none(), "{v}: reused another noise model's statistics");
        assert_eq!(srv.metric("hypermnf_job_cache_misses_total", "statistics").await, (i + 2) as f64, "{v}");
        // The same noise model with other components: this variant's own statistics.
        let again = srv.run_npy(&npy, &format!("components=2&{v}")).await;
        assert_eq!(metadata_of(&srv, &again).await["statistics"]["from_job"].as_str(), Some(id.as_str()), "{v}");
    }
    // Bad bands are a set: the same bands in another order are the same statistics.
    let reordered = srv.run_npy(&npy, "components=4&bad_bands=5,2").await;
    assert_eq!(metadata_of(&srv, &reordered).await["statistics"]["reused"], true);
    let back = srv.run_npy(&npy, "components=5").await;
    assert_eq!(metadata_of(&srv, &back).await["statistics"]["from_job"].as_str(), Some(base.as_str()));
    assert_eq!(srv.metric("hypermnf_job_cache_hits_total", "statistics").await, 6.0);
    srv.stop().await;
}

/// Eigen systems are shared between owners (the same cube gives the same statistics), but another
/// owner's job id is not disclosed, and results stay per owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_share_statistics_but_not_job_ids_or_results() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let keys = dir.join("keys");
    std::fs::write(&keys, "alice:alice-key\nbob:bob-key\n").unwrap();
    let mut a = args(&dir.join("data"));
    a.api_keys_file = Some(keys);
    let srv = TestServer::start(a).await;
    let npy = npy_bytes(&synthetic_cube(30, 24, 12, 6));
    let post = |key: &'static str, q: &'static str| {
        srv.client.post(srv.url(&format!("/v1/jobs?{q}"))).bearer_auth(key).header("content-type", "application/x-npy").body(npy.clone()).send()
    };
    let alice: Value = post("alice-key", "components=3").await.unwrap().json().await.unwrap();
    let alice_id = alice["id"].as_str().unwrap();
    srv.wait_as(alice_id, "alice-key").await;
    let r = post("bob-key", "components=3").await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "Bob got Alice's job");
    let bob: Value = r.json().await.unwrap();
    let bob_id = bob["id"].as_str().unwrap();
    srv.wait_as(bob_id, "bob-key").await;
    let md: Value = srv.client.get(srv.url(&format!("/v1/jobs/{bob_id}/metadata"))).bearer_auth("bob-key").send().await.unwrap().json().await.unwrap();
    assert_eq!(md["statistics"], json!({"reused": true, "from_job": null, "source": "storage"}));
    srv.stop().await;
}

/// Identical pixels under two ENVI headers that differ only in `map info` and `wavelength` (a product
/// re-georeferenced, a tile cut from two mosaics) are two jobs: each job's metadata and ENVI header
/// carry its own request's map info and wavelengths, never the other's. The second still reuses the
/// first one's eigen system (the statistics do not depend on metadata), and each request repeated is
/// its own job again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_pixels_under_two_headers_keep_their_own_metadata() {
    use hypermnf::cube::{ByteOrder, Interleave};
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(args(&tmp.path().join("data"))).await;
    let bands = 8;
    let hdr = tmp.path().join("c.hdr");
    hypermnf::cube::envi::write_cube(&hdr, &synthetic_cube(30, 20, bands, 11), Interleave::Bil, ByteOrder::Little).unwrap();
    let geometry = std::fs::read_to_string(&hdr).unwrap();
    let data = std::fs::read(hdr.with_extension("img")).unwrap();
    let header = |easting: u32, first_nm: u32| {
        let wl: Vec<String> = (0..bands as u32).map(|b| format!("{}.5", first_nm + 10 * b)).collect();
        format!(
            "{}\nmap info = {{UTM, 1.000, 1.000, {easting}.000, 4000000.000, 1.0000000000e+00, 1.0000000000e+00, 11, North, WGS-84, units=Meters}}\n\
             wavelength units = Nanometers\nwavelength = {{{}}}\n",
            geometry.trim_end(),
            wl.join(", ")
        )
    };
    let post = |text: String| {
        let form = reqwest::multipart::Form::new()
            .part("header", reqwest::multipart::Part::text(text).file_name("c.hdr"))
            .part("data", reqwest::multipart::Part::bytes(data.clone()).file_name("c.img"));
        srv.client.post(srv.url("/v1/jobs?components=3")).multipart(form).send()
    };
    let mut ids = Vec::new();
    for (easting, nm) in [(111111, 400), (222222, 500)] {
        let r = post(header(easting, nm)).await.unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED, "easting {easting}: a job of its own, not the other header's");
        let j: Value = r.json().await.unwrap();
        assert_eq!(j["cached"], false, "{j}");
        let id = j["id"].as_str().unwrap().to_string();
        assert_eq!(srv.wait(&id).await["status"], "succeeded");
        ids.push(id);
    }
    for (id, (mine, theirs, nm)) in ids.iter().zip([("111111", "222222", 400.5), ("222222", "111111", 500.5)]) {
        let md = metadata_of(&srv, id).await;
        let map_info = md["source"]["map_info"].as_str().unwrap_or_default();
        assert!(map_info.contains(mine) && !map_info.contains(theirs), "{id}: metadata map info {map_info:?}");
        assert_eq!(md["source"]["wavelength"][0].as_f64(), Some(nm), "{id}: {}", md["source"]);
        let (s, zip) = srv.result(id, "?format=envi").await;
        assert_eq!(s, StatusCode::OK);
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip)).unwrap();
        let names: Vec<String> = z.file_names().filter(|n| n.ends_with(".hdr")).map(str::to_string).collect();
        assert!(!names.is_empty());
        for name in names {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut z.by_name(&name).unwrap(), &mut text).unwrap();
            assert!(text.contains(mine) && !text.contains(theirs), "{id} {name}:\n{text}");
        }
    }
    // The statistics level does not key on metadata: the second job reused the first one's system.
    assert_eq!(metadata_of(&srv, &ids[1]).await["statistics"], json!({"reused": true, "from_job": ids[0], "source": "storage"}));
    // The result level does: each request again is its own job.
    for (id, (easting, nm)) in ids.iter().zip([(111111, 400), (222222, 500)]) {
        let r = post(header(easting, nm)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let j: Value = r.json().await.unwrap();
        assert_eq!((j["id"].as_str(), j["cached"].as_bool()), (Some(id.as_str()), Some(true)), "{j}");
    }
    srv.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// Helpers

/// A cube whose statistics take most of a cold job's time on the CPU (half a second in the test
/// profile): many bands (covariances grow with their square), many pixels, few components.
const TIMED: (usize, usize, usize) = (480, 320, 192);

fn args(dir: &Path) -> hypermnf::config::ServeArgs {
    let mut a = hypermnf::config::ServeArgs::with_data_dir(dir);
    a.backend = hypermnf::mnf::BackendChoice::Cpu;
    a
}

impl TestServer {
    /// Posts a new job and waits until it has succeeded; its id.
    async fn run_npy(&self, body: &[u8], query: &str) -> String {
        let (s, j) = self.post_npy(body, query).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{query}: {j}");
        let id = j["id"].as_str().unwrap().to_string();
        let done = self.wait(&id).await;
        assert_eq!(done["status"], "succeeded", "{query}: {done}");
        id
    }
    async fn result(&self, id: &str, query: &str) -> (StatusCode, Vec<u8>) {
        self.get_bytes(&format!("/v1/jobs/{id}/result{query}")).await
    }
    /// The job's wall time from start to end, as the service recorded it (milliseconds).
    async fn job_ms(&self, id: &str) -> f64 {
        let j = self.get_json(&format!("/v1/jobs/{id}")).await.1;
        let t = |k: &str| {
            let s = j[k].as_str().unwrap_or_else(|| panic!("{k} missing: {j}"));
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
        };
        (t("finished_at") - t("started_at")).as_seconds_f64() * 1e3
    }
    /// One sample of `/metrics`: `name{level="level"}`.
    async fn metric(&self, name: &str, level: &str) -> f64 {
        let text = self.client.get(self.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let prefix = format!("{name}{{level=\"{level}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .parse()
            .unwrap()
    }
}

async fn metadata_of(srv: &TestServer, id: &str) -> Value {
    let (s, md) = srv.get_json(&format!("/v1/jobs/{id}/metadata")).await;
    assert_eq!(s, StatusCode::OK, "{md}");
    md
}

/// Metadata without what legitimately differs between a cached and a cold run.
fn comparable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("timings_ms");
        o.remove("statistics");
    }
    v
}

/// The contents of a zip's entries, in order (their names carry the job id).
fn unzip_values(bytes: &[u8]) -> Vec<Vec<u8>> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = Vec::new();
    for i in 0..z.len() {
        let mut f = z.by_index(i).unwrap();
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap();
        out.push(buf);
    }
    out
}
