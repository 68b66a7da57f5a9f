//! Resumable uploads: the tus 1.0 protocol (core, creation, termination and expiration) under
//! `/v1/uploads`, so that the existing tus clients work (tuspy, tus-js-client, Uppy), and a job made
//! from a completed upload (`POST /v1/jobs` with `{"upload": ID, ...}`, see [`create_job`]).
//!
//! - `OPTIONS /v1/uploads`: the version, the extensions and `Tus-Max-Size` (the effective
//!   `--max-upload-bytes`).
//! - `POST /v1/uploads` with `Upload-Length` (and optionally `Upload-Metadata`): 201, `Location`.
//! - `HEAD /v1/uploads/{id}`: `Upload-Offset`, how many bytes the server holds.
//! - `PATCH /v1/uploads/{id}` with `Upload-Offset` equal to that: appends the body. A request cut
//!   short keeps what arrived (written, synced); the next `HEAD` says how much that is.
//! - `DELETE /v1/uploads/{id}`: the upload and its space are gone.
//!
//! Every answer carries `Tus-Resumable: 1.0.0`; a request for another version is 412. An upload belongs
//! to the API key that created it (another key gets 404), like a job.
//!
//! On the disk: `DATA_DIR/tus/<id>/info.json` (owner, length, metadata) and `DATA_DIR/tus/<id>/data`,
//! written with positioned writes. The data file's length is the upload's offset, and its mtime the
//! time of the last PATCH, so an upload survives a restart of the server (unlike the scratch area,
//! which is emptied at start). An upload left alone for `--upload-expiry-secs` (24 h by default)
//! expires: `expire_loop` deletes it. Uploads live on the instance that received them: several
//! instances behind one address need the requests of an upload to reach the same instance.
//!
//! One request at a time works on an upload. A new request for an upload (a client resuming after a
//! connection it believes lost, which the server may still see open) stops the PATCH in progress, which
//! keeps what it has received, and waits for it to let go ([`acquire`]), as tusd does.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::job_view::Created;
use super::metrics::ApiMetrics;
use super::upload::SMALL_BODY_MAX;
use super::{params, ApiContext};
use crate::jobs::InputKind;

/// The protocol version served (the only one).
pub const TUS_VERSION: &str = "1.0.0";
/// The extensions implemented, as `Tus-Extension` lists them.
pub const TUS_EXTENSIONS: &str = "creation,termination,expiration";
/// The content type of a PATCH body.
const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";
/// How long a request waits for the one before it on the same upload to stop (423 after that).
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// Bytes written between two starts of writeback (as `api::upload` does), so that the sync at the
/// end of a PATCH has little left to write.
const WRITEBACK_EVERY: u64 = 8 << 20;
/// Body frames queued for the writer thread.
const WRITER_QUEUE: usize = 32;
/// The longest `Upload-Metadata` accepted.
const METADATA_MAX: usize = 16 << 10;

/// The `/uploads` routes, for the `/v1` router.
pub fn routes() -> Router<ApiContext> {
    Router::new()
        .route("/uploads", post(create).options(options))
        .route("/uploads/{id}", axum::routing::head(head).patch(patch).delete(terminate))
        .layer(axum::middleware::map_response(tus_headers))
}

/// `Tus-Resumable` on every answer, and the versions served on a 412.
async fn tus_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert("tus-resumable", HeaderValue::from_static(TUS_VERSION));
    if r.status() == StatusCode::PRECONDITION_FAILED {
        r.headers_mut().insert("tus-version", HeaderValue::from_static(TUS_VERSION));
    }
    r
}

fn answer(r: ApiResult<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

fn not_found() -> Error {
    Error::new(StatusCode::NOT_FOUND, "not_found", "no such upload")
}

/// Every request but OPTIONS must say `Tus-Resumable: 1.0.0`.
fn check_version(h: &HeaderMap) -> ApiResult<()> {
    match h.get("tus-resumable").map(|v| v.to_str().unwrap_or("").trim()) {
        Some(TUS_VERSION) => Ok(()),
        Some(other) => Err(Error::new(
            StatusCode::PRECONDITION_FAILED,
            "unsupported_version",
            format!("this server speaks tus {TUS_VERSION}, not {other:?} (Tus-Resumable)"),
        )),
        None => Err(Error::new(StatusCode::PRECONDITION_FAILED, "unsupported_version", format!("send Tus-Resumable: {TUS_VERSION}"))),
    }
}

fn header_u64(h: &HeaderMap, name: &str) -> ApiResult<Option<u64>> {
    let Some(v) = h.get(name) else { return Ok(None) };
    let s = v.to_str().unwrap_or("").trim();
    // Digits only: no sign, no spaces inside, no `0x`.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::bad_request("invalid_header", format!("{name} must be a non-negative integer, not {s:?}")));
    }
    s.parse().map(Some).map_err(|_| Error::bad_request("invalid_header", format!("{name} is too large: {s}")))
}

