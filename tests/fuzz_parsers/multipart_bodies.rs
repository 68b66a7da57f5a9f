//! Multipart uploads.

use super::*;

#[derive(Debug, Clone)]
enum PartBody {
    /// A valid header (rendered spec), its data part of the right size (`delta` 0) or not.
    Header(EnviSpec),
    Data(i64),
    Params(String),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Part {
    name: Option<String>,
    filename: bool,
    content_type: bool,
    body: PartBody,
}

#[derive(Debug, Clone)]
struct MultipartCase {
    parts: Vec<Part>,
    spec: EnviSpec,
    boundary: String,
    /// How the request's Content-Type names the boundary: right, quoted, missing or wrong.
    content_type: u8,
    /// Byte edits of the rendered body.
    edits: Vec<Edit>,
    lf_only: bool,
    limit: u64,
    seed: u64,
}

fn params_json() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{}".to_string()),
        Just("{\"components\": 1}".to_string()),
        Just("{\"components\": 0}".to_string()),
        Just("{\"components\": -1}".to_string()),
        Just("{\"components\": 1e9}".to_string()),
        Just("{\"snr\": \"NaN\"}".to_string()),
        Just("{\"noise_window\": [5, 5, 1, 1]}".to_string()),
        Just("{\"colour\": 1}".to_string()),
        Just("[1, 2]".to_string()),
        Just("{\"components\":".to_string()),
        Just("null".to_string()),
        "[{}\":,a-z0-9 ]{0,20}",
    ]
}

fn multipart_case() -> impl Strategy<Value = MultipartCase> {
    // None: the part's usual name; Some("<none>"): no name at all.
    let name = prop_oneof![8 => Just(None), 1 => prop::sample::select(vec!["header", "data", "params", "", "Header", "extra", "data\"; x=\"y", "<none>"]).prop_map(|s| Some(s.to_string()))];
    let part = (name, any::<bool>(), any::<bool>(), prop_oneof![4 => Just(0i64), 1 => -50i64..50], params_json(), prop::collection::vec(any::<u8>(), 0..64));
    // The usual parts, in the usual order, most of the time; anything else the rest.
    let parts = prop_oneof![
        3 => Just(vec![0u8, 1]),
        1 => Just(vec![0u8, 1, 2]),
        1 => Just(vec![1u8, 0]),
        1 => prop::collection::vec(0u8..4, 0..6),
    ];
    (
        envi_spec(),
        parts,
        prop::collection::vec(part, 6),
        prop_oneof![4 => Just("XyZzYboundary".to_string()), 1 => "[a-zA-Z0-9'()+_,./:=? -]{1,70}"],
        prop_oneof![6 => Just(0u8), 1 => 1u8..5],
        prop_oneof![4 => Just(vec![]), 1 => edits()],
        prop::bool::weighted(0.1),
        prop_oneof![4 => Just(1u64 << 20), 1 => 0u64..3000],
        any::<u64>(),
    )
        .prop_map(|(spec, kinds, part_pool, boundary, content_type, edits, lf_only, limit, seed)| {
            let parts = kinds
                .iter()
                .zip(part_pool)
                .map(|(&kind, (name, filename, ctype, delta, params, raw))| {
                    let (default_name, body) = match kind {
                        0 => ("header", PartBody::Header(spec.clone())),
                        1 => ("data", PartBody::Data(delta)),
                        2 => ("params", PartBody::Params(params)),
                        _ => ("raw", PartBody::Raw(raw)),
                    };
                    let name = name.unwrap_or_else(|| default_name.to_string());
                    Part { name: (name != "<none>").then_some(name), filename, content_type: ctype, body }
                })
                .collect();
            MultipartCase { parts, spec, boundary, content_type, edits, lf_only, limit, seed }
        })
}

impl MultipartCase {
    fn part_bytes(&self, p: &Part) -> Vec<u8> {
        match &p.body {
            PartBody::Header(s) => s.render().into_bytes(),
            PartBody::Data(delta) => {
                let exact = (self.spec.offset + self.spec.data_bytes()) as i64;
                filler(self.seed, (exact + delta).max(0) as usize)
            }
            PartBody::Params(t) => t.clone().into_bytes(),
            PartBody::Raw(b) => b.clone(),
        }
    }

