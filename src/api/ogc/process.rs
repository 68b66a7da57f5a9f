//! `/processes` and `/processes/mnf`: the one process, described in OGC process-description JSON.
//! The inputs are the native API's parameters under the same names, and the cube; the outputs are the
//! products `/v1/jobs/{id}/result` and `/metadata` serve.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::problem::{OgcResult, Problem};
use super::links::{link, rel, BaseUrl};

/// The one process this server offers.
pub const PROCESS_ID: &str = "mnf";

pub const NPY: &str = "application/x-npy";

fn summary(base: &BaseUrl) -> Value {
    let url = base.join(&format!("/processes/{PROCESS_ID}"));
    json!({
        "id": PROCESS_ID,
        "title": "Maximum Noise Fraction",
        "description": "Reduces a hyperspectral cube (lines x samples x bands) to its first MNF components, \
                        ordered by signal-to-noise ratio; optionally the denoised cube (inverse transform).",
        "version": env!("CARGO_PKG_VERSION"),
        "keywords": ["hyperspectral", "MNF", "noise", "dimensionality reduction"],
        "jobControlOptions": ["async-execute", "sync-execute", "dismiss"],
        "outputTransmission": ["value", "reference"],
        "links": [
            link(url.clone(), "self", "application/json", "process description"),
            link(url.clone(), rel::PROCESS_DESC, "application/json", "process description"),
            link(format!("{url}/execution"), rel::EXECUTE, "application/json", "execute the process"),
        ],
    })
}

fn literal(title: &str, description: &str, schema: Value) -> Value {
    json!({"title": title, "description": description, "schema": schema, "minOccurs": 0, "maxOccurs": 1})
}

