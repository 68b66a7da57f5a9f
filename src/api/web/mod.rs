//! The web page, for people who would rather look than read: served at `/` to clients that prefer
//! HTML (browsers), beside the OGC landing page's JSON for API clients. One self-contained document
//! (HTML, CSS and script compiled in from this directory, nothing fetched from elsewhere, so it works
//! offline) that talks to `/v1`: the job list, one job's eigenvalue plot, component quicklooks
//! (`/v1/jobs/{id}/preview`), dropped bands, timings and downloads, and uploads with a progress bar:
//! large files go up resumably (tus, `/v1/uploads`) through tus-js-client, compiled in from
//! `tus.min.js` (version and MIT licence at its top).

use std::sync::LazyLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

static PAGE: LazyLock<String> = LazyLock::new(|| {
    include_str!("index.html")
        .replacen("/*STYLE*/", include_str!("app.css"), 1)
        .replacen("/*TUS*/", include_str!("tus.min.js"), 1)
        .replacen("/*SCRIPT*/", include_str!("app.js"), 1)
});

pub fn page() -> Response {
    let mut r = PAGE.as_str().into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // The page only talks to this server.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' blob: data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'"),
    );
    h.insert(header::VARY, HeaderValue::from_static("accept"));
    r
}

/// True when the client prefers HTML to JSON: `?f=html`, or an `Accept` header that ranks
/// `text/html` above `application/json` (a browser's does; OWSLib's `*/*` and an API client's
/// `application/json` do not: on a tie, JSON).
pub fn prefers_html(accept: Option<&str>, format: Option<&str>) -> bool {
    match format {
        Some("html") => return true,
        Some(_) => return false,
        None => {}
    }
    let Some(accept) = accept else { return false };
    let (mut html, mut json) = (0.0f32, 0.0f32);
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
            .next()
            .unwrap_or(1.0);
        let (h, j) = match media.as_str() {
            "text/html" | "application/xhtml+xml" => (q, 0.0),
            "application/json" => (0.0, q),
            "text/*" => (q * 0.99, 0.0),
            "application/*" => (0.0, q * 0.99),
            "*/*" => (q * 0.98, q * 0.98),
            _ => (0.0, 0.0),
        };
        html = html.max(h);
        json = json.max(j);
    }
    html > json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn browsers_get_html_and_api_clients_json() {
        let chrome = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";
        let firefox = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert!(prefers_html(Some(chrome), None));
        assert!(prefers_html(Some(firefox), None));
        for accept in [None, Some("*/*"), Some("application/json"), Some("application/json, text/html;q=0.5"), Some("text/html;q=0.5, */*")] {
            assert!(!prefers_html(accept, None), "{accept:?}");
        }
        assert!(!prefers_html(Some(chrome), Some("json")));
        assert!(prefers_html(None, Some("html")));
    }

    #[test]
    fn the_page_is_whole_and_self_contained() {
        assert!(!PAGE.contains("/*STYLE*/") && !PAGE.contains("/*SCRIPT*/") && !PAGE.contains("/*TUS*/"));
        // tus-js-client is in, with its licence, and nothing closes its script early.
        assert!(PAGE.contains("tus-js-client 4.3.1") && PAGE.contains("The MIT License"));
        assert_eq!(PAGE.matches("</script>").count(), 2);
        assert!(PAGE.contains("upload-progress") && PAGE.contains("function plot("));
        // Nothing from elsewhere: no external scripts, styles or fonts.
        for needle in ["http://", "https://", "src=\"//"] {
            let outside = PAGE.match_indices(needle).any(|(i, _)| !PAGE[i..].starts_with("http://www.w3.org/2000/svg"));
            assert!(!outside, "{needle}");
        }
    }
}
