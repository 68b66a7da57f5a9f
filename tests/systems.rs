//! Reusing an eigen system (issue 32, "Reuse a system"), end to end on the CPU backend: a job's
//! system exported (`GET /v1/jobs/{id}/system`), a job of another cube projected with it
//! (`statistics_from`: a job id, then an imported system id), and the same file applied by
//! `hypermnf run --system` and by `MnfFit::from_system(..).transform`: the components are the same
//! bytes everywhere. Then what must be refused: cubes that do not match, unknown and other owners'
//! ids, damaged and hostile files, each with its code and nothing created.

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use hypermnf::cube::{ByteOrder, Cube, Interleave};
use hypermnf::library::cube_to_array;
use hypermnf::mnf::system_file::SystemFile;
use hypermnf::{Backend, Mnf, MnfFit};

mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

const ALICE: &str = "alice-key";
const BOB: &str = "bob-key";

impl TestServer {
    async fn post_npy_as(&self, key: &str, body: &[u8], query: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .post(self.url(&format!("/v1/jobs?{query}")))
            .bearer_auth(key)
            .header("content-type", "application/x-npy")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    }

    async fn post_json_as(&self, key: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let r = self.client.post(self.url(path)).bearer_auth(key).json(body).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    async fn get_as(&self, key: &str, path: &str) -> (StatusCode, Vec<u8>) {
        let r = self.client.get(self.url(path)).bearer_auth(key).send().await.unwrap();
        (r.status(), r.bytes().await.unwrap().to_vec())
    }

    async fn import_as(&self, key: &str, file: &[u8]) -> (StatusCode, Value) {
        let r = self
            .client
            .post(self.url("/v1/systems"))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(file.to_vec())
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    }

    /// A job that must succeed: its id.
    async fn job_as(&self, key: &str, body: &[u8], query: &str) -> String {
        let (status, job) = self.post_npy_as(key, body, query).await;
        assert!(status.is_success(), "{query}: {status} {job}");
        let id = job["id"].as_str().unwrap().to_string();
        let done = self.wait_as(&id, key).await;
        assert_eq!(done["status"], "succeeded", "{query}: {done}");
        id
    }

    /// How many jobs and imported systems `key`'s owner has.
    async fn counts(&self, key: &str) -> (usize, usize) {
        let jobs: Value = serde_json::from_slice(&self.get_as(key, "/v1/jobs?limit=1000").await.1).unwrap();
        let systems: Value = serde_json::from_slice(&self.get_as(key, "/v1/systems").await.1).unwrap();
        (jobs["jobs"].as_array().unwrap().len(), systems["systems"].as_array().unwrap().len())
    }
}

fn hypermnf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypermnf")).args(args).output().expect("hypermnf runs")
}

fn server_args(dir: &Path) -> hypermnf::config::ServeArgs {
    let keys = dir.join("keys.txt");
    std::fs::write(&keys, "alice:alice-key\nbob:bob-key\n").unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.join("data"));
    args.api_keys_file = Some(keys);
    args.input_roots = vec![dir.to_path_buf()];
    args
}

/// The `.npy` bytes `write_f32` writes for `values` of `shape` (the library's components as a file).
fn f32_npy(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    hypermnf::cube::npy::write_f32(&p, shape, values).unwrap();
    std::fs::read(p).unwrap()
}

