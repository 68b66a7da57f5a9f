//! Malformed, hostile and slow requests: documented errors, refused bodies, input roots, timeouts.

use super::*;

/// Malformed and hostile requests get their documented status and code, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_hostile_requests_get_their_documented_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("inputs");
    std::fs::create_dir_all(&root).unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.input_roots = vec![root.clone()];
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    let small = synthetic_cube(16, 12, 8, 5);
    let good = npy_bytes(&small);

    let mut cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = Vec::new();
    let npy = |q: &str, body: Vec<u8>| srv.client.post(srv.url(&format!("/v1/jobs{q}"))).header("content-type", "application/x-npy").body(body);
    let mut short = good.clone();
    short.truncate(good.len() - 10);
    cases.push(("npy shorter than its header says", npy("", short), StatusCode::BAD_REQUEST, "size_mismatch"));
    let mut long = good.clone();
    long.extend_from_slice(&[1, 2, 3, 4]);
    cases.push(("npy longer than its header says", npy("", long), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("npy claiming absurd dimensions", npy("", npy_header("<f8", "(4294967296, 4294967296, 4096)")), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("npy claiming more than the limit", npy("", npy_header("<f4", "(1000, 1000, 100)")), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("npy of two dimensions", npy("", npy_header("<f4", "(10, 10)")), StatusCode::BAD_REQUEST, "invalid_npy"));
    cases.push(("not a npy at all", npy("", b"GIF89a this is not an array".to_vec()), StatusCode::BAD_REQUEST, "invalid_npy"));
    cases.push(("empty body", npy("", Vec::new()), StatusCode::BAD_REQUEST, "invalid_npy"));
    // "body over the limit" by Content-Length is checked below over a raw socket (refused on the headers
    // alone), and with the whole body streaming in by refused_uploads_are_answered_while_the_body_is_still_coming.
    // Chunked (no Content-Length) whose .npy header claims 2 MB: refused from the header, before the body.
    let mut chunked_body = npy_header("<u1", "(100, 100, 200)");
    chunked_body.extend(std::iter::repeat_n(1u8, 1000));
    let all_chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(chunked_body)];
    cases.push((
        "chunked upload whose header claims more than the limit (no Content-Length)",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(all_chunks))),
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
    ));
    cases.push(("components = 0", npy("?components=0", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components not a number", npy("?components=many", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components above the bands", npy("?components=9", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("unknown parameter", npy("?colour=red", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components and snr", npy("?components=2&snr=1", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("noise window outside the cube", npy("?noise_window=0,0,50,50", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("bad band out of range", npy("?bad_bands=3,8", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("unknown backend", npy("?backend=tpu", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("wrong content type", srv.client.post(srv.url("/v1/jobs")).header("content-type", "text/plain").body("hello"), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));
    cases.push(("no content type", srv.client.post(srv.url("/v1/jobs")).body("hello"), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));

    // multipart
    let hdr = |l: usize, s: usize, b: usize, dt: u8| format!("ENVI\nsamples = {s}\nlines = {l}\nbands = {b}\ndata type = {dt}\ninterleave = bsq\nbyte order = 0\n");
    let mp = |parts: Vec<(&str, Vec<u8>)>| {
        let mut f = reqwest::multipart::Form::new();
        for (n, b) in parts {
            f = f.part(n.to_string(), reqwest::multipart::Part::bytes(b));
        }
        srv.client.post(srv.url("/v1/jobs")).multipart(f)
    };
    let raw = small.raw().to_vec(); // i16 little-endian BIP, 16 x 12 x 8
    cases.push(("multipart without data", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes())]), StatusCode::BAD_REQUEST, "invalid_multipart"));
    cases.push(("multipart with an unknown part", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes()), ("data", raw.clone()), ("extra", vec![1])]), StatusCode::BAD_REQUEST, "invalid_multipart"));
    cases.push(("multipart data shorter than its header says", mp(vec![("header", hdr(16, 12, 9, 2).into_bytes()), ("data", raw.clone())]), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("multipart data longer than its header says", mp(vec![("header", hdr(16, 12, 7, 2).into_bytes()), ("data", raw.clone())]), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("multipart header claiming a huge cube", mp(vec![("header", hdr(100000, 100000, 400, 4).into_bytes()), ("data", raw.clone())]), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("multipart header with a complex data type", mp(vec![("header", hdr(16, 12, 8, 6).into_bytes()), ("data", raw.clone())]), StatusCode::UNPROCESSABLE_ENTITY, "unsupported"));
    cases.push(("multipart params not JSON", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes()), ("data", raw.clone()), ("params", b"{components: 2".to_vec())]), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    let mut truncated = b"--XYZ\r\nContent-Disposition: form-data; name=\"header\"\r\n\r\n".to_vec();
    truncated.extend_from_slice(hdr(16, 12, 8, 2).as_bytes());
    truncated.extend_from_slice(b"\r\n--XYZ\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\n");
    truncated.extend_from_slice(&raw[..1000]);
    cases.push((
        "truncated multipart",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data; boundary=XYZ").body(truncated),
        StatusCode::BAD_REQUEST,
        "incomplete_body",
    ));
    cases.push((
        "multipart without a boundary",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data").body("x"),
        StatusCode::BAD_REQUEST,
        "invalid_multipart",
    ));

    // href
    std::fs::write(outside.join("cube.npy"), &good).unwrap();
    std::os::unix::fs::symlink(outside.join("cube.npy"), root.join("escape.npy")).unwrap();
    std::fs::write(root.join("notes.txt"), "x").unwrap();
    std::fs::write(root.join("lonely.hdr"), "ENVI\nsamples = 4\nlines = 4\nbands = 4\ndata type = 2\ninterleave = bsq\nbyte order = 0\n").unwrap();
    let href = |h: String| srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": h}}));
    cases.push(("href outside the roots", href(format!("file://{}", outside.join("cube.npy").display())), StatusCode::FORBIDDEN, "forbidden_path"));
    cases.push(("href through a symlink out of the root", href(format!("file://{}", root.join("escape.npy").display())), StatusCode::FORBIDDEN, "forbidden_path"));
    cases.push(("href with ..", href(format!("file://{}/../outside/cube.npy", root.display())), StatusCode::BAD_REQUEST, "invalid_href"));
    cases.push(("href to a header without its data file", href(format!("file://{}", root.join("lonely.hdr").display())), StatusCode::BAD_REQUEST, "input_not_found"));
    cases.push(("href to a missing file", href(format!("file://{}", root.join("nope.npy").display())), StatusCode::BAD_REQUEST, "input_not_found"));
    cases.push(("href that is not file://", href("http://example.com/cube.npy".into()), StatusCode::BAD_REQUEST, "invalid_href"));
    cases.push(("href to a file that is no cube", href(format!("file://{}", root.join("notes.txt").display())), StatusCode::UNPROCESSABLE_ENTITY, "unsupported"));
    cases.push(("malformed JSON", srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/json").body("{\"input\": "), StatusCode::BAD_REQUEST, "invalid_json"));
    cases.push(("JSON with unknown members", srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": "file:///x"}, "priority": 1})), StatusCode::BAD_REQUEST, "invalid_json"));

    // ids, queries, routes
    for bad in ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%2e%2e%2fetc"] {
        cases.push(("unknown job", srv.client.get(srv.url(&format!("/v1/jobs/{bad}"))), StatusCode::NOT_FOUND, "not_found"));
        cases.push(("unknown job result", srv.client.get(srv.url(&format!("/v1/jobs/{bad}/result"))), StatusCode::NOT_FOUND, "not_found"));
        cases.push(("unknown job delete", srv.client.delete(srv.url(&format!("/v1/jobs/{bad}"))), StatusCode::NOT_FOUND, "not_found"));
    }
    cases.push(("bad status filter", srv.client.get(srv.url("/v1/jobs?status=done")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("limit 0", srv.client.get(srv.url("/v1/jobs?limit=0")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("bad result format", srv.client.get(srv.url("/v1/jobs/00000000-0000-0000-0000-000000000000/result?format=tiff")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("unknown route", srv.client.get(srv.url("/v2/things")), StatusCode::NOT_FOUND, "not_found"));
    cases.push(("wrong method", srv.client.put(srv.url("/v1/jobs")), StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));

    for (what, req, status, code) in cases {
        let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(error_of(r).await, (status, code.to_string()), "{what}");
    }

    // Body over the limit: the headers alone announce 1 MiB + 1, and the server must refuse on them,
    // without waiting for (or reading) a body.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = srv.url("/").trim_start_matches("http://").trim_end_matches('/').to_string();
        let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-npy\r\nContent-Length: {}\r\n\r\n",
            (1 << 20) + 1
        );
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            loop {
                let n = sock.read(&mut buf).await.unwrap_or(0);
                answer.extend_from_slice(&buf[..n]);
                if n == 0 || String::from_utf8_lossy(&answer).contains("too_large") {
                    break;
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&answer);
        assert!(read.is_ok(), "body over the limit: no answer to the headers alone (got {text:?})");
        assert!(text.starts_with("HTTP/1.1 413"), "body over the limit: {text}");
        assert!(text.contains("\"code\":\"too_large\""), "body over the limit: {text}");
    }

    // still serving: a good upload runs to the end, and nothing was left behind by the refused ones
    let (s, j) = srv.post_npy(&good, "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert_eq!(srv.wait(j["id"].as_str().unwrap()).await["status"], "succeeded");
    let scratch = dir.path().join("data/objects/scratch");
    let left = std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "scratch files left behind");
    let ready = srv.get_json("/readyz").await;
    assert_eq!(ready.0, StatusCode::OK);
    srv.stop().await;
}

/// A refused upload gets its JSON answer even while the client is still sending the body: the server
/// reads and discards the rest instead of closing on unread bytes (which resets the connection, and a
/// reset loses the answer). Each case 20 times, on fresh connections, with reqwest sending the whole
/// body as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_uploads_are_answered_while_the_body_is_still_coming() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    const MB2: usize = 2 << 20;
    // A .npy that claims (and holds) 2 MiB, twice the limit.
    let mut over = npy_header("<u1", "(1024, 1024, 2)");
    over.resize(over.len() + MB2, 7);
    // A .npy that claims 512 KiB (under the limit) but goes on for 2 MiB.
    let mut longer = npy_header("<u1", "(512, 512, 2)");
    longer.resize(longer.len() + MB2, 7);
    // Multipart whose data part comes first (so no header bounds it): only the byte budget stops it,
    // in the middle of the stream.
    let mut multipart = b"--XYZ\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\n".to_vec();
    multipart.resize(multipart.len() + MB2, 7);
    multipart.extend_from_slice(b"\r\n--XYZ--\r\n");
    // Streamed in 64 KiB frames: chunked transfer encoding, no Content-Length.
    let chunked = |body: &[u8]| {
        let frames: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
        reqwest::Body::wrap_stream(futures::stream::iter(frames))
    };
    for round in 0..20 {
        let cases = [
            (
                "Content-Length over the limit (refused on the headers)",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(over.clone()),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked .npy whose header claims more than the limit",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(chunked(&over)),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked multipart past the limit mid-stream",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data; boundary=XYZ").body(chunked(&multipart)),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked .npy longer than its header claims",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(chunked(&longer)),
                StatusCode::BAD_REQUEST,
                "size_mismatch",
            ),
        ];
        for (what, req, status, code) in cases {
            let r = req.send().await.unwrap_or_else(|e| panic!("round {round}, {what}: {e:?}"));
            assert_eq!(error_of(r).await, (status, code.to_string()), "round {round}, {what}");
        }
    }
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}

/// A client that never stops sending after its upload was refused is not drained for ever: the server
/// cuts it off past the lingering bounds in bytes (a fast sender) and in time (a slow one), and serves
/// other requests meanwhile. The fast sender still receives its 413 before the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_cut_off() {
    use hypermnf::api::lingering_close::{LINGER_MAX_BYTES, LINGER_MAX_TIME};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    let addr = srv.server.addr;
    // Claims a terabyte: refused on the headers, then the client just keeps sending.
    let head = format!("POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-npy\r\nContent-Length: {}\r\n\r\n", 1u64 << 40);

    // How long a sender goes on (sending `block` bytes, then pausing `pause`) before a write fails;
    // what it read meanwhile.
    let flood = |block: usize, pause: Duration| {
        let head = head.clone();
        tokio::spawn(async move {
            let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut rd, mut wr) = sock.into_split();
            let reader = tokio::spawn(async move {
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
                answer
            });
            wr.write_all(head.as_bytes()).await.unwrap();
            let data = vec![0u8; block];
            let (start, mut sent) = (Instant::now(), 0u64);
            let cut = loop {
                if start.elapsed() > Duration::from_secs(60) {
                    break false;
                }
                match wr.write_all(&data).await {
                    Ok(()) => sent += block as u64,
                    Err(_) => break true,
                }
                tokio::time::sleep(pause).await;
            };
            (cut, sent, start.elapsed(), String::from_utf8_lossy(&reader.await.unwrap()).into_owned())
        })
    };
    let fast = flood(1 << 20, Duration::ZERO);
    let slow = flood(1, Duration::from_millis(100));
    // served meanwhile
    for _ in 0..5 {
        assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (cut, sent, took, answer) = fast.await.unwrap();
    assert!(cut, "a fast endless body was never cut off ({sent} bytes in {took:?})");
    // what the kernel buffers on both sides comes on top of what the server read
    assert!(sent < LINGER_MAX_BYTES + (256 << 20), "cut off only after {sent} bytes");
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("\"code\":\"too_large\""), "{answer:?}");
    let (cut, sent, took, _) = slow.await.unwrap();
    assert!(cut, "a slow endless body was never cut off ({sent} bytes in {took:?})");
    assert!(took < LINGER_MAX_TIME + Duration::from_secs(10), "cut off only after {took:?}");
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}

/// Every file an href leads the server to open is held to the input roots once its symlinks are
/// resolved, not only the file named: an ENVI header's data file under whichever name the reader finds
/// it (upper case, no extension, `x.img.hdr` → `x.img`, ...), and the data file beside a header reached
/// through a symlink (the one beside the resolved header, which is the one read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn href_data_files_are_held_to_the_input_roots() {
    use hypermnf::cube::{ByteOrder, Interleave};
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("inputs");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.input_roots = vec![root.clone()];
    let srv = TestServer::start(args).await;
    let cube = synthetic_cube(12, 10, 6, 3);
    let envi = |hdr: &Path| hypermnf::cube::envi::write_cube(hdr, &cube, Interleave::Bsq, ByteOrder::Little).unwrap();
    envi(&outside.join("secret.hdr")); // secret.hdr + secret.img
    envi(&root.join("sub/good.hdr"));
    let header_text = std::fs::read(root.join("sub/good.hdr")).unwrap();
    let header = |p: &Path| std::fs::write(p, &header_text).unwrap();
    let secret = outside.join("secret.img");

    // a header inside the root whose data file, under each name the reader tries, leads outside
    for (hdr, data) in [("upper.hdr", "upper.IMG"), ("bare.hdr", "bare"), ("dat.hdr", "dat.dat"), ("x.img.hdr", "x.img"), ("lower.hdr", "lower.img")] {
        header(&root.join(hdr));
        symlink(&secret, root.join(data)).unwrap();
    }
    // a header symlinked (inside the root) from another directory, whose own data file leads outside
    header(&root.join("sub/evil.hdr"));
    symlink(&secret, root.join("sub/evil.img")).unwrap();
    symlink(root.join("sub/evil.hdr"), root.join("via-link.hdr")).unwrap();
    // a header symlinked out of the root
    symlink(outside.join("secret.hdr"), root.join("out.hdr")).unwrap();
    let refused = ["upper.hdr", "bare.hdr", "dat.hdr", "x.img.hdr", "lower.hdr", "via-link.hdr", "out.hdr"];

    // and one that is fine: a symlink to a good header in the root; the decoy beside the link (which
    // is not the file read) does not matter
    symlink(root.join("sub/good.hdr"), root.join("good-link.hdr")).unwrap();
    symlink(&secret, root.join("good-link.img")).unwrap();

    let post = |name: &str| {
        let body = json!({"input": {"href": format!("file://{}", root.join(name).display())}, "params": {"components": 2}});
        srv.client.post(srv.url("/v1/jobs")).json(&body).send()
    };
    for name in refused {
        let r = post(name).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{name}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "forbidden_path", "{name}: {v}");
        assert!(!v["message"].as_str().unwrap().contains(outside.to_str().unwrap()), "{name}: the message shows the target: {v}");
    }
    let r = post("good-link.hdr").await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let job: Value = r.json().await.unwrap();
    assert_eq!(srv.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
    srv.stop().await;
}

/// An upload slower than --request-timeout is answered 408 in the JSON error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.request_timeout = Duration::from_secs(1);
    let srv = TestServer::start(args).await;
    let npy = npy_bytes(&synthetic_cube(24, 20, 10, 10));
    let first = npy[..200].to_vec();
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
        .chain(futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, std::io::Error>(vec![0u8; 10])
        }));
    use futures::StreamExt;
    let r = srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy")
        .body(reqwest::Body::wrap_stream(body)).send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::REQUEST_TIMEOUT, "timeout".into()));
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}