/// The process description (OGC process description, Processes 1.0).
pub fn description(base: &BaseUrl) -> Value {
    let mut d = summary(base);
    d["inputs"] = json!({
        "cube": {
            "title": "Input cube",
            "description": "The hyperspectral cube, (lines, samples, bands). By reference: {\"href\": \"file:///...\"} naming \
                an ENVI header (.hdr, its data file beside it), a .npy file, or (servers built with GDAL) an EMIT NetCDF, \
                NEON / PRISMA HDF5 or multi-band GeoTIFF under one of the server's --input-root \
                directories (an absolute path is read as file://), or as {\"href\": \"s3://bucket/key\"} or \
                {\"href\": \"https://host/path\"} in a bucket or on a host the server allows. Inline: {\"value\": \"<base64 of a .npy file>\", \
                \"mediaType\": \"application/x-npy\", \"encoding\": \"base64\"}, for cubes of up to 192 MiB (or --max-upload-bytes) \
                (larger ones by reference, or uploaded to POST /v1/jobs). Several cubes: an array of references \
                [{\"href\": ...}, ...], which makes one job of the batch (see the input statistics; always run \
                asynchronously; /jobs/{id}/results links each cube's outputs in the order given).",
            "schema": {"oneOf": [
                {"type": "string", "contentMediaType": NPY, "contentEncoding": "base64"},
                {"type": "string", "format": "uri", "contentMediaType": "application/x-envi-header"},
                {"type": "string", "format": "uri", "contentMediaType": NPY},
                {"type": "string", "format": "uri", "contentMediaType": "application/x-netcdf"},
                {"type": "string", "format": "uri", "contentMediaType": "application/x-hdf5"},
                {"type": "string", "format": "uri", "contentMediaType": "image/tiff"},
            ]},
            "minOccurs": 1,
            "maxOccurs": crate::api::batches::MAX_INPUTS,
        },
        "statistics": literal("Statistics of several cubes", "With an array of cubes: \"pooled\" computes one eigen system from \
            all the cubes' statistics (they must have the same bands) and projects every cube with it; \"each\" (default) \
            runs every cube as an independent job. Ignored for one cube.",
            json!({"type": "string", "enum": ["each", "pooled"], "default": "each"})),
        "components": literal("Components", "Number of components to keep (default 10, capped at the bands used). Exclusive with snr.",
            json!({"type": "integer", "minimum": 1})),
        "snr": literal("SNR threshold", "Keep the components whose eigenvalue is at least 1 + snr. Exclusive with components.",
            json!({"type": "number", "minimum": 0})),
        "noise": literal("Noise estimator", "How the noise is estimated from the image.",
            json!({"type": "string", "enum": ["mean-filter", "shift-difference"], "default": "mean-filter"})),
        "inverse": literal("Inverse", "Also compute the denoised cube (output `denoised`); requesting that output sets it.",
            json!({"type": "boolean", "default": false})),
        "ortho": literal("Orthorectify", "EMIT granules only: the GeoTIFF outputs on the granule's north-up grid, its geometry lookup \
            table (GLT) applied; without it they stay in sensor geometry with no CRS. Needs the outputs as GeoTIFF by reference.",
            json!({"type": "boolean", "default": false})),
        "bad_bands": literal("Bad bands", "0-based bands to exclude, beside the header's bbl and constant bands.",
            json!({"type": "array", "items": {"type": "integer", "minimum": 0}})),
        "ignore_value": literal("No-data value", "Pixels holding this value in any band are left out (overrides the header's data ignore value). \
            A number, or \"nan\"; in float cubes NaN and ±Inf pixels are no-data whatever this says.",
            json!({"oneOf": [{"type": "number"}, {"type": "string", "enum": ["nan", "NaN", "NAN"]}]})),
        "noise_window": literal("Noise window", "[x0, y0, x1, y1]: the noise statistics from columns x0..x1 and rows y0..y1 only (ends excluded).",
            json!({"type": "array", "minItems": 4, "maxItems": 4, "items": {"type": "integer", "minimum": 0}})),
        "backend": literal("Backend", "Where the job runs.",
            json!({"type": "string", "enum": ["auto", "cpu", "cuda", "cuda-cublas"], "default": "auto"})),
    });
    d["outputs"] = json!({
        "components": {
            "title": "MNF components",
            "description": "float32, (lines, samples, k): the first k components, highest SNR first.",
            "schema": {"oneOf": [
                {"type": "string", "contentMediaType": NPY, "contentEncoding": "binary"},
                {"type": "string", "contentMediaType": "application/zip", "contentEncoding": "binary",
                 "description": "ENVI .hdr + .img in a zip (by reference only)"},
                {"type": "string", "contentMediaType": crate::api::formats::COG_MEDIA_TYPE, "contentEncoding": "binary",
                 "description": "Cloud-Optimized GeoTIFF with the source's CRS, bands `MNF k` (by reference only; servers built with GDAL)"},
            ]},
        },
        "denoised": {
            "title": "Denoised cube",
            "description": "float32, (lines, samples, bands): the inverse transform of the kept components; only with inverse.",
            "schema": {"oneOf": [
                {"type": "string", "contentMediaType": NPY, "contentEncoding": "binary"},
                {"type": "string", "contentMediaType": "application/zip", "contentEncoding": "binary"},
                {"type": "string", "contentMediaType": crate::api::formats::COG_MEDIA_TYPE, "contentEncoding": "binary"},
            ]},
        },
        "metadata": {
            "title": "Metadata",
            "description": "Eigenvalues, SNR, bands used and dropped (with reasons), transform, noise and timings: \
                            the JSON `hypermnf run` writes beside its output.",
            "schema": {"type": "object", "contentMediaType": "application/json"},
        },
    });
    d
}

pub async fn list(base: BaseUrl) -> Response {
    let url = base.join("/processes");
    axum::Json(json!({
        "processes": [summary(&base)],
        "links": [link(url, "self", "application/json", "the processes")],
    }))
    .into_response()
}

pub async fn describe(base: BaseUrl, Path(process_id): Path<String>) -> OgcResult<Response> {
    if process_id != PROCESS_ID {
        return Err(Problem::no_such_process(&process_id));
    }
    Ok(axum::Json(description(&base)).into_response())
}
