//! The outputs an OGC job's results hold, and how each is given (inline or by reference, in which
//! format); and the exception a failed job answers with. Shared by single jobs (`jobs`), batches
//! (`batch_jobs`) and executions (`execute`).

use axum::http::StatusCode;

use super::problem::{OgcResult, Problem};
use super::process::NPY;
use super::BaseUrl;
use crate::jobs::{product, Job};

/// A product a results document can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Components,
    Denoised,
    Metadata,
}

impl Output {
    pub const ALL: [Output; 3] = [Output::Components, Output::Denoised, Output::Metadata];
    pub fn id(self) -> &'static str {
        match self {
            Output::Components => "components",
            Output::Denoised => "denoised",
            Output::Metadata => "metadata",
        }
    }
    pub fn parse(s: &str) -> Option<Output> {
        Output::ALL.into_iter().find(|o| o.id() == s)
    }
}

/// How an output is returned: inline (`value`) or as a link (`reference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmission {
    Value,
    Reference,
}

/// One requested output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputChoice {
    pub output: Output,
    pub transmission: Transmission,
    /// ENVI (.hdr + .img) in a zip instead of .npy; by reference only.
    pub envi_zip: bool,
    /// A Cloud-Optimized GeoTIFF instead of .npy (`api::formats`); by reference only.
    pub cog: bool,
}

impl OutputChoice {
    /// What `/jobs/{id}/results` gives, the job not knowing how it was asked for: the arrays by
    /// reference (they can be large), the metadata inline.
    pub fn defaults(job: &Job) -> Vec<OutputChoice> {
        Output::ALL
            .into_iter()
            .filter(|o| *o != Output::Denoised || job.results.contains_key(product::DENOISED_NPY))
            .map(|output| OutputChoice {
                output,
                transmission: if output == Output::Metadata { Transmission::Value } else { Transmission::Reference },
                envi_zip: false,
                cog: false,
            })
            .collect()
    }

    pub fn media_type(&self) -> &'static str {
        if self.cog && self.output != Output::Metadata {
            return crate::api::formats::COG_MEDIA_TYPE;
        }
        match (self.output, self.envi_zip) {
            (Output::Metadata, _) => "application/json",
            (_, true) => "application/zip",
            (_, false) => NPY,
        }
    }

    /// The native API's URL of this product.
    pub fn href(&self, base: &BaseUrl, job: &Job) -> String {
        let job_url = base.join(&format!("/v1/jobs/{}", job.id));
        match (self.output, self.cog) {
            (Output::Components, true) => return format!("{job_url}/result?format=cog"),
            (Output::Denoised, true) => return format!("{job_url}/result?product=denoised&format=cog"),
            _ => {}
        }
        match (self.output, self.envi_zip) {
            (Output::Metadata, _) => format!("{job_url}/metadata"),
            (Output::Components, false) => format!("{job_url}/result"),
            (Output::Components, true) => format!("{job_url}/result?format=envi"),
            (Output::Denoised, false) => format!("{job_url}/result?product=denoised"),
            (Output::Denoised, true) => format!("{job_url}/result?product=denoised&format=envi"),
        }
    }

    /// The storage key of an inline value.
    pub fn key<'j>(&self, job: &'j Job) -> OgcResult<&'j String> {
        let name = match self.output {
            Output::Components => product::COMPONENTS_NPY,
            Output::Denoised => product::DENOISED_NPY,
            Output::Metadata => product::METADATA,
        };
        job.results.get(name).ok_or_else(|| match self.output {
            Output::Denoised => Problem::new(
                StatusCode::CONFLICT,
                "no_denoised",
                "this job did not compute the inverse: the `denoised` output needs inverse=true",
            ),
            _ => Problem::internal(anyhow::anyhow!("job {} lacks {name}", job.id)),
        })
    }
}

/// The exception of a failed job: the input's fault (400) or ours (500), with its code and message.
pub fn failure(job: &Job) -> Problem {
    let code = job.error_code.as_deref().unwrap_or("failed");
    const INPUT_FAULTS: [&str; 8] = [
        "invalid_params", "degenerate_input", "invalid_header", "invalid_npy", "size_mismatch", "unsupported", "too_large",
        "input_not_found",
    ];
    let status = if INPUT_FAULTS.contains(&code) { StatusCode::BAD_REQUEST } else { StatusCode::INTERNAL_SERVER_ERROR };
    Problem::new(status, code, format!("the job failed: {}", job.error_message.as_deref().unwrap_or(code)))
}