fn value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// An HTTP date (IMF-fixdate), as `Upload-Expires` is written.
fn http_date(t: SystemTime) -> String {
    let fmt = time::macros::format_description!("[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT");
    time::OffsetDateTime::from(t).format(&fmt).unwrap_or_default()
}

/// Checks `Upload-Metadata`: comma-separated `key base64value` pairs (the value may be absent), keys
/// unique, non-empty ASCII without spaces or commas.
fn check_metadata(s: &str) -> ApiResult<()> {
    let bad = |m: String| Error::bad_request("invalid_metadata", format!("Upload-Metadata: {m}"));
    if s.len() > METADATA_MAX {
        return Err(bad(format!("more than {METADATA_MAX} bytes")));
    }
    let mut keys = std::collections::HashSet::new();
    for pair in s.split(',') {
        let pair = pair.trim();
        let mut parts = pair.split(' ').filter(|p| !p.is_empty());
        let key = parts.next().ok_or_else(|| bad("an empty pair".into()))?;
        if !key.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(bad(format!("the key {key:?} is not printable ASCII")));
        }
        if let Some(v) = parts.next() {
            base64::engine::general_purpose::STANDARD.decode(v).map_err(|_| bad(format!("the value of {key:?} is not base64")))?;
        }
        if parts.next().is_some() {
            return Err(bad(format!("the pair {pair:?} has more than a key and a value")));
        }
        if !keys.insert(key) {
            return Err(bad(format!("the key {key:?} appears twice")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Uploads on the disk

/// What `info.json` holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Info {
    owner: String,
    length: u64,
    /// `Upload-Metadata` as the client sent it (checked), given back by HEAD.
    #[serde(default)]
    metadata: Option<String>,
    created_ms: i64,
}

/// An upload found on the disk.
struct Upload {
    dir: PathBuf,
    info: Info,
}

impl Upload {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// `DATA_DIR/tus`.
fn root(ctx: &ApiContext) -> PathBuf {
    ctx.config.data_dir.join("tus")
}

fn expiry(ctx: &ApiContext) -> Duration {
    Duration::from_secs(ctx.config.upload_expiry_secs)
}

/// Ids are 32 lowercase hex digits (a random UUID): anything else names no upload (and no path).
fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The data file's length (the offset) and mtime (the last PATCH), or None when it is gone.
fn state(data: &Path) -> ApiResult<Option<(u64, SystemTime)>> {
    match std::fs::metadata(data) {
        Ok(m) => Ok(Some((m.len(), m.modified().unwrap_or_else(|_| SystemTime::now())))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::disk(e)),
    }
}

/// The caller's upload `id`, or 404 (also for another owner's, and for one that has expired, which is
/// deleted on the way).
async fn load(ctx: &ApiContext, caller: &Caller, id: &str) -> ApiResult<Upload> {
    if !valid_id(id) {
        return Err(not_found());
    }
    let dir = root(ctx).join(id);
    let info: Info = match tokio::fs::read(dir.join("info.json")).await {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| Error::internal(anyhow::anyhow!("{}: {e}", dir.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(Error::disk(e)),
    };
    if info.owner != caller.owner {
        return Err(not_found());
    }
    let upload = Upload { dir, info };
    let Some((_, last)) = state(&upload.data())? else { return Err(not_found()) };
    if expired(last, expiry(ctx)) {
        if let Some(held) = try_acquire(&upload.dir) {
            remove(&upload.dir, held).await;
        }
        return Err(not_found());
    }
    Ok(upload)
}

fn expired(last: SystemTime, ttl: Duration) -> bool {
    SystemTime::now().duration_since(last).is_ok_and(|idle| idle >= ttl)
}

/// The offset and `Upload-Expires` of a locked upload (404 if it went meanwhile).
fn locked_state(ctx: &ApiContext, upload: &Upload) -> ApiResult<(u64, String)> {
    let (offset, last) = state(&upload.data())?.ok_or_else(not_found)?;
    Ok((offset, http_date(last + expiry(ctx))))
}

/// Deletes an upload's directory (its lock held) and forgets its lock.
async fn remove(dir: &Path, held: Held) {
    let d = dir.to_path_buf();
    match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(Err(e)) => tracing::warn!(dir = %dir.display(), "cannot delete an upload: {e}"),
        Err(e) => tracing::warn!(dir = %dir.display(), "cannot delete an upload: {e}"),
    }
    SLOTS.lock().unwrap_or_else(|p| p.into_inner()).remove(dir);
    drop(held);
}

// ---------------------------------------------------------------------------------------------------
// One request at a time per upload

/// The lock of one upload, and the means to stop the request holding it.
#[derive(Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    stop: Mutex<CancellationToken>,
}

/// Upload directory → its slot (keyed by directory, so that servers of different data dirs in one
/// process keep apart, and those of one data dir share).
static SLOTS: LazyLock<Mutex<HashMap<PathBuf, Arc<Slot>>>> = LazyLock::new(Default::default);

fn slot(dir: &Path) -> Arc<Slot> {
    SLOTS.lock().unwrap_or_else(|p| p.into_inner()).entry(dir.to_path_buf()).or_default().clone()
}

/// The lock of an upload, held; `stop` is cancelled when another request wants it.
struct Held {
    _guard: tokio::sync::OwnedMutexGuard<()>,
    stop: CancellationToken,
}

/// Takes the upload's lock: the request holding it (a PATCH) is asked to stop, and is waited for up
/// to [`LOCK_WAIT`] (423 after that).
async fn acquire(dir: &Path) -> ApiResult<Held> {
    let slot = slot(dir);
    slot.stop.lock().unwrap_or_else(|p| p.into_inner()).cancel();
    let guard = tokio::time::timeout(LOCK_WAIT, slot.lock.clone().lock_owned())
        .await
        .map_err(|_| Error::new(StatusCode::LOCKED, "locked", "another request is still working on this upload; try again"))?;
    let stop = CancellationToken::new();
    *slot.stop.lock().unwrap_or_else(|p| p.into_inner()) = stop.clone();
    Ok(Held { _guard: guard, stop })
}

/// The lock, only if nobody holds it (the expiry sweep: an upload in use is not idle).
fn try_acquire(dir: &Path) -> Option<Held> {
    let slot = slot(dir);
    let guard = slot.lock.clone().try_lock_owned().ok()?;
    let stop = CancellationToken::new();
    *slot.stop.lock().unwrap_or_else(|p| p.into_inner()) = stop.clone();
    Some(Held { _guard: guard, stop })
}

// ---------------------------------------------------------------------------------------------------
// The protocol

/// `OPTIONS /v1/uploads`: what this server speaks (no key needed, as for any discovery).
async fn options(State(ctx): State<ApiContext>) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert("tus-version", HeaderValue::from_static(TUS_VERSION));
    h.insert("tus-extension", HeaderValue::from_static(TUS_EXTENSIONS));
    h.insert("tus-max-size", HeaderValue::from(ctx.config.max_upload_bytes));
    r
}

/// `POST /v1/uploads`: a new, empty upload of `Upload-Length` bytes.
async fn create(State(ctx): State<ApiContext>, caller: Result<Caller, Error>, headers: HeaderMap, body: Body) -> Response {
    answer(create_inner(&ctx, caller, &headers, body).await)
}

async fn create_inner(ctx: &ApiContext, caller: Result<Caller, Error>, h: &HeaderMap, body: Body) -> ApiResult<Response> {
    check_version(h)?;
    let caller = caller?;
    if h.contains_key("upload-defer-length") {
        return Err(Error::bad_request("invalid_header", "Upload-Defer-Length is not supported: send Upload-Length"));
    }
    let length = header_u64(h, "upload-length")?.ok_or_else(|| Error::bad_request("invalid_header", "Upload-Length is required"))?;
    let limit = ctx.config.max_upload_bytes;
    if length > limit {
        return Err(Error::too_large(format!(
            "the upload ({length} bytes) exceeds the limit of {limit} bytes; {}",
            crate::config::UPLOAD_LIMIT_HINT
        )));
    }
    let metadata = match h.get("upload-metadata") {
        Some(v) => {
            let s = v.to_str().map_err(|_| Error::bad_request("invalid_metadata", "Upload-Metadata is not ASCII"))?.trim().to_string();
            if !s.is_empty() {
                check_metadata(&s)?;
            }
            Some(s).filter(|s| !s.is_empty())
        }
        None => None,
    };
    if !axum::body::HttpBody::is_end_stream(&body) {
        return Err(Error::bad_request("body_not_supported", "creation-with-upload is not supported: send the bytes with PATCH"));
    }
    let root = root(ctx);
    // An upload that could not fit is refused now, not after hours of sending.
    if let Some(free) = crate::config::free_disk_bytes(&root) {
        if free < length {
            return Err(Error::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                format!("the server's disk has {free} bytes free, less than the upload's {length}"),
            ));
        }
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = root.join(&id);
    let info = Info { owner: caller.owner, length, metadata, created_ms: crate::jobs::now_ms() };
    let d = dir.clone();
    tokio::task::spawn_blocking(move || write_new(&d, &info)).await.map_err(Error::internal)?.map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        Error::disk(e)
    })?;
    let mut r = StatusCode::CREATED.into_response();
    let h = r.headers_mut();
    h.insert(header::LOCATION, value(&format!("/v1/uploads/{id}")));
    h.insert("upload-offset", HeaderValue::from(0u64));
    h.insert("upload-expires", value(&http_date(SystemTime::now() + expiry(ctx))));
    Ok(r)
}

/// Writes a new upload's directory: `info.json` (through a rename, so that it is whole or absent) and
/// the empty data file, synced with their names.
fn write_new(dir: &Path, info: &Info) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("info.json.tmp");
    let f = std::fs::File::create(&tmp)?;
    f.write_all_at(&serde_json::to_vec(info).map_err(std::io::Error::other)?, 0)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("info.json"))?;
    std::fs::File::create(dir.join("data"))?.sync_all()?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