fn error_code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_applied_by_the_service_the_cli_and_the_library_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start(server_args(dir.path())).await;

    // The system: a fit on cube A with two bad bands (u = 10 of 12 bands).
    let a = synthetic_cube(30, 24, 12, 1);
    let job_a = srv.job_as(ALICE, &npy_bytes(&a), "components=4&bad_bands=0,1").await;
    let (status, exported) = srv.get_as(ALICE, &format!("/v1/jobs/{job_a}/system")).await;
    assert_eq!(status, StatusCode::OK);
    let file = SystemFile::from_json(&exported).expect("the export reads back");
    assert_eq!((file.input.bands, file.used()), (12, 10));
    assert_eq!(file.source, hypermnf::mnf::system_file::Source::Job(job_a.clone()));
    let system_path = dir.path().join("a-system.json");
    std::fs::write(&system_path, &exported).unwrap();

    // The CLI on cube A computes the same system, bit for bit, and exports it as the service does.
    let a_path = dir.path().join("a.npy");
    std::fs::write(&a_path, npy_bytes(&a)).unwrap();
    let cli_system = dir.path().join("a-cli-system.json");
    let out = hypermnf(&[
        "run", a_path.to_str().unwrap(), "--out", dir.path().join("a-out.npy").to_str().unwrap(), "--components", "4",
        "--bad-bands", "0,1", "--backend", "cpu", "--export-system", cli_system.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_cli = SystemFile::load(&cli_system).unwrap();
    assert_eq!(from_cli.system, file.system);
    assert_eq!(from_cli.identity(), file.identity());

    // A campaign: another cube of the same sensor (other size, other scene), projected with A's system.
    let b = synthetic_cube(20, 28, 12, 2);
    let b_npy = npy_bytes(&b);
    let job_b = srv.job_as(ALICE, &b_npy, &format!("components=3&statistics_from={job_a}")).await;
    let (_, service_b) = srv.get_as(ALICE, &format!("/v1/jobs/{job_b}/result")).await;
    let meta: Value = serde_json::from_slice(&srv.get_as(ALICE, &format!("/v1/jobs/{job_b}/metadata")).await.1).unwrap();
    assert_eq!(meta["statistics"]["source"], "statistics_from", "{meta}");
    assert_eq!(meta["statistics"]["from"], job_a.as_str());
    assert_eq!(meta["statistics"]["system_sha256"], file.identity().as_str());
    assert_eq!(meta["bands_used"], json!((2..12).collect::<Vec<_>>()));
    assert_eq!(meta["params"]["statistics_from"], job_a.as_str());

    // `hypermnf run --system` with the exported file.
    let b_path = dir.path().join("b.npy");
    std::fs::write(&b_path, &b_npy).unwrap();
    let cli_b = dir.path().join("b-cli.npy");
    let out = hypermnf(&[
        "run", b_path.to_str().unwrap(), "--out", cli_b.to_str().unwrap(), "--components", "3", "--backend", "cpu",
        "--system", system_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&cli_b).unwrap() == service_b, "hypermnf run --system differs from the job with statistics_from");

    // The library: MnfFit::from_system(..).transform(cube B).
    let mnf = Mnf::new().components(3).backend(Backend::Cpu);
    let fit = MnfFit::from_system(&file, &mnf).unwrap();
    assert_eq!(fit.components().dim(), (0, 0, 3));
    let lib_b = fit.transform(cube_to_array::<i16>(&b).unwrap().view()).unwrap();
    assert!(f32_npy(&[20, 28, 3], lib_b.as_slice().unwrap()) == service_b, "MnfFit::from_system differs from the job");

    // Import the exported file: the export of the imported system has the same arrays, bit for bit.
    let (status, imported) = srv.import_as(ALICE, &exported).await;
    assert_eq!(status, StatusCode::CREATED, "{imported}");
    let sys = imported["id"].as_str().unwrap().to_string();
    assert_eq!((imported["bands"].as_i64(), imported["bands_used"].as_i64()), (Some(12), Some(10)));
    assert_eq!(imported["identity"], file.identity().as_str());
    let (status, again) = srv.get_as(ALICE, &format!("/v1/systems/{sys}")).await;
    assert_eq!(status, StatusCode::OK);
    let again = SystemFile::from_json(&again).unwrap();
    assert_eq!(again.system, file.system);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&again.system.transform), bits(&file.system.transform));
    assert_eq!(bits(&again.system.noise_covariance), bits(&file.system.noise_covariance));
    assert_eq!(again.source, hypermnf::mnf::system_file::Source::System(sys.clone()));

    // A job with the imported system's id: the same bytes again.
    let job_c = srv.job_as(ALICE, &b_npy, &format!("components=3&statistics_from={sys}")).await;
    assert_ne!(job_c, job_b);
    assert!(srv.get_as(ALICE, &format!("/v1/jobs/{job_c}/result")).await.1 == service_b);
    // And in a JSON body's params, by href.
    let body = json!({"input": {"href": format!("file://{}", b_path.display())}, "params": {"components": 3, "statistics_from": sys}});
    let (status, job_d) = srv.post_json_as(ALICE, "/v1/jobs", &body).await;
    assert!(status.is_success(), "{job_d}");
    let job_d = job_d["id"].as_str().unwrap().to_string();
    assert_eq!(srv.wait_as(&job_d, ALICE).await["status"], "succeeded");
    assert!(srv.get_as(ALICE, &format!("/v1/jobs/{job_d}/result")).await.1 == service_b);
    // A job's system is exportable whatever gave it: job B's is A's.
    let b_system = SystemFile::from_json(&srv.get_as(ALICE, &format!("/v1/jobs/{job_b}/system")).await.1).unwrap();
    assert_eq!(b_system.system, file.system);

    // The cache never mixes a job with a system and one without: the plain job of cube B is new and
    // computes B's own system.
    let (status, plain) = srv.post_npy_as(ALICE, &b_npy, "components=3").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{plain}");
    let plain = plain["id"].as_str().unwrap().to_string();
    assert_eq!(srv.wait_as(&plain, ALICE).await["status"], "succeeded");
    assert!(srv.get_as(ALICE, &format!("/v1/jobs/{plain}/result")).await.1 != service_b);
    // ... and the same request with the system again is the cached job B.
    let (status, cached) = srv.post_npy_as(ALICE, &b_npy, &format!("components=3&statistics_from={job_a}")).await;
    assert_eq!((status, cached["id"].as_str()), (StatusCode::OK, Some(job_b.as_str())), "{cached}");

    // Deleting the imported system: gone for GET and for statistics_from.
    let r = srv.client.delete(srv.url(&format!("/v1/systems/{sys}"))).bearer_auth(ALICE).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(srv.get_as(ALICE, &format!("/v1/systems/{sys}")).await.0, StatusCode::NOT_FOUND);
    let (status, e) = srv.post_npy_as(ALICE, &b_npy, &format!("components=2&statistics_from={sys}")).await;
    assert_eq!((status, error_code(&e)), (StatusCode::NOT_FOUND, "system_not_found"), "{e}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatches_unknown_ids_and_bad_files_are_refused_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start(server_args(dir.path())).await;
    let a = synthetic_cube(30, 24, 12, 3);
    let job_a = srv.job_as(ALICE, &npy_bytes(&a), "components=4&bad_bands=0,1").await;
    let exported = srv.get_as(ALICE, &format!("/v1/jobs/{job_a}/system")).await.1;
    let (_, imported) = srv.import_as(ALICE, &exported).await;
    let sys = imported["id"].as_str().unwrap().to_string();
    let before = srv.counts(ALICE).await;
    assert_eq!(before, (1, 1));

    let ten_bands = npy_bytes(&synthetic_cube(20, 20, 12 - 2, 4));
    let twelve = npy_bytes(&synthetic_cube(20, 20, 12, 5));
    let unknown = uuid::Uuid::now_v7().to_string();
    let cases: Vec<(&[u8], String, StatusCode, &str, &str)> = vec![
        (&ten_bands, format!("statistics_from={job_a}"), StatusCode::UNPROCESSABLE_ENTITY, "system_mismatch", "10 bands"),
        (&ten_bands, format!("statistics_from={sys}"), StatusCode::UNPROCESSABLE_ENTITY, "system_mismatch", "12 bands"),
        (&twelve, format!("components=11&statistics_from={job_a}"), StatusCode::UNPROCESSABLE_ENTITY, "system_mismatch", "components (11)"),
        (&twelve, format!("statistics_from={unknown}"), StatusCode::NOT_FOUND, "system_not_found", &unknown),
        (&twelve, "statistics_from=not-an-id".into(), StatusCode::NOT_FOUND, "system_not_found", "not-an-id"),
        (&twelve, "statistics_sha256=00".into(), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params", "statistics_sha256"),
    ];
    for (body, query, status, code, says) in &cases {
        let (got, e) = srv.post_npy_as(ALICE, body, query).await;
        assert_eq!((got, error_code(&e)), (*status, *code), "{query}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{query}: {e}");
    }
    // Another owner's job and system are unknown ids to bob, everywhere.
    for id in [&job_a, &sys] {
        let (got, e) = srv.post_npy_as(BOB, &twelve, &format!("statistics_from={id}")).await;
        assert_eq!((got, error_code(&e)), (StatusCode::NOT_FOUND, "system_not_found"), "{e}");
    }
    assert_eq!(srv.get_as(BOB, &format!("/v1/jobs/{job_a}/system")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(srv.get_as(BOB, &format!("/v1/systems/{sys}")).await.0, StatusCode::NOT_FOUND);
    let r = srv.client.delete(srv.url(&format!("/v1/systems/{sys}"))).bearer_auth(BOB).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(srv.counts(BOB).await, (0, 0));

    // Wavelengths: an ENVI cube whose header gives them, and one of the same bands at other wavelengths.
    let with_wavelengths = |seed: u64, shift: f64, name: &str| -> String {
        let mut cube: Cube = synthetic_cube(20, 20, 12, seed);
        cube.meta.wavelength = Some((0..12).map(|i| 400.0 + 10.0 * i as f64 + if i == 7 { shift } else { 0.0 }).collect());
        cube.meta.wavelength_units = Some("Nanometers".into());
        let hdr = dir.path().join(format!("{name}.hdr"));
        hypermnf::cube::envi::write_cube(&hdr, &cube, Interleave::Bil, ByteOrder::Little).unwrap();
        format!("file://{}", hdr.display())
    };
    let w_job = {
        let body = json!({"input": {"href": with_wavelengths(6, 0.0, "w1")}, "params": {"components": 3}});
        let (status, j) = srv.post_json_as(ALICE, "/v1/jobs", &body).await;
        assert!(status.is_success(), "{j}");
        let id = j["id"].as_str().unwrap().to_string();
        assert_eq!(srv.wait_as(&id, ALICE).await["status"], "succeeded");
        id
    };
    let w_file = SystemFile::from_json(&srv.get_as(ALICE, &format!("/v1/jobs/{w_job}/system")).await.1).unwrap();
    assert_eq!(w_file.input.wavelengths.as_ref().map(Vec::len), Some(12));
    let before = srv.counts(ALICE).await;
    let body = json!({"input": {"href": with_wavelengths(7, 2.5, "w2")}, "params": {"statistics_from": w_job}});
    let (status, e) = srv.post_json_as(ALICE, "/v1/jobs", &body).await;
    assert_eq!((status, error_code(&e)), (StatusCode::UNPROCESSABLE_ENTITY, "system_mismatch"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("wavelengths") && e["message"].as_str().unwrap().contains("band 7"), "{e}");
    // The same wavelengths: accepted (a .npy, which has none, is checked on its band count only).
    let body = json!({"input": {"href": with_wavelengths(8, 0.0, "w3")}, "params": {"statistics_from": w_job}});
    let (status, j) = srv.post_json_as(ALICE, "/v1/jobs", &body).await;
    assert!(status.is_success(), "{j}");
    assert_eq!(srv.wait_as(j["id"].as_str().unwrap(), ALICE).await["status"], "succeeded");
    assert_eq!(srv.counts(ALICE).await.0, before.0 + 1);

    // Damaged and hostile files: 422 invalid_system, nothing imported.
    let before = srv.counts(ALICE).await;
    let mut doc: Value = serde_json::from_slice(&exported).unwrap();
    doc["bands_used"] = json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 99]);
    let mut huge_array = serde_json::from_slice::<Value>(&exported).unwrap();
    huge_array["arrays"]["transform"]["npy"] = json!("A".repeat(4 << 20));
    let mut wrong_shape = serde_json::from_slice::<Value>(&exported).unwrap();
    let small = hypermnf::mnf::system_file::npy_f64(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    wrong_shape["arrays"]["transform"]["npy"] = json!(base64::engine::general_purpose::STANDARD.encode(small));
    let bodies: Vec<(Vec<u8>, &str)> = vec![
        (serde_json::to_vec(&doc).unwrap(), "band 99"),
        (serde_json::to_vec(&huge_array).unwrap(), "larger than"),
        (serde_json::to_vec(&wrong_shape).unwrap(), "shape [2, 2]"),
        (exported[..exported.len() / 2].to_vec(), "not JSON"),
        (b"{\"format\": \"something-else\"}".to_vec(), "not a hypermnf system file"),
    ];
    for (body, says) in bodies {
        let (status, e) = srv.import_as(ALICE, &body).await;
        assert_eq!((status, error_code(&e)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_system"), "{e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{says}: {e}");
    }
    assert_eq!(srv.counts(ALICE).await, before);
    srv.stop().await;
}

#[test]
fn the_cli_refuses_a_system_of_other_bands_and_a_damaged_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.npy");
    std::fs::write(&a, npy_bytes(&synthetic_cube(24, 24, 12, 9))).unwrap();
    let system = dir.path().join("s.json");
    let out = hypermnf(&[
        "run", a.to_str().unwrap(), "--out", dir.path().join("o.npy").to_str().unwrap(), "--backend", "cpu", "--components", "3",
        "--export-system", system.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let other = dir.path().join("b.npy");
    std::fs::write(&other, npy_bytes(&synthetic_cube(24, 24, 11, 9))).unwrap();
    let out = hypermnf(&["run", other.to_str().unwrap(), "--out", dir.path().join("p.npy").to_str().unwrap(), "--backend", "cpu", "--system", system.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("11 bands") && err.contains("12 bands"), "{err}");
    assert!(!dir.path().join("p.npy").exists());
    let damaged = dir.path().join("d.json");
    let text = std::fs::read(&system).unwrap();
    std::fs::write(&damaged, &text[..text.len() - 40]).unwrap();
    let out = hypermnf(&["run", a.to_str().unwrap(), "--out", dir.path().join("q.npy").to_str().unwrap(), "--backend", "cpu", "--system", damaged.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--system"), "{}", String::from_utf8_lossy(&out.stderr));
}
