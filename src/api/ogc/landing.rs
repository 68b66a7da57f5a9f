//! The landing page, the conformance declaration and the API definition.

use axum::extract::RawQuery;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::problem::{OgcResult, Problem};
use super::{link, rel, BaseUrl};

/// The conformance classes implemented: Core, the OGC process description, JSON, OpenAPI 3.0, the
/// job list and dismiss.
pub const CONFORMS_TO: [&str; 6] = [
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/core",
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/ogc-process-description",
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/json",
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/oas30",
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/job-list",
    "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/dismiss",
];

/// The media type of an OpenAPI 3.0 document in YAML.
const OPENAPI_YAML: &str = "application/vnd.oai.openapi;version=3.0";

/// This server's contract, served as written (`openapi.yaml` at the repository root).
const OPENAPI_DOCUMENT: &str = include_str!("../../../openapi.yaml");

pub fn landing_document(base: &BaseUrl) -> serde_json::Value {
    json!({
        "title": "hypermnf",
        "description": "Maximum Noise Fraction reduction of hyperspectral cubes (OGC API - Processes; the native API is under /v1)",
        "links": [
            link(base.join("/"), "self", "application/json", "this document"),
            link(base.join("/?f=html"), "alternate", "text/html", "the web page"),
            link(base.join("/api"), "service-desc", OPENAPI_YAML, "the API definition (OpenAPI 3.0, YAML)"),
            link(base.join("/conformance"), rel::CONFORMANCE, "application/json", "conformance classes implemented"),
            link(base.join("/processes"), rel::PROCESSES, "application/json", "the processes"),
            link(base.join("/jobs"), rel::JOB_LIST, "application/json", "the caller's jobs"),
        ],
    })
}

/// `/`: the landing page's JSON for API clients, the web page for browsers (content negotiation on
/// `Accept`, or `?f=json` / `?f=html`).
pub async fn landing(base: BaseUrl, headers: HeaderMap, RawQuery(query): RawQuery) -> OgcResult<Response> {
    let mut format = None;
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match (k.as_ref(), v.as_ref()) {
            ("f", "json" | "html") => format = Some(v.into_owned()),
            ("f", other) => return Err(Problem::new(StatusCode::BAD_REQUEST, "invalid_query", format!("f must be json or html, not {other:?}"))),
            (other, _) => return Err(Problem::new(StatusCode::BAD_REQUEST, "invalid_query", format!("unknown query parameter {other:?} (f)"))),
        }
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if crate::api::web::prefers_html(accept, format.as_deref()) {
        return Ok(crate::api::web::page());
    }
    let mut r = axum::Json(landing_document(&base)).into_response();
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("accept"));
    Ok(r)
}

pub async fn conformance() -> Response {
    axum::Json(json!({"conformsTo": CONFORMS_TO})).into_response()
}

pub async fn api_definition() -> Response {
    let mut r = OPENAPI_DOCUMENT.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(OPENAPI_YAML));
    r
}
