//! `hypermnf bench flightline` on a tiny flight line (40 lines, CPU, one run): every JSON key is
//! there with a sensible value, and the file it wrote is gone afterwards.

use std::process::Command;

#[test]
fn bench_flightline_reports_every_key_and_removes_its_file() {
    let work = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let json_path = out.path().join("bench-flightline.json");
    let run = Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["bench", "flightline", "--lines", "40", "--backend", "cpu", "--runs", "1", "--json"])
        .arg(&json_path)
        .arg("--dir")
        .arg(work.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("| read floor") && stdout.contains("| peak anonymous RSS"),
        "no table on stdout:\n{stdout}"
    );

    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let num = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number in {j}"));
    for k in [
        "read_floor_ms",
        "cli_ms",
        "pipeline_ms",
        "upload_gbps",
        "after_upload_ms",
        "peak_anon_rss_mb",
        "cli_peak_anon_rss_mb",
        "cli_over_floor",
        "after_upload_over_pipeline",
    ] {
        let v = num(k);
        assert!(v.is_finite() && v > 0.0, "{k} = {v}");
    }
    assert!(j["pcie_floor_ms"].is_null(), "pcie_floor_ms on the CPU: {}", j["pcie_floor_ms"]);
    assert_eq!(j["lines"], 40);
    assert_eq!(j["samples"], 598);
    assert_eq!(j["bands"], 425);
    assert_eq!(j["interleave"], "bil");
    assert_eq!(j["dtype"], "f32");
    assert_eq!(j["backend"], "cpu");
    assert_eq!(j["runs"], 1);
    assert_eq!(j["file_bytes"], 40 * 598 * 425 * 4);
    assert!(j["device"].as_str().is_some_and(|d| !d.is_empty()), "device: {}", j["device"]);
    // The ratios are the ones the goals use.
    assert!((num("cli_over_floor") - num("cli_ms") / num("read_floor_ms")).abs() < 1e-9 * num("cli_over_floor"));
    assert!(
        (num("after_upload_over_pipeline") - num("after_upload_ms") / num("pipeline_ms")).abs() < 1e-9 * num("after_upload_over_pipeline")
    );

    // The default limit: 64 GiB, or where the disk has less room, its free space less the margin
    // (the free space may have moved a little since the server read it).
    let limit = j["max_upload_bytes"].as_u64().expect("max_upload_bytes");
    let cap = hypermnf::config::default_upload_limit(hypermnf::config::free_disk_bytes(work.path()));
    assert!(
        limit >= 64 << 30 || (limit as f64 - cap as f64).abs() <= 0.02 * cap as f64,
        "max_upload_bytes {limit}, free-space cap now {cap}"
    );

    let left: Vec<_> = std::fs::read_dir(work.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "the bench left {left:?}");
}
