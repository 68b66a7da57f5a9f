//! A multipart ENVI upload (`header`, `params`, `data` parts) made into a job, handled as a `.npy`
//! body is: the cube's content digest is computed while the data part is written, a cube stored BIP
//! or BIL is sent to the device while it arrives (`jobs::upload_to_device`), and the job starts on the scratch
//! files while the disk catches up (`jobs::early_start`).
//!
//! Before, the data part was received and synced, then mapped and digested whole: for a 6.1 GB
//! flight line that digest (the BIL lines gathered into BIP order for it) came after the last byte,
//! and the job after it. The content digest hashes the canonical BIP stream, whose leaves need whole
//! lines of the file: a BIP or BIL file gives them in the order they arrive, so the digest is
//! computed from the data part's bytes as they are received (`cube::digest::Arriving`, fed by the
//! upload writer beside the file), not read back from the file: reading the mapped file behind the
//! writer faulted every page in again. A BSQ file holds no whole line before its last band: its
//! digest follows the file (`Cube::content_digest_as_written`) and waits for all of it, and it is not
//! fed to the device.
//!
//! The feed needs the job's backend, so the parameters must be known when the data part starts: in
//! the query, or in a `params` part before `data` (as the Python client and the web page send them).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::Request;

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::intake::{decode_and_validate, enqueue_unsynced, input_summary, Unsynced};
use super::job_view::Created;
use super::multipart_body::MultipartBody;
use super::upload::{Claim, Progress};
use super::{params, ApiContext};
use crate::cube::Interleave;
use crate::jobs::upload_to_device::{self, Feed};
use crate::jobs::{CubeKey, InputKind};
use crate::mnf::MnfParams;

/// `POST /v1/jobs` with a multipart ENVI body, received into scratch under `token`.
pub(super) async fn create(ctx: &ApiContext, caller: &Caller, query: Option<&str>, req: Request, token: &str) -> ApiResult<Created> {
    let mut multipart =
        MultipartBody::from_request(req).map_err(|e| Error::bad_request("invalid_multipart", format!("invalid multipart body: {e}")))?;
    let dir = ctx.runner.storage.scratch_dir(token)?;
    // Parsed before the body is read: bad parameters are refused before the cube is.
    let query_params = match query.filter(|q| !q.is_empty()) {
        Some(q) => Some(params::from_query(Some(q))?),
        None => None,
    };
    let mut following: Option<Following> = None;
    let received = {
        let mut starts = |text: &str, claim: &Claim, path: &Path, progress: &Arc<Progress>, part: Option<&MnfParams>| {
            following = Some(Following::start(ctx, text, claim, path, progress.clone(), part.or(query_params.as_ref())));
        };
        super::multipart::receive_multipart(&mut multipart, &dir, ctx.config.max_upload_bytes, Some(&mut starts)).await
    };
    let super::multipart::MultipartUpload { header_text, data, sync, params: params_part } = received?;
    ctx.metrics.uploaded(data.bytes + header_text.len() as u64);
    let checked = async {
        let params = match (params_part, query_params) {
            (Some(_), Some(_)) => {
                return Err(Error::unprocessable("invalid_params", "give the parameters either as a params part or in the query, not both"))
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => params::from_query(None)?,
        };
        let (cube, params) = decode_and_validate(ctx, &caller.owner, InputKind::Envi, format!("scratch/{token}"), params).await?;
        let t = std::time::Instant::now();
        let content = match (data.content_digest, following.as_mut().and_then(|f| f.digest.take())) {
            (Some(c), _) => Some(c),
            (None, Some(task)) => task.await.map_err(Error::internal)?,
            (None, None) => None,
        };
        let content = match content {
            Some(c) => c,
            // The data part came before its header, or the digest could not follow the file.
            None => {
                let cube = cube.clone();
                tokio::task::spawn_blocking(move || cube.content_digest()).await.map_err(Error::internal)?
            }
        };
        tracing::debug!(secs = t.elapsed().as_secs_f64(), "content digest after the last byte");
        Ok((CubeKey { content, carried: cube.meta.carried_digest() }, input_summary(&cube), params))
    }
    .await;
    match checked {
        Ok((key, input, params)) => {
            let fed = match following.and_then(|mut f| f.feed.take()) {
                Some(f) => f.finish().await,
                None => None,
            };
            let files = [dir.join("cube.hdr"), data.path.clone()];
            let upload = Unsynced { token, kind: InputKind::Envi, files: &[&files[0], &files[1]], sync, fed };
            enqueue_unsynced(ctx, caller, key, input, params, None, upload).await
        }
        Err(e) => {
            let _ = sync.wait().await; // the scratch file is not removed under its sync
            Err(e)
        }
    }
}

/// What follows the data file while it is written: its content digest (for a BSQ cube, which the
/// upload cannot digest on the way), and the device feed.
/// Dropped, both stop at their next look at the file.
struct Following {
    digest: Option<tokio::task::JoinHandle<Option<[u8; 32]>>>,
    feed: Option<Feed>,
    stop: Arc<AtomicBool>,
}

impl Following {
    fn start(ctx: &ApiContext, text: &str, claim: &Claim, path: &Path, progress: Arc<Progress>, params: Option<&MnfParams>) -> Following {
        let stop = Arc::new(AtomicBool::new(false));
        let header: Arc<str> = Arc::from(text);
        let offset = claim.offset;
        // A cube the upload digests from its bytes on the way needs no reader of its file for that.
        let from_file = super::multipart::arriving_digest(text).is_none();
        let digest = from_file.then(|| {
            let (header, path, progress, stop) = (header.clone(), path.to_path_buf(), progress.clone(), stop.clone());
            tokio::task::spawn_blocking(move || {
                // The file has its claimed length once the first batch is written: it can be mapped.
                progress.wait_for(1)?;
                let cube = crate::cube::envi::map_parts(&header, &path).ok()?;
                cube.content_digest_as_written(|n| !stop.load(Ordering::Relaxed) && progress.wait_for(offset + n).is_some())
            })
        });
        let feed = params.and_then(|p| {
            let h = crate::cube::envi::parse_header(text).ok()?;
            if h.interleave == Interleave::Bsq || p.validate(h.lines, h.samples, h.bands).is_err() {
                return None;
            }
            let claimed = upload_to_device::Claimed {
                lines: h.lines,
                samples: h.samples,
                bands: h.bands,
                dtype: h.data_type,
                data_offset: offset,
                form: upload_to_device::Form::Envi { header },
            };
            Feed::start(&ctx.runner, p.backend, claimed, path.to_path_buf(), progress)
        });
        Following { digest, feed, stop }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