/// `HEAD /v1/uploads/{id}`: how many bytes the server holds.
async fn head(State(ctx): State<ApiContext>, caller: Result<Caller, Error>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    answer(head_inner(&ctx, caller, &id, &headers).await)
}

async fn head_inner(ctx: &ApiContext, caller: Result<Caller, Error>, id: &str, h: &HeaderMap) -> ApiResult<Response> {
    check_version(h)?;
    let upload = load(ctx, &caller?, id).await?;
    // A PATCH still running (its client gone, the server not yet aware) stops first: the offset
    // answered is then the one the next PATCH must give.
    let held = acquire(&upload.dir).await?;
    let (offset, expires) = locked_state(ctx, &upload)?;
    drop(held);
    let mut r = StatusCode::OK.into_response();
    let rh = r.headers_mut();
    rh.insert("upload-offset", HeaderValue::from(offset));
    rh.insert("upload-length", HeaderValue::from(upload.info.length));
    if let Some(m) = &upload.info.metadata {
        rh.insert("upload-metadata", value(m));
    }
    rh.insert("upload-expires", value(&expires));
    rh.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `DELETE /v1/uploads/{id}` (termination): the upload and its bytes are gone.
async fn terminate(State(ctx): State<ApiContext>, caller: Result<Caller, Error>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    answer(terminate_inner(&ctx, caller, &id, &headers).await)
}

async fn terminate_inner(ctx: &ApiContext, caller: Result<Caller, Error>, id: &str, h: &HeaderMap) -> ApiResult<Response> {
    check_version(h)?;
    let upload = load(ctx, &caller?, id).await?;
    let held = acquire(&upload.dir).await?;
    remove(&upload.dir, held).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// How a PATCH body ended.
enum Ending {
    /// All of it arrived.
    Whole,
    /// The connection broke (or the client stopped sending) part-way.
    Cut(String),
    /// Another request for the upload asked this one to stop.
    Superseded,
    /// More bytes than the upload has room for.
    TooLong,
    /// The writer failed (its error is reported).
    WriterGone,
}

/// `PATCH /v1/uploads/{id}`: appends the body at `Upload-Offset`.
async fn patch(State(ctx): State<ApiContext>, caller: Result<Caller, Error>, UrlPath(id): UrlPath<String>, req: axum::extract::Request) -> Response {
    answer(patch_inner(&ctx, caller, &id, req).await)
}

async fn patch_inner(ctx: &ApiContext, caller: Result<Caller, Error>, id: &str, req: axum::extract::Request) -> ApiResult<Response> {
    let h = req.headers();
    check_version(h)?;
    let caller = caller?;
    let mime = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime != OFFSET_OCTET_STREAM {
        return Err(Error::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("a PATCH body must be {OFFSET_OCTET_STREAM}, not {mime:?}"),
        ));
    }
    let claimed = header_u64(h, "upload-offset")?.ok_or_else(|| Error::bad_request("invalid_header", "Upload-Offset is required"))?;
    let announced = header_u64(h, "content-length")?;
    let upload = load(ctx, &caller, id).await?;
    let held = acquire(&upload.dir).await?;
    let (offset, _) = locked_state(ctx, &upload)?;
    if claimed != offset {
        return Err(Error::new(
            StatusCode::CONFLICT,
            "offset_mismatch",
            format!("Upload-Offset is {claimed} but the server holds {offset} bytes of this upload (HEAD says so)"),
        ));
    }
    let room = upload.info.length - offset;
    if announced.is_some_and(|n| n > room) {
        return Err(Error::too_large(format!(
            "the body ({} bytes) goes past the upload's length: {room} bytes are left of its {}",
            announced.unwrap_or(0),
            upload.info.length
        )));
    }
    let file = std::fs::OpenOptions::new().write(true).open(upload.data()).map_err(Error::disk)?;
    let reserved = match announced.filter(|&n| n > 0) {
        Some(n) => reserve(&file, offset, n).map_err(Error::disk)?,
        None => false,
    };
    let stop = held.stop.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(WRITER_QUEUE);
    // The writer holds the lock until what it received is written and synced: a request that
    // follows (the client resuming) sees the final offset, even when this one's future is dropped
    // (its connection closed, or the request timeout).
    let writer = tokio::task::spawn_blocking(move || write_at(file, offset, rx, reserved, held));
    let mut stream = req.into_body().into_data_stream();
    let mut received = 0u64;
    let ending = loop {
        // What has arrived is taken first: a request that wants the upload stops this one only once
        // it waits for bytes (a dropped connection's last bytes and its end are read, not lost).
        let next = tokio::select! {
            biased;
            next = stream.next() => next,
            _ = stop.cancelled() => break Ending::Superseded,
        };
        match next {
            None => break Ending::Whole,
            Some(Err(e)) => break Ending::Cut(e.to_string()),
            Some(Ok(chunk)) => {
                let take = (chunk.len() as u64).min(room - received) as usize;
                received += take as u64;
                if take > 0 && tx.send(chunk.slice(..take)).await.is_err() {
                    break Ending::WriterGone;
                }
                if take < chunk.len() {
                    break Ending::TooLong;
                }
            }
        }
    };
    drop(tx);
    drop(stream);
    let (end, failed) = writer.await.map_err(Error::internal)?;
    ApiMetrics::add(&ctx.metrics.bytes_in, end.saturating_sub(offset));
    if let Some(e) = failed {
        return Err(Error::disk(e));
    }
    let expires = http_date(SystemTime::now() + expiry(ctx));
    let offset_headers = |mut r: Response| {
        r.headers_mut().insert("upload-offset", HeaderValue::from(end));
        r.headers_mut().insert("upload-expires", value(&expires));
        r
    };
    match ending {
        Ending::Whole => Ok(offset_headers(StatusCode::NO_CONTENT.into_response())),
        Ending::Cut(e) => {
            tracing::info!(upload = id, kept = end, "a PATCH was cut short ({e}); what arrived is kept");
            Err(Error::bad_request("incomplete_body", format!("the body was cut short ({e}); the upload holds {end} bytes: resume from there")))
        }
        Ending::Superseded => Err(Error::new(StatusCode::CONFLICT, "superseded", format!("another request for this upload stopped this one at {end} bytes"))),
        Ending::TooLong => Ok(offset_headers(
            Error::too_large(format!("the body goes past the upload's length of {} bytes; the rest was not stored", upload.info.length)).into_response(),
        )),
        Ending::WriterGone => Err(Error::internal(anyhow::anyhow!("the upload writer stopped"))),
    }
}

/// Reserves disk for `len` bytes at `offset` (KEEP_SIZE: the length stays that of what is written):
/// true when reserved; a full disk is an error; a file system without `fallocate` writes as it comes.
fn reserve(f: &std::fs::File, offset: u64, len: u64) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate takes an open descriptor and integers; no memory is shared.
    if unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset as libc::off_t, len as libc::off_t) } == 0 {
        return Ok(true);
    }
    match std::io::Error::last_os_error() {
        e if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => Err(e),
        _ => Ok(false),
    }
}

