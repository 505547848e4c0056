//! The accept loop: every TCP connection served by hyper's HTTP/1.1 server (as `axum::serve`
//! did) with two clocks against slow or idle clients, and a graceful shutdown.
//!
//! - **Header read** (`header_read_timeout_ms`): hyper's HTTP/1 timer runs from the moment a
//!   connection waits for a request until that request's headers are complete; a client that
//!   sends half a header (or trickles it), or nothing at all, is disconnected when it expires.
//!   The timer also runs while a keep-alive connection waits for its next request.
//! - **Idle** (`idle_timeout_ms`): a connection on which no byte has moved in either direction
//!   for this long is shut down gracefully: closed at once when no request is in flight, else
//!   after its response (a request whose handler is slow is never cut off; the request
//!   timeout bounds it). It is the bound on a keep-alive connection's silence when it is
//!   shorter than the header-read timeout.
//!
//! Shutdown: the listener stops accepting, every connection is shut down gracefully
//! (in-flight requests are answered), and [`serve_connections`] returns when the last
//! connection has closed — what `axum::serve(…).with_graceful_shutdown(…)` did before.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// The two connection clocks of [`serve_connections`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTimeouts {
    /// Most time from waiting for a request to having its complete headers (HTTP/1).
    pub header_read: Duration,
    /// Most time without a byte read or written before a graceful close.
    pub idle: Duration,
}

/// Serves `app` on `listener` (with the peer address as axum's `ConnectInfo<SocketAddr>`)
/// until `signal` completes, then shuts every connection down gracefully and returns once
/// they have all closed. Errors of single connections (resets, timeouts) are logged at debug
/// level; accept errors (e.g. too many open files) are logged and retried after a pause.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    timeouts: ConnectionTimeouts,
    signal: impl Future<Output = ()> + Send + 'static,
) {
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    let builder = Arc::new(builder);
    let mut make_service = app.into_make_service_with_connect_info::<SocketAddr>();
    // Each connection holds a receiver: the sender's `closed()` tells when all are gone.
    let (close_tx, close_rx) = watch::channel(false);
    tokio::pin!(signal);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // `IntoMakeServiceWithConnectInfo` is infallible and always ready.
        let Ok(tower_service) = tower::Service::call(&mut make_service, peer).await
            as Result<_, std::convert::Infallible>;
        let service = TowerToHyperService::new(tower_service);
        let builder = builder.clone();
        let close_rx = close_rx.clone();
        tokio::spawn(async move {
            serve_one(stream, peer, &builder, service, timeouts.idle, close_rx).await;
        });
    }
    drop(listener);
    let _ = close_tx.send(true);
    drop(close_rx);
    close_tx.closed().await;
}

/// Serves one connection until it ends, closing it gracefully when it has been idle for
/// `idle` or when `close` turns true.
async fn serve_one<S>(
    stream: TcpStream,
    peer: SocketAddr,
    builder: &Builder,
    service: TowerToHyperService<S>,
    idle: Duration,
    mut close: watch::Receiver<bool>,
) where
    S: tower::Service<
            axum::extract::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let started = Instant::now();
    let io = Tracked {
        inner: stream,
        started,
        last_ms: Arc::new(AtomicU64::new(0)),
    };
    let last_ms = io.last_ms.clone();
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let idle_deadline = started + Duration::from_millis(last_ms.load(Ordering::Relaxed)) + idle;
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            changed = close.changed(), if !closing => {
                // A closed channel also means shutdown.
                let _ = changed;
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep_until(idle_deadline), if !closing => {
                // Bytes may have moved while this timer ran: only act on a real silence.
                let quiet = Instant::now().saturating_duration_since(
                    started + Duration::from_millis(last_ms.load(Ordering::Relaxed)));
                if quiet >= idle {
                    tracing::debug!(%peer, idle_ms = idle.as_millis() as u64, "closing an idle connection");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A stream that records when a byte last moved (milliseconds since `started`).
struct Tracked {
    inner: TcpStream,
    started: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Tracked {
    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
