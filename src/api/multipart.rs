//! Receiving a multipart ENVI upload (`POST /v1/jobs` with `multipart/form-data`): its `header`,
//! `data` and optional `params` parts, read by `multipart_body` (the data part's bytes as slices of
//! the request's frames) and the data part streamed to scratch by the upload writer (`upload`). What
//! becomes of it is `envi_upload`'s.

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::error::Error;
use super::multipart_body::{MultipartBody, PartBody};
use super::params;
use super::upload::{envi_claim, receive_unsynced, Alongside, Budget, Claim, Progress, Received, Unsynced, SMALL_BODY_MAX};
use crate::cube::digest::Arriving;
use crate::mnf::MnfParams;

/// The parts of a multipart ENVI upload, received: the header text (also written to `cube.hdr`), the
/// data part (streamed to `cube.img`, its final sync still running; its `content_digest` computed on
/// the way when its header came first and the cube is stored BIP or BIL) and the parameters, when a
/// `params` part was given.
pub struct MultipartUpload {
    pub header_text: String,
    pub data: Received,
    /// The data file's final sync: the upload is durable once it is waited for.
    pub sync: Unsynced,
    pub params: Option<MnfParams>,
}

/// Told when the data part of a multipart ENVI upload starts after its header part: the header text,
/// what it claims, the data file being written, how far it is written (the file has the claimed
/// length from the first batch on, so it can be mapped), and the `params` part, if one came first.
pub type DataStarts<'a> = dyn FnMut(&str, &Claim, &std::path::Path, &Arc<Progress>, Option<&MnfParams>) + Send + 'a;

/// Receives a multipart ENVI upload into `dir`: a `header` part, a `data` part and an optional `params`
/// part (JSON), each once, nothing else; within `limit` bytes in all. The header is parsed and its
/// claim checked against the limit as soon as it arrives, so that a data part after it is bounded by
/// the claim while it streams in, and `data_starts` may follow it as it is written (the content
/// digest, the device feed). Answers once every byte is in its file, before the data's final sync.
pub async fn receive_multipart<S, E>(
    multipart: &mut MultipartBody<S>,
    dir: &std::path::Path,
    limit: u64,
    mut data_starts: Option<&mut DataStarts<'_>>,
) -> Result<MultipartUpload, Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut budget = Budget::new(limit);
    let mut header: Option<(String, Option<Claim>)> = None;
    let mut data: Option<(Received, Unsynced)> = None;
    let mut params_part: Option<MnfParams> = None;
    let bad = |m: String| Error::bad_request("invalid_multipart", m);
    let parts = async {
        loop {
            let name = match multipart.next_part().await {
                Ok(Some(part)) => part.name.unwrap_or_default(),
                Ok(None) => return Ok(()),
                Err(e) => return Err(bad(format!("invalid multipart body: {e}"))),
            };
            match name.as_str() {
                "header" if header.is_none() => {
                    let bytes = small_part(multipart.body(), &mut budget).await?;
                    // Read as the ENVI reader reads header files: lossily, so that a description in
                    // Latin-1 does not make a header the command line reads unacceptable here.
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    let claim = envi_claim(&text, limit)?;
                    std::fs::write(dir.join("cube.hdr"), &text).map_err(Error::disk)?;
                    header = Some((text, claim));
                }
                "data" if data.is_none() => {
                    // The header normally comes first; then its claim bounds the data part as it
                    // arrives, and the data file can be followed while it is written.
                    let path = dir.join("cube.img");
                    let claim = header.as_ref().and_then(|h| h.1);
                    let progress = match (&header, claim) {
                        (Some((text, _)), Some(c)) => {
                            let progress = Arc::new(Progress::default());
                            progress.map_while_written();
                            if let Some(starts) = data_starts.as_deref_mut() {
                                starts(text, &c, &path, &progress, params_part.as_ref());
                            }
                            Some(progress)
                        }
                        _ => None,
                    };
                    // The content digest is computed from the data part's bytes as they arrive, when
                    // the header that says how to read them came first (and the cube is not BSQ).
                    let content = claim.and(header.as_ref()).and_then(|(text, _)| arriving_digest(text));
                    let alongside = Alongside { body_sha256: false, progress, content };
                    data = Some(receive_unsynced(multipart.body(), path, &mut budget, None, claim, alongside).await?);
                }
                "params" if params_part.is_none() => {
                    let bytes = small_part(multipart.body(), &mut budget).await?;
                    let v: serde_json::Value = serde_json::from_slice(&bytes)
                        .map_err(|e| Error::unprocessable("invalid_params", format!("params is not JSON: {e}")))?;
                    params_part = Some(params::from_json(v)?);
                }
                "header" | "data" | "params" => return Err(bad(format!("part {name:?} appears twice"))),
                other => return Err(bad(format!("unknown part {other:?}: expected header, data and optional params"))),
            }
        }
    }
    .await;
    if let Err(e) = parts {
        if let Some((_, sync)) = data {
            let _ = sync.wait().await; // the scratch file is not removed under its sync
        }
        return Err(e);
    }
    match (header, data) {
        (Some((header_text, _)), Some((data, sync))) => Ok(MultipartUpload { header_text, data, sync, params: params_part }),
        (_, data) => {
            if let Some((_, sync)) = data {
                let _ = sync.wait().await;
            }
            Err(bad("a multipart upload needs a `header` part (ENVI .hdr text) and a `data` part".into()))
        }
    }
}

/// The content digest of the cube an ENVI header describes, to be computed from its data file's
/// bytes as they arrive: None for a BSQ cube (or a header the reader refuses), whose digest is
/// computed from its file.
pub fn arriving_digest(header_text: &str) -> Option<Arriving> {
    let h = crate::cube::envi::parse_header(header_text).ok()?;
    Arriving::new(h.lines, h.samples, h.bands, h.data_type, h.byte_order, h.interleave, &h.meta)
}

/// Reads a small multipart part (header or params) into memory, within SMALL_BODY_MAX.
async fn small_part<S, E>(mut part: PartBody<'_, S>, budget: &mut Budget) -> Result<Vec<u8>, Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut out = Vec::new();
    while let Some(c) = part.next().await {
        let c = c.map_err(|e| Error::bad_request("invalid_multipart", format!("invalid multipart body: {e}")))?;
        budget.take(c.len())?;
        if out.len() + c.len() > SMALL_BODY_MAX {
            return Err(Error::too_large(format!("a header or params part may hold at most {SMALL_BODY_MAX} bytes")));
        }
        out.extend_from_slice(&c);
    }
    Ok(out)
}
