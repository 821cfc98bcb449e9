//! A TCP listener with a cap on open connections: past `connections_max`, new connections
//! wait in the kernel's accept backlog until one closes. Also names each connection's peer
//! ([`ClientAddr`]) for per-IP limits and the IP blacklist.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use flashsale_core::metric_names::OPEN_CONNECTIONS;

pub struct CappedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    max: usize,
}

impl CappedListener {
    pub fn new(inner: TcpListener, connections_max: usize) -> CappedListener {
        let max = connections_max.max(1);
        CappedListener {
            inner,
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// A connection holding one of the listener's slots until it is dropped.
pub struct CappedStream {
    inner: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CappedStream, SocketAddr) {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    metrics::gauge!(OPEN_CONNECTIONS)
                        .set((self.max - self.slots.available_permits()) as f64);
                    return (
                        CappedStream {
                            inner: stream,
                            _slot: slot,
                        },
                        addr,
                    );
                }
                // Out of file descriptors and the like: back off, as axum does.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The peer of a connection, as `ConnectInfo<ClientAddr>` in each request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, CappedListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, CappedListener>) -> ClientAddr {
        ClientAddr(*stream.remote_addr())
    }
}
