//! A small https server for the reference tests (tests/references.rs, tests/formats_gdal/): HEAD and
//! ranged GETs with ETags and If-Match, redirects, and objects that change after a given number of
//! GETs. It runs on 127.0.0.1 with a CA and certificate made by rcgen for the run: a server under test
//! allows it by IP literal (`--input-host 127.0.0.1:PORT`) and trusts the CA (`--input-ca-cert`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An object served, and how it changes.
#[derive(Clone)]
pub struct Served {
    pub bytes: Vec<u8>,
    pub etag: String,
    /// After this many GETs of the object, it becomes `then` (a new ETag).
    pub change_after_gets: Option<(usize, Vec<u8>)>,
    pub gets: usize,
}

/// What the server serves: objects by path, and redirects.
#[derive(Default)]
pub struct Site {
    pub files: HashMap<String, Served>,
    pub redirects: HashMap<String, String>,
}

/// The running server (its task ends with the test's runtime).
pub struct Https {
    pub addr: SocketAddr,
    /// The test CA's certificate (PEM), for `--input-ca-cert`.
    pub ca: PathBuf,
    pub site: Arc<Mutex<Site>>,
    _dir: tempfile::TempDir,
}

impl Https {
    pub async fn start() -> Https {
        use tokio_rustls::rustls;
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "hypermnf test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let site: Arc<Mutex<Site>> = Arc::default();
        let s = site.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, site) = (acceptor.clone(), s.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = serve_one(tls, &site).await;
                    }
                });
            }
        });
        Https { addr, ca: ca_path, site, _dir: dir }
    }

    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        let etag = format!("\"{}\"", hex_of(&bytes));
        self.site.lock().unwrap().files.insert(path.to_string(), Served { bytes, etag, change_after_gets: None, gets: 0 });
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }
}

fn hex_of(bytes: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// One request per connection (`Connection: close`).
async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, site: &Mutex<Site>) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 || head.len() > 64 << 10 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let (method, path) = (first.next().unwrap_or("").to_string(), first.next().unwrap_or("").to_string());
    let headers: HashMap<String, String> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let (status, extra, body) = answer(site, &method, &path, &headers);
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", if method == "HEAD" { extra_len(&extra) } else { body.len() });
    for (k, v) in &extra {
        if k != "x-length" {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    out.push_str("\r\n");
    s.write_all(out.as_bytes()).await?;
    if method != "HEAD" {
        s.write_all(&body).await?;
    }
    s.shutdown().await
}

fn extra_len(extra: &[(String, String)]) -> usize {
    extra.iter().find(|(k, _)| k == "x-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0)
}

type Answer = (&'static str, Vec<(String, String)>, Vec<u8>);

fn answer(site: &Mutex<Site>, method: &str, path: &str, headers: &HashMap<String, String>) -> Answer {
    let mut site = site.lock().unwrap();
    if let Some(to) = site.redirects.get(path) {
        return ("302 Found", vec![("Location".into(), to.clone())], Vec::new());
    }
    let Some(f) = site.files.get_mut(path) else { return ("404 Not Found", vec![], b"no such file".to_vec()) };
    if method == "HEAD" {
        return (
            "200 OK",
            vec![("ETag".into(), f.etag.clone()), ("Accept-Ranges".into(), "bytes".into()), ("x-length".into(), f.bytes.len().to_string())],
            vec![],
        );
    }
    f.gets += 1;
    if let Some((after, _)) = &f.change_after_gets {
        if f.gets > *after {
            let (_, then) = f.change_after_gets.take().unwrap();
            f.etag = format!("\"{}\"", hex_of(&then));
            f.bytes = then;
        }
    }
    if headers.get("if-match").is_some_and(|m| *m != f.etag) {
        return ("412 Precondition Failed", vec![], vec![]);
    }
    let len = f.bytes.len();
    let tags = vec![("ETag".to_string(), f.etag.clone())];
    match headers.get("range").and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) {
        Some((a, b)) => {
            let a: usize = a.parse().unwrap();
            let b: usize = b.parse::<usize>().unwrap().min(len - 1);
            let mut tags = tags;
            tags.push(("Content-Range".into(), format!("bytes {a}-{b}/{len}")));
            ("206 Partial Content", tags, f.bytes[a..=b].to_vec())
        }
        None => ("200 OK", tags, f.bytes.clone()),
    }
}
