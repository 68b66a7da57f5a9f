//! `POST /processes/mnf/execution`: an execute request becomes a job through the same code as
//! `POST /v1/jobs` (so the same checks, job cache and API keys), then is answered asynchronously
//! (`Prefer: respond-async`: 201, `Location: /jobs/{id}`, the statusInfo) or synchronously (the
//! request waits for the job, then answers with its results, as a document or raw).
//!
//! Synchronous execution is for small cubes: one whose samples take more than `SYNC_MAX_INPUT_BYTES`
//! is run asynchronously whatever the client prefers, and a job still running when `SYNC_WAIT_MAX`
//! (or the request timeout) is near is answered as if asynchronous too (201 and its statusInfo);
//! either way the client gets a job to poll rather than a timed-out request.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value};

use super::batch_jobs::BatchJob;
use super::jobs::{results_document, status_info};
use super::outputs::{failure, Output, OutputChoice, Transmission};
use super::problem::{OgcResult, Problem};
use super::process::NPY;
use super::{BaseUrl, PROCESS_ID};
use crate::api::auth::Caller;
use crate::api::batches::create_batch;
use crate::api::href::create_from_href;
use crate::api::job_view::Created;
use crate::api::npy_upload::create_from_npy_bytes;
use crate::api::{params, ApiContext};
use crate::jobs::{Job, JobStatus};

/// Largest execute request: base64 of a 192 MiB cube, and room for the rest. An inline cube is held
/// in memory while it is decoded; larger cubes go by reference or through `POST /v1/jobs`.
pub const EXECUTE_BODY_MAX: usize = 256 << 20;
/// Largest input (bytes of samples) run synchronously.
pub const SYNC_MAX_INPUT_BYTES: u64 = 64 << 20;
/// Longest a synchronous request waits for its job.
pub const SYNC_WAIT_MAX: Duration = Duration::from_secs(300);

/// The parameters, under their native names, that are process inputs.
const PARAM_INPUTS: [&str; 9] = ["components", "snr", "noise", "inverse", "bad_bands", "ignore_value", "noise_window", "backend", "ortho"];

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    #[serde(default)]
    inputs: Option<Map<String, Value>>,
    #[serde(default)]
    outputs: Option<Map<String, Value>>,
    #[serde(default)]
    response: Option<ResponseMode>,
    #[serde(default)]
    subscriber: Option<Value>,
}

/// `raw` (the standard's default): the outputs themselves; `document`: a results document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum ResponseMode {
    Raw,
    Document,
}

/// Where the cube comes from.
#[derive(Debug)]
enum CubeSource {
    /// A `file://` URL under an input root.
    Href(String),
    /// The bytes of a `.npy` file, given inline.
    Npy(bytes::Bytes),
    /// Several cubes, each by reference (`file://` URLs): a batch (`batch_jobs`), its statistics
    /// pooled or each cube's own.
    Batch { hrefs: Vec<String>, pooled: bool },
}

/// An execute request, checked.
#[derive(Debug)]
struct Execution {
    cube: CubeSource,
    params: crate::mnf::MnfParams,
    outputs: Vec<OutputChoice>,
    response: ResponseMode,
}

fn invalid(m: impl Into<String>) -> Problem {
    Problem::invalid_input(m)
}

/// A literal input: the value itself, or a qualified value `{"value": ...}`.
fn literal(name: &str, v: Value) -> OgcResult<Value> {
    match v {
        Value::Object(mut o) if o.contains_key("value") => {
            if let Some(extra) = o.keys().find(|k| !["value", "mediaType", "encoding", "schema", "format"].contains(&k.as_str())) {
                return Err(invalid(format!("input {name}: unexpected member {extra:?} beside value")));
            }
            Ok(o.remove("value").unwrap_or(Value::Null))
        }
        Value::Object(o) if o.contains_key("href") => Err(invalid(format!("input {name} cannot be given by reference; give its value"))),
        other => Ok(other),
    }
}

/// The media type of a qualified value: `mediaType`, or (as Processes 2.0 writes it) `format.mediaType`.
fn media_type(o: &Map<String, Value>) -> Option<&str> {
    o.get("mediaType").or_else(|| o.get("format").and_then(|f| f.get("mediaType"))).and_then(Value::as_str)
}

