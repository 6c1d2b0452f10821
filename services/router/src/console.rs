//! The web console, served by the admin listener at `/console/`: static
//! pages (HTML, CSS and JavaScript written by hand: no build step), which
//! sign in with the admin token and use the admin API (the routes only the
//! console needed are `console_admin.rs`).
//!
//! The pages carry no secret and need none to load; every API call they
//! make carries the admin token the operator typed in (kept in the tab's
//! session storage, sent as `Authorization: Bearer`). A strict
//! Content-Security-Policy allows the console's own script and style only,
//! and the script writes text, never HTML, from what the API returns.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use crate::body::Body;

/// The console's files: path under `/console/`, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    ("", "text/html; charset=utf-8", include_str!("../console/index.html")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../console/console.js")),
    ("console.css", "text/css; charset=utf-8", include_str!("../console/console.css")),
];

const POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                      base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A file of the console, if `path` names one (`/console` redirects).
pub fn file(path: &str) -> Option<Response<Body>> {
    if path == "/" || path == "/console" {
        let mut response = Response::new(Body::Empty);
        *response.status_mut() = StatusCode::FOUND;
        response.headers_mut().insert(http::header::LOCATION, HeaderValue::from_static("/console/"));
        return Some(response);
    }
    let name = path.strip_prefix("/console/")?;
    let &(_, content_type, text) = FILES.iter().find(|(file, _, _)| *file == name)?;
    let mut response = Response::new(Body::full(Bytes::from_static(text.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(http::header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(http::header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(http::header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(response)
}
