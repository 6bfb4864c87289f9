//! The `[metrics]` listener, HTTP/1 on the agent's tokio runtime (hyper): `/metrics` (the
//! Prometheus text format 0.0.4, or OpenMetrics to a scraper that asks for it), `/healthz` (the
//! process is alive) and `/readyz` (model loaded, and the broker connected or the spool
//! accepting). Bounded: at most [`MAX_CONNECTIONS`] at once, headers within 10 s.
//! Uses `agent::metrics` and `agent::telemetry`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::agent::metrics::{Exporter, Format};

/// Most connections served at once (scrapers and probes); more are closed at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Longest a connection is kept.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Serves until the task is dropped (with the runtime).
pub async fn serve(listener: tokio::net::TcpListener, exporter: Arc<Exporter>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // out of file descriptors and the like: wait rather than spin
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let exporter = exporter.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
                let resp = respond(&exporter, req.method(), req.uri().path(), accept);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            drop(permit);
        });
    }
}

/// The answer to one request.
pub fn respond(exporter: &Exporter, method: &Method, path: &str, accept: Option<&str>) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let format = Format::from_accept(accept);
            let mut r = Response::new(Full::new(Bytes::from(exporter.render(format))));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match exporter.stats().readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::telemetry::Stats;
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering::Relaxed;

    fn get(port: u16, path: &str, accept: &str) -> (u16, String, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_string())
    }

    #[test]
    fn serves_metrics_health_and_readiness() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let stats = Arc::new(Stats::default());
        let exporter = Arc::new(Exporter::new(stats.clone(), "cpu", "f32"));
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        rt.spawn(async move { serve(tokio::net::TcpListener::from_std(std_listener).unwrap(), exporter).await });

        assert_eq!(get(port, "/healthz", "*/*").0, 200);
        let (status, _, body) = get(port, "/readyz", "*/*");
        assert_eq!((status, body.as_str()), (503, "not ready: model loading\n"));
        stats.model_ready.store(true, Relaxed);
        stats.spool_accepting.store(true, Relaxed);
        let (status, _, body) = get(port, "/readyz", "*/*");
        assert_eq!((status, body.as_str()), (200, "ready\n"));

        let (status, head, body) = get(port, "/metrics", "text/plain");
        assert_eq!(status, 200);
        assert!(head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
        assert!(body.contains("yolo_edge_ready 1\n") && !body.contains("# EOF"), "{body}");
        let (_, head, body) = get(port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5");
        assert!(head.contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert_eq!(get(port, "/", "*/*").0, 404);
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 405") && out.to_ascii_lowercase().contains("allow: get, head"), "{out}");
    }
}