/// The `statistics` input: `pooled` (one eigen system from every cube's statistics) or `each`.
fn pooled_statistics(v: Value) -> OgcResult<bool> {
    match literal("statistics", v)? {
        Value::String(s) if s == "pooled" => Ok(true),
        Value::String(s) if s == "each" => Ok(false),
        other => Err(invalid(format!("input statistics must be \"pooled\" or \"each\", not {other}"))),
    }
}

/// The `cube` input: one cube, or an array of cubes by reference (a batch).
fn cubes_source(v: Value, pooled: Option<bool>) -> OgcResult<CubeSource> {
    let Value::Array(items) = v else {
        return cube_source(v);
    };
    if items.is_empty() || items.len() > crate::api::batches::MAX_INPUTS {
        return Err(invalid(format!("input cube: an array holds 1 to {} cubes, not {}", crate::api::batches::MAX_INPUTS, items.len())));
    }
    let mut hrefs = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match cube_source(item) {
            Ok(CubeSource::Href(h)) => hrefs.push(h),
            Ok(_) => return Err(invalid(format!("input cube {i}: the cubes of an array are given by reference, each {{\"href\": \"file:///...\"}}"))),
            Err(e) => return Err(invalid(format!("input cube {i}: {}", e.detail.trim_start_matches("input cube: ")))),
        }
    }
    Ok(CubeSource::Batch { hrefs, pooled: pooled.unwrap_or(false) })
}

fn cube_source(v: Value) -> OgcResult<CubeSource> {
    let forms = "give the cube as {\"href\": \"file:///...\"} (under an --input-root), {\"href\": \"s3://bucket/key\"} or \
                 {\"href\": \"https://host/path\"} (allowed by --input-bucket, --input-host) or inline as \
                 {\"value\": \"<base64 .npy>\", \"mediaType\": \"application/x-npy\", \"encoding\": \"base64\"}";
    let Value::Object(o) = v else {
        return Err(invalid(format!("input cube: {forms}")));
    };
    if let Some(href) = o.get("href") {
        let href = href.as_str().ok_or_else(|| invalid("input cube: href must be a string"))?;
        if href.starts_with('/') {
            // A plain absolute path: as a file:// URL, its own '%' and spaces escaped.
            const SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ').add(b'%').add(b'#').add(b'?');
            return Ok(CubeSource::Href(format!("file://{}", percent_encoding::utf8_percent_encode(href, SET))));
        }
        return Ok(CubeSource::Href(href.to_string()));
    }
    let Some(value) = o.get("value") else {
        return Err(invalid(format!("input cube: {forms}")));
    };
    match media_type(&o) {
        None | Some(NPY) => {}
        Some(other) => return Err(invalid(format!("input cube: inline values must be application/x-npy, not {other:?}"))),
    }
    let encoding = o.get("encoding").or_else(|| o.get("format").and_then(|f| f.get("encoding"))).and_then(Value::as_str);
    if !matches!(encoding, None | Some("base64")) {
        return Err(invalid("input cube: an inline value must be base64-encoded (encoding: base64)"));
    }
    let text = value.as_str().ok_or_else(|| invalid("input cube: the inline value must be a base64 string"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| invalid(format!("input cube: the inline value is not valid base64: {e}")))?;
    Ok(CubeSource::Npy(bytes.into()))
}

fn output_choice(id: &str, spec: &Value) -> OgcResult<OutputChoice> {
    let output = Output::parse(id).ok_or_else(|| invalid(format!("unknown output {id:?}: the outputs are components, denoised and metadata")))?;
    let spec = match spec {
        Value::Object(o) => o,
        Value::Null => &Map::new(),
        _ => return Err(invalid(format!("output {id}: expected an object such as {{\"transmissionMode\": \"reference\"}}"))),
    };
    let transmission = match spec.get("transmissionMode").and_then(Value::as_str) {
        None | Some("value") => Transmission::Value,
        Some("reference") => Transmission::Reference,
        Some(other) => return Err(invalid(format!("output {id}: transmissionMode must be value or reference, not {other:?}"))),
    };
    let media = media_type(spec);
    // A Cloud-Optimized GeoTIFF (`image/tiff`, with or without its profile parameters); by reference.
    let cog = matches!(output, Output::Components | Output::Denoised)
        && media.is_some_and(|m| m.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("image/tiff")));
    if cog && transmission == Transmission::Value {
        return Err(invalid(format!("output {id}: the GeoTIFF is given by reference only (transmissionMode: reference)")));
    }
    let envi_zip = match (output, media) {
        _ if cog => false,
        (_, None) => false,
        (Output::Metadata, Some("application/json")) => false,
        (Output::Components | Output::Denoised, Some(NPY)) => false,
        (Output::Components | Output::Denoised, Some("application/zip")) => true,
        (_, Some(other)) => return Err(invalid(format!("output {id}: unsupported media type {other:?}"))),
    };
    if envi_zip && transmission == Transmission::Value {
        return Err(invalid(format!("output {id}: the ENVI zip is given by reference only (transmissionMode: reference)")));
    }
    Ok(OutputChoice { output, transmission, envi_zip, cog })
}

