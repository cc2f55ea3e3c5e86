//! The chat page at `/` (off with `--no-webui`): the browser page's interface
//! (`web/www/style.css`) talking to this server's own API, built into the binary, so nothing
//! else is built or fetched. The page and its files answer without a key; the API calls it
//! makes carry the key typed into it.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The page and its files: path, content type, bytes.
pub const FILES: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../webui/index.html"),
    ),
    (
        "/webui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../webui/app.js"),
    ),
    (
        "/webui/style.css",
        "text/css; charset=utf-8",
        include_str!("../../web/www/style.css"),
    ),
];

/// Whether `path` is one of the page's files.
pub fn is_page(path: &str) -> bool {
    FILES.iter().any(|(p, _, _)| *p == path)
}

/// The page's file at `path` (one of [`FILES`]).
pub fn file(path: &str) -> Response {
    let Some((_, kind, body)) = FILES.iter().find(|(p, _, _)| *p == path) else {
        return axum::http::StatusCode::NOT_FOUND.into_response();
    };
    let mut r = (*body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
