//! The accept loop: HTTP/1.1 connections up to a limit (more wait in the listen backlog), each
//! dropped when its request headers do not arrive within the header timeout (a client sending
//! one byte a second does not hold a connection).

use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::log::Peer;
use crate::ServerConfig;
use tower::ServiceExt;

/// Accepts and serves connections on `listener` with `app`, forever.
pub async fn accept_loop(listener: TcpListener, app: Router, config: &ServerConfig) {
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: wait a moment rather than spin.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone().map_request(
            move |mut r: hyper::Request<hyper::body::Incoming>| {
                r.extensions_mut().insert(Peer(peer));
                r
            },
        ));
        let header_timeout = config.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