fn parse_request(body: &[u8]) -> OgcResult<Execution> {
    let request: ExecuteRequest = serde_json::from_slice(body)
        .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, "invalid_json", format!("the execute request is not valid: {e}")))?;
    if request.subscriber.is_some() {
        return Err(invalid("callbacks (subscriber) are not supported: poll the job's status instead"));
    }
    let mut inputs = request.inputs.unwrap_or_default();
    // `statistics` only matters to an array of cubes: one cube's statistics are its own either way.
    let pooled = inputs.remove("statistics").map(pooled_statistics).transpose()?;
    let cube = cubes_source(inputs.remove("cube").ok_or_else(|| invalid("the input cube is required"))?, pooled)?;
    let mut params = Map::new();
    for (name, v) in inputs {
        if !PARAM_INPUTS.contains(&name.as_str()) {
            return Err(invalid(format!("unknown input {name:?}: the inputs are cube, statistics, {}", PARAM_INPUTS.join(", "))));
        }
        let v = literal(&name, v)?;
        params.insert(name, v);
    }
    let mut outputs = Vec::new();
    for (id, spec) in request.outputs.unwrap_or_default() {
        outputs.push(output_choice(&id, &spec)?);
    }
    // Asking for the denoised cube asks for the inverse transform.
    if outputs.iter().any(|o| o.output == Output::Denoised) {
        match params.get("inverse") {
            Some(Value::Bool(false)) => return Err(invalid("the denoised output needs inverse=true")),
            _ => {
                params.insert("inverse".into(), Value::Bool(true));
            }
        }
    }
    let params = params::from_json(Value::Object(params))?;
    // ortho=true makes the result a GeoTIFF on the granule's grid: every array output must be one.
    if params.ortho && (outputs.is_empty() || outputs.iter().any(|o| o.output != Output::Metadata && !o.cog)) {
        return Err(invalid(format!(
            "ortho=true gives the result as a Cloud-Optimized GeoTIFF: ask the components (and denoised) output as {} by reference",
            crate::api::formats::COG_MEDIA_TYPE
        )));
    }
    if outputs.is_empty() {
        // None named: all the job makes, by value.
        outputs = Output::ALL
            .into_iter()
            .filter(|o| *o != Output::Denoised || params.inverse)
            .map(|output| OutputChoice { output, transmission: Transmission::Value, envi_zip: false, cog: false })
            .collect();
    }
    Ok(Execution { cube, params, outputs, response: request.response.unwrap_or(ResponseMode::Raw) })
}

/// True when a `Prefer` header asks for `respond-async` (RFC 7240).
fn prefers_async(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|p| p.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async")))
    })
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok())
}

/// The largest execute request this server reads: EXECUTE_BODY_MAX, or less when `--max-upload-bytes`
/// is smaller (base64 of that many bytes, and 1 MiB for the rest), so that an inline cube the server
/// would refuse is not read into memory first.
fn body_limit(max_upload_bytes: u64) -> usize {
    let base64_len = max_upload_bytes.saturating_add(2) / 3 * 4;
    base64_len.saturating_add(1 << 20).min(EXECUTE_BODY_MAX as u64) as usize
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> OgcResult<bytes::Bytes> {
    let mime = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !mime.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json") {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("an execute request is application/json, not {mime:?}"),
        ));
    }
    let too_large = || {
        Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", format!("an execute request may hold at most {limit} bytes; send larger cubes by reference"))
    };
    if content_length(headers).is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, limit);
    match http_body_util::BodyExt::collect(limited).await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Problem::new(StatusCode::BAD_REQUEST, "incomplete_body", format!("the request body was interrupted: {e}"))),
    }
}