/// The writer thread of a PATCH: positioned writes from `at` of the frames received, writeback
/// started every [`WRITEBACK_EVERY`], and at the end (whole, cut or failed) the data synced and the
/// mtime set (the last PATCH, which the expiry counts from). Returns the data file's length (the new
/// offset: a write that failed part-way keeps the bytes before it), and the error if one happened.
fn write_at(file: std::fs::File, start: u64, mut rx: tokio::sync::mpsc::Receiver<Bytes>, reserved: bool, held: Held) -> (u64, Option<std::io::Error>) {
    let _held = held;
    let (mut at, mut since, mut previous, mut failed) = (start, start, None, None);
    while let Some(b) = rx.blocking_recv() {
        if let Err(e) = file.write_all_at(&b, at) {
            failed = Some(e);
            break;
        }
        at += b.len() as u64;
        if at - since >= WRITEBACK_EVERY {
            crate::write_to_disk::start_writeback(&file, (since, at - since), previous);
            previous = Some((since, at - since));
            since = at;
        }
    }
    drop(rx);
    let end = file.metadata().map(|m| m.len()).unwrap_or(at);
    if reserved {
        // Frees what was reserved past the end for bytes that did not come.
        let _ = file.set_len(end);
    }
    if let Err(e) = file.sync_data() {
        failed.get_or_insert(e);
    }
    let _ = file.set_modified(SystemTime::now());
    (end, failed)
}