    fn body(&self) -> Vec<u8> {
        let nl: &[u8] = if self.lf_only { b"\n" } else { b"\r\n" };
        let mut out = Vec::new();
        for p in &self.parts {
            out.extend_from_slice(b"--");
            out.extend_from_slice(self.boundary.as_bytes());
            out.extend_from_slice(nl);
            out.extend_from_slice(b"Content-Disposition: form-data");
            if let Some(n) = &p.name {
                out.extend_from_slice(format!("; name=\"{n}\"").as_bytes());
            }
            if p.filename {
                out.extend_from_slice(b"; filename=\"cube.img\"");
            }
            out.extend_from_slice(nl);
            if p.content_type {
                out.extend_from_slice(b"Content-Type: application/octet-stream");
                out.extend_from_slice(nl);
            }
            out.extend_from_slice(nl);
            out.extend_from_slice(&self.part_bytes(p));
            out.extend_from_slice(nl);
        }
        out.extend_from_slice(b"--");
        out.extend_from_slice(self.boundary.as_bytes());
        out.extend_from_slice(b"--");
        out.extend_from_slice(nl);
        apply_edits(&out, &self.edits)
    }

    fn content_type(&self) -> String {
        match self.content_type {
            0 => format!("multipart/form-data; boundary={}", self.boundary),
            1 => format!("multipart/form-data; boundary=\"{}\"", self.boundary),
            2 => "multipart/form-data".to_string(),
            3 => "multipart/form-data; boundary=other".to_string(),
            _ => format!("multipart/mixed; boundary={}", self.boundary),
        }
    }

    /// True when the request is a well-formed upload that must be accepted: header then data of the
    /// right size, optional valid params, within the limit, written cleanly.
    fn must_accept(&self) -> bool {
        let names: Vec<Option<&str>> = self.parts.iter().map(|p| p.name.as_deref()).collect();
        let shape_ok = names == [Some("header"), Some("data")] || names == [Some("header"), Some("data"), Some("params")];
        let bodies_ok = self.parts.iter().all(|p| match &p.body {
            PartBody::Header(_) => true,
            PartBody::Data(d) => *d == 0,
            PartBody::Params(t) => serde_json::from_str(t).ok().is_some_and(|v| params::from_json(v).is_ok()),
            PartBody::Raw(_) => false,
        });
        let kinds_ok = self.parts.iter().zip(["header", "data", "params"]).all(|(p, n)| {
            matches!((&p.body, n), (PartBody::Header(_), "header") | (PartBody::Data(_), "data") | (PartBody::Params(_), "params"))
        });
        let total: usize = self.parts.iter().map(|p| self.part_bytes(p).len()).sum();
        // The boundary must not occur in the parts (random data could hold it: then no promise).
        let body = self.body();
        let boundary_safe = self.parts.iter().all(|p| !contains(&self.part_bytes(p), self.boundary.as_bytes()));
        shape_ok
            && bodies_ok
            && kinds_ok
            && self.edits.is_empty()
            && self.content_type <= 1
            && !self.lf_only
            && total as u64 <= self.limit
            && boundary_safe
            && self.boundary.bytes().all(|c| c.is_ascii_alphanumeric())
            && !body.is_empty()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn fuzz_multipart() {
    let rt = runtime();
    let dir = scratch();
    fuzz("multipart", multipart_case(), |case| {
        let body = case.body();
        let content_type = case.content_type();
        let must_accept = case.must_accept();
        let _ = std::fs::remove_file(dir.path().join("cube.img"));
        let _ = std::fs::remove_file(dir.path().join("cube.hdr"));
        reset_peak();
        let got = rt.block_on(async {
            let req = axum::http::Request::builder()
                .method("POST")
                .uri("/v1/jobs")
                .header("content-type", &content_type)
                .body(axum::body::Body::from(body.clone()))
                .unwrap();
            let mut multipart = match MultipartBody::from_request(req) {
                Ok(m) => m,
                Err(e) => return Err(ApiError::bad_request("invalid_multipart", e.to_string())),
            };
            multipart::receive_multipart(&mut multipart, dir.path(), case.limit, None).await
        });
        check_peak(body.len(), "receive_multipart")?;
        let outcome = got.as_ref().map_or_else(ApiError::code, |_| "ok");
        match got {
            Ok(up) => {
                // Whatever was accepted is what was sent: the header parses, the data file holds the
                // data part's bytes.
                prop_assert!(envi::parse_header(&up.header_text).is_ok());
                prop_assert_eq!(std::fs::read_to_string(dir.path().join("cube.hdr")).unwrap(), up.header_text.clone());
                let data = std::fs::read(&up.data.path).unwrap();
                prop_assert_eq!(data.len() as u64, up.data.bytes);
                // Nothing asks for the data part's SHA-256 (its content digest is the decoded cube's).
                prop_assert_eq!(up.data.sha256, None);
                if must_accept {
                    let sent = case.part_bytes(&case.parts[1]);
                    prop_assert_eq!(data, sent);
                    prop_assert_eq!(up.header_text, case.spec.render());
                }
            }
            Err(e) => {
                check_refusal(&e)?;
                prop_assert!(!must_accept, "a well-formed upload was refused: {} {e}", e.code());
            }
        }
        Ok(outcome)
    });
}