pub async fn execute(
    State(ctx): State<ApiContext>,
    base: BaseUrl,
    caller: Caller,
    Path(process_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> OgcResult<Response> {
    if process_id != PROCESS_ID {
        return Err(Problem::no_such_process(&process_id));
    }
    let bytes = read_body(&headers, body, body_limit(ctx.config.max_upload_bytes)).await?;
    let execution = parse_request(&bytes)?;
    drop(bytes);
    let created: Created = match execution.cube {
        CubeSource::Href(href) => create_from_href(&ctx, &caller, &href, execution.params).await?,
        CubeSource::Npy(npy) => create_from_npy_bytes(&ctx, &caller, npy, execution.params).await?,
        CubeSource::Batch { hrefs, pooled } => {
            // Several cubes are a batch, always run asynchronously: the client polls the batch's job.
            let (row, jobs) = create_batch(&ctx, &caller, &hrefs, pooled, execution.params).await?;
            return Ok(accepted_batch(BatchJob { row, jobs }, &base, prefers_async(&headers)));
        }
    };
    let job = created.job;
    let wants_async = prefers_async(&headers);
    if wants_async || input_bytes(&job) > SYNC_MAX_INPUT_BYTES {
        return Ok(accepted(&job, &base, wants_async));
    }
    let deadline = tokio::time::Instant::now() + SYNC_WAIT_MAX.min(ctx.config.request_timeout.saturating_sub(Duration::from_secs(5)));
    let Some(job) = wait_finished(&ctx, &job.id, deadline).await? else {
        // Still running at the deadline: the client polls it like an asynchronous job.
        return Ok(accepted(&job, &base, false));
    };
    match job.status {
        JobStatus::Succeeded => sync_results(&ctx, &base, &job, &execution.outputs, execution.response).await,
        JobStatus::Failed => Err(failure(&job)),
        _ => Err(Problem::new(StatusCode::GONE, "dismissed", "the job was dismissed before it finished")),
    }
}

/// Bytes of the job's input samples.
fn input_bytes(job: &Job) -> u64 {
    let size = match job.input.data_type.as_str() {
        "u8" => 1,
        "i16" | "u16" => 2,
        "i32" | "u32" | "f32" => 4,
        _ => 8,
    };
    (job.input.lines as u64).saturating_mul(job.input.samples as u64).saturating_mul(job.input.bands as u64).saturating_mul(size)
}

/// 201 with `Location` and the statusInfo: the job runs on, the client polls it.
fn accepted(job: &Job, base: &BaseUrl, preference_applied: bool) -> Response {
    let mut r = (StatusCode::CREATED, axum::Json(status_info(job, base, false))).into_response();
    if let Ok(v) = HeaderValue::from_str(&base.join(&format!("/jobs/{}", job.id))) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if preference_applied {
        r.headers_mut().insert("preference-applied", HeaderValue::from_static("respond-async"));
    }
    r
}

/// 201 with `Location` and the statusInfo of a batch's job.
fn accepted_batch(batch: BatchJob, base: &BaseUrl, preference_applied: bool) -> Response {
    let mut r = (StatusCode::CREATED, axum::Json(batch.status_info(base))).into_response();
    if let Ok(v) = HeaderValue::from_str(&base.join(&format!("/jobs/{}", batch.row.id))) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if preference_applied {
        r.headers_mut().insert("preference-applied", HeaderValue::from_static("respond-async"));
    }
    r
}

/// Polls the job until it is finished (Some) or the deadline passes (None).
async fn wait_finished(ctx: &ApiContext, id: &str, deadline: tokio::time::Instant) -> OgcResult<Option<Job>> {
    let mut pause = Duration::from_millis(20);
    loop {
        let job = ctx.runner.store.get(id).await.map_err(crate::api::error::Error::from)?.ok_or_else(|| {
            Problem::new(StatusCode::GONE, "dismissed", "the job was dismissed before it finished")
        })?;
        if job.status.is_finished() {
            return Ok(Some(job));
        }
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(None);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// The synchronous answer: a results document, or raw: one output's bytes, 204 with `Link` headers
/// when every output is by reference, or several outputs as multipart/related (RFC 2387), one part
/// each, `Content-ID` the output id, a reference as an empty part with `Content-Location`.
async fn sync_results(ctx: &ApiContext, base: &BaseUrl, job: &Job, outputs: &[OutputChoice], mode: ResponseMode) -> OgcResult<Response> {
    let monitor = format!("<{}>; rel=\"monitor\"", base.join(&format!("/jobs/{}", job.id)));
    let mut r = match mode {
        ResponseMode::Document => axum::Json(results_document(ctx, base, job, outputs).await?).into_response(),
        ResponseMode::Raw if outputs.iter().all(|o| o.transmission == Transmission::Reference) => {
            // Checked here too: a product the job lacks is refused, not linked.
            results_document(ctx, base, job, outputs).await?;
            let mut r = StatusCode::NO_CONTENT.into_response();
            for o in outputs {
                let l = format!("<{}>; rel=\"enclosure\"; title=\"{}\"; type=\"{}\"", o.href(base, job), o.output.id(), o.media_type());
                if let Ok(v) = HeaderValue::from_str(&l) {
                    r.headers_mut().append(header::LINK, v);
                }
            }
            r
        }
        ResponseMode::Raw if outputs.len() == 1 => {
            let o = outputs[0];
            let dl = ctx.runner.storage.get(o.key(job)?).await.map_err(crate::api::error::Error::from)?;
            let mut r = Response::new(Body::from_stream(dl.stream));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(o.media_type()));
            r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(dl.size));
            r
        }
        ResponseMode::Raw => {
            let boundary = format!("hypermnf-{}", uuid::Uuid::new_v4().simple());
            let mut body = Vec::new();
            for o in outputs {
                body.extend_from_slice(format!("--{boundary}\r\nContent-ID: <{}>\r\nContent-Type: {}\r\n", o.output.id(), o.media_type()).as_bytes());
                match o.transmission {
                    Transmission::Reference => {
                        o.key(job)?;
                        body.extend_from_slice(format!("Content-Location: {}\r\n\r\n\r\n", o.href(base, job)).as_bytes());
                    }
                    Transmission::Value => {
                        let bytes = ctx.runner.storage.get_bytes(o.key(job)?).await.map_err(crate::api::error::Error::from)?;
                        body.extend_from_slice(b"\r\n");
                        body.extend_from_slice(&bytes);
                        body.extend_from_slice(b"\r\n");
                    }
                }
            }
            body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
            let content_type = format!("multipart/related; boundary=\"{boundary}\"; type=\"{}\"", outputs[0].media_type());
            let mut r = body.into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(&content_type).map_err(Problem::internal)?);
            r
        }
    };
    if let Ok(v) = HeaderValue::from_str(&monitor) {
        r.headers_mut().append(header::LINK, v);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> OgcResult<Execution> {
        parse_request(v.to_string().as_bytes())
    }

    #[test]
    fn inputs_become_the_native_parameters() {
        let e = parse(serde_json::json!({
            "inputs": {"cube": {"href": "file:///data/a.hdr"}, "components": 5, "noise": {"value": "shift-difference"},
                       "bad_bands": [0, 3], "noise_window": {"value": [1, 2, 30, 40]}},
            "response": "document",
        }))
        .unwrap();
        assert!(matches!(e.cube, CubeSource::Href(ref h) if h == "file:///data/a.hdr"));
        assert_eq!(e.params.components, Some(5));
        assert_eq!(e.params.bad_bands, vec![0, 3]);
        assert_eq!(e.response, ResponseMode::Document);
        // No outputs named: components and metadata, by value (no denoised without the inverse).
        let ids: Vec<_> = e.outputs.iter().map(|o| o.output.id()).collect();
        assert_eq!(ids, ["components", "metadata"]);
        assert!(e.outputs.iter().all(|o| o.transmission == Transmission::Value));
    }

    #[test]
    fn the_denoised_output_asks_for_the_inverse() {
        let e = parse(serde_json::json!({"inputs": {"cube": {"href": "/data/a b%.npy"}},
            "outputs": {"denoised": {"transmissionMode": "reference", "format": {"mediaType": "application/zip"}}}}))
        .unwrap();
        assert!(e.params.inverse);
        assert!(e.outputs[0].envi_zip);
        assert!(matches!(e.cube, CubeSource::Href(ref h) if h == "file:///data/a%20b%25.npy"));
        // References go to `api::href` as they are (its policy answers for them).
        for href in ["s3://cubes/a.npy", "https://example.org/a.npy"] {
            let e = parse(serde_json::json!({"inputs": {"cube": {"href": href}}})).unwrap();
            assert!(matches!(e.cube, CubeSource::Href(ref h) if h == href));
        }
        assert_eq!(e.response, ResponseMode::Raw);
        let err = parse(serde_json::json!({"inputs": {"cube": {"href": "/a.npy"}, "inverse": false}, "outputs": {"denoised": {}}})).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn inline_cubes_are_base64_npy() {
        let e = parse(serde_json::json!({"inputs": {"cube": {"value": "k05VTVBZ", "mediaType": "application/x-npy", "encoding": "base64"}}})).unwrap();
        assert!(matches!(e.cube, CubeSource::Npy(ref b) if &b[..] == b"\x93NUMPY"));
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let cube = serde_json::json!({"href": "file:///a.npy"});
        for (body, code) in [
            (serde_json::json!({"inputs": {}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": "file:///a.npy"}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": {"value": "!!"}}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": {"value": "AAAA", "mediaType": "image/tiff"}}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube, "colour": 1}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube, "components": {"href": "x"}}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube}, "outputs": {"rgb": {}}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube}, "outputs": {"components": {"format": {"mediaType": "application/zip"}}}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube}, "subscriber": {"successUri": "http://x"}}), "invalid_input"),
            (serde_json::json!({"inputs": {"cube": cube}, "response": "zip"}), "invalid_json"),
            (serde_json::json!({"inputs": {"cube": cube, "components": -1}}), "invalid_params"),
            (serde_json::json!({"inputs": {"cube": cube, "components": 3, "snr": 1.0}}), "invalid_params"),
        ] {
            match parse(body.clone()) {
                Err(e) => assert_eq!(e.code, code, "{body}"),
                Ok(_) if code == "invalid_params" => {} // exclusive parameters are checked against the cube
                Ok(e) => panic!("{body} accepted: {e:?}"),
            }
        }
    }

    #[test]
    fn an_array_of_cubes_is_a_batch() {
        let e = parse(serde_json::json!({"inputs": {
            "cube": [{"href": "file:///data/a.hdr"}, {"href": "/data/b c.npy"}], "statistics": "pooled", "components": 3}}))
        .unwrap();
        match e.cube {
            CubeSource::Batch { hrefs, pooled } => {
                assert_eq!(hrefs, ["file:///data/a.hdr", "file:///data/b%20c.npy"]);
                assert!(pooled);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.params.components, Some(3));
        // Independent jobs unless pooled is asked for, also as a qualified value.
        let e = parse(serde_json::json!({"inputs": {"cube": [{"href": "file:///a.npy"}]}})).unwrap();
        assert!(matches!(e.cube, CubeSource::Batch { pooled: false, .. }));
        let e = parse(serde_json::json!({"inputs": {"cube": [{"href": "file:///a.npy"}], "statistics": {"value": "pooled"}}})).unwrap();
        assert!(matches!(e.cube, CubeSource::Batch { pooled: true, .. }));
        // One cube stays one job, whatever the statistics.
        let e = parse(serde_json::json!({"inputs": {"cube": {"href": "file:///a.npy"}, "statistics": "pooled"}})).unwrap();
        assert!(matches!(e.cube, CubeSource::Href(_)));
        for (body, says) in [
            (serde_json::json!({"inputs": {"cube": []}}), "1 to"),
            (
                serde_json::json!({"inputs": {"cube": [{"href": "file:///a.npy"}, {"value": "k05VTVBZ"}]}}),
                "input cube 1: the cubes of an array are given by reference",
            ),
            (serde_json::json!({"inputs": {"cube": ["file:///a.npy"]}}), "input cube 0: give the cube as"),
            (serde_json::json!({"inputs": {"cube": [{"href": "file:///a.npy"}], "statistics": "mean"}}), "statistics must be"),
            (serde_json::json!({"inputs": {"cube": [{"href": "file:///a.npy"}], "statistics": 1}}), "statistics must be"),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(err.code, "invalid_input", "{body}");
            assert!(err.detail.contains(says), "{body}: {}", err.detail);
        }
    }

    #[test]
    fn the_body_limit_follows_the_upload_limit() {
        assert_eq!(body_limit(3 << 20), (4 << 20) + (1 << 20));
        assert_eq!(body_limit(4 << 30), EXECUTE_BODY_MAX);
    }

    #[test]
    fn prefer_header() {
        let mut h = HeaderMap::new();
        assert!(!prefers_async(&h));
        h.insert("prefer", HeaderValue::from_static("return=minimal, respond-async; wait=10"));
        assert!(prefers_async(&h));
        h.insert("prefer", HeaderValue::from_static("respond-sync"));
        assert!(!prefers_async(&h));
    }
}