// ---------------------------------------------------------------------------------------------------
// Jobs from uploads

/// `POST /v1/jobs` with a JSON body naming a completed upload: `{"upload": ID, "params": {...}}` for a
/// `.npy`, and for an ENVI cube the data file's upload with its header, as another upload
/// (`"header_upload": ID`) or inline (`"header": "ENVI\n..."`).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UploadJob {
    upload: String,
    #[serde(default)]
    header_upload: Option<String>,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    params: Value,
}

/// The body as an [`UploadJob`] when it is a JSON object with an `upload` member (None otherwise: the
/// href form, or not JSON, which the href parser reports).
pub(crate) fn job_request(body: &[u8]) -> ApiResult<Option<UploadJob>> {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else { return Ok(None) };
    if !map.contains_key("upload") {
        return Ok(None);
    }
    serde_json::from_value(Value::Object(map)).map(Some).map_err(|e| {
        Error::bad_request(
            "invalid_json",
            format!("expected {{\"upload\": \"<upload id>\", \"header_upload\" or \"header\" for ENVI, \"params\": {{...}}}}: {e}"),
        )
    })
}

/// A job from the caller's completed upload(s), through the checks, digests and job creation of the
/// other upload forms (`intake::create_from_files`). The uploaded file becomes the job's input without
/// a copy, and the upload is gone once the job exists (an existing identical job, `cached`, too). A
/// refused request leaves the upload as it was: the client may ask again with other parameters.
pub(crate) async fn create_job(ctx: &ApiContext, caller: &Caller, req: UploadJob) -> ApiResult<Created> {
    let params = params::from_json(req.params)?;
    if req.header_upload.is_some() && req.header.is_some() {
        return Err(Error::bad_request("invalid_json", "give the ENVI header either as header_upload or inline as header, not both"));
    }
    if req.header_upload.as_deref() == Some(req.upload.as_str()) {
        return Err(Error::bad_request("invalid_json", "header_upload must be another upload than the data's"));
    }
    let data = load(ctx, caller, &req.upload).await?;
    let data_held = acquire(&data.dir).await?;
    complete(ctx, &data)?;
    let mut header_upload = None;
    let header_file = match (&req.header_upload, &req.header) {
        (Some(id), _) => {
            let hdr = load(ctx, caller, id).await?;
            let held = acquire(&hdr.dir).await?;
            complete(ctx, &hdr)?;
            if hdr.info.length > SMALL_BODY_MAX as u64 {
                return Err(Error::bad_request("invalid_header", "the ENVI header is larger than 1 MiB"));
            }
            let path = hdr.data();
            header_upload = Some((hdr, held));
            Some(path)
        }
        (None, Some(text)) => {
            let path = data.dir.join("header.hdr");
            let (p, t) = (path.clone(), text.clone().into_bytes());
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let f = std::fs::File::create(&p)?;
                f.write_all_at(&t, 0)?;
                f.sync_all()
            })
            .await
            .map_err(Error::internal)?
            .map_err(Error::disk)?;
            Some(path)
        }
        (None, None) => None,
    };
    let data_path = data.data();
    let (kind, files): (InputKind, Vec<&Path>) = match &header_file {
        Some(hdr) => (InputKind::Envi, vec![hdr.as_path(), data_path.as_path()]),
        None => (InputKind::Npy, vec![data_path.as_path()]),
    };
    let created = super::intake::create_from_files(ctx, caller, kind, &files, params).await;
    if created.is_err() && req.header.is_some() {
        let _ = std::fs::remove_file(data.dir.join("header.hdr"));
    }
    let created = created?;
    remove(&data.dir, data_held).await;
    if let Some((hdr, held)) = header_upload {
        remove(&hdr.dir, held).await;
    }
    Ok(created)
}

/// 409 unless every byte of the (locked) upload has arrived.
fn complete(ctx: &ApiContext, upload: &Upload) -> ApiResult<()> {
    let (offset, _) = locked_state(ctx, upload)?;
    if offset != upload.info.length {
        return Err(Error::new(
            StatusCode::CONFLICT,
            "upload_incomplete",
            format!("the upload holds {offset} of its {} bytes: send the rest first", upload.info.length),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Expiry

/// Deletes the uploads idle for `--upload-expiry-secs`, from the start and then every quarter of that
/// (between 1 s and a minute).
pub async fn expire_loop(ctx: ApiContext) {
    let period = (expiry(&ctx) / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        match expire_once(&ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::info!("{n} abandoned upload(s) expired and deleted"),
            Err(e) => tracing::warn!("the expiry of abandoned uploads failed: {e:#}"),
        }
        tokio::time::sleep(period).await;
    }
}

/// One sweep: deletes every upload whose last PATCH (or creation) is older than the expiry and that
/// no request holds, and directories left half-made as old; returns how many.
pub async fn expire_once(ctx: &ApiContext) -> anyhow::Result<usize> {
    let (root, ttl) = (root(ctx), expiry(ctx));
    let mut entries = match tokio::fs::read_dir(&root).await {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(anyhow::anyhow!("cannot list {}: {e}", root.display())),
    };
    let mut n = 0;
    while let Some(entry) = entries.next_entry().await? {
        let dir = entry.path();
        let name = entry.file_name();
        if !name.to_str().is_some_and(valid_id) {
            continue;
        }
        // The data file's mtime; the directory's for one whose data file was never made.
        let last = match tokio::fs::metadata(dir.join("data")).await {
            Ok(m) => m.modified()?,
            Err(_) => entry.metadata().await?.modified()?,
        };
        if !expired(last, ttl) {
            continue;
        }
        if let Some(held) = try_acquire(&dir) {
            // Looked at again under the lock: a PATCH may have ended just before.
            let still = match tokio::fs::metadata(dir.join("data")).await {
                Ok(m) => expired(m.modified()?, ttl),
                Err(_) => true,
            };
            if still {
                remove(&dir, held).await;
                n += 1;
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_pairs() {
        assert!(check_metadata("filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential").is_ok());
        assert!(check_metadata("filename Y3ViZS5ucHk=, filetype YXBwbGljYXRpb24veC1ucHk=").is_ok());
        assert!(check_metadata("a !!!").is_err());
        assert!(check_metadata("a YQ==,a YQ==").is_err());
        assert!(check_metadata("a YQ== YQ==").is_err());
        assert!(check_metadata(",").is_err());
    }

    #[test]
    fn dates_and_ids() {
        assert_eq!(http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(784111777)), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(valid_id(&uuid::Uuid::new_v4().simple().to_string()));
        assert!(!valid_id("../../etc/passwd"));
        assert!(!valid_id(&uuid::Uuid::new_v4().to_string()));
    }
}
