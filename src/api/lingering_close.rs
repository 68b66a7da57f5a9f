//! Lingering close: a connection the server ends is not closed while the client may still be sending.
//!
//! An upload refused before its body was read (413 past `--max-upload-bytes`, a body longer than its
//! header claims, ...) is answered at once, with `Connection: close`. Closing a TCP socket whose receive
//! buffer still holds unread bytes makes the kernel send a reset instead of a plain end, and a reset
//! makes the client's kernel drop whatever it had received but not yet read — the 413 itself — so a
//! client still sending its body saw "connection reset" instead of the JSON error. So every connection
//! is closed the way web servers do it (Apache's and nginx's "lingering close"): after hyper is done
//! with it, the write side is shut (the client sees the answer end), then what the client still sends
//! is read and thrown away (never stored) until it stops, within bounds in bytes and time, and only
//! then is the socket closed. A client that keeps sending past the bounds is cut off with a reset.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// At most this much is read and discarded after the server ended a connection (a refused upload's
/// remaining body, typically): at loopback or LAN speed, a second or two.
pub const LINGER_MAX_BYTES: u64 = 1 << 30;
/// At most this long in all, from the end of the server's answer.
pub const LINGER_MAX_TIME: Duration = Duration::from_secs(10);
/// A client that sends nothing for this long (and does not close) is not waited for any longer.
pub const LINGER_IDLE: Duration = Duration::from_secs(2);

/// A TCP listener for `axum::serve` whose connections close lingeringly (see the module doc).
pub struct Listener(pub TcpListener);

impl axum::serve::Listener for Listener {
    type Io = Lingering;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Lingering, SocketAddr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => return (Lingering(Some(stream)), addr),
                // Errors of one connection (reset before accept, ...) concern only it; others (too many
                // open files) last a while: wait a little before trying again instead of spinning.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    tracing::error!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset)
}

/// A connection that, when dropped, closes lingeringly on a task of its own.
pub struct Lingering(Option<TcpStream>);

impl Lingering {
    fn stream(&mut self) -> io::Result<&mut TcpStream> {
        // Only None once dropped, so never while hyper uses it.
        self.0.as_mut().ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(stream) = self.0.take() else { return };
        // Without a runtime (the process is ending) the socket is just closed.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(linger(stream));
        }
    }
}

/// Shuts the write side, then reads and discards until the client closes, or a bound is reached.
async fn linger(mut stream: TcpStream) {
    // hyper has normally shut the write side already; when it has not (an error ended the
    // connection), the client still learns here that nothing more comes.
    let _ = stream.shutdown().await;
    let deadline = tokio::time::Instant::now() + LINGER_MAX_TIME;
    let mut buf = vec![0u8; 64 << 10];
    let mut discarded = 0u64;
    loop {
        let wait = deadline.min(tokio::time::Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(wait, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return, // the client closed (or is gone): a clean end
            Ok(Ok(n)) => {
                discarded += n as u64;
                if discarded > LINGER_MAX_BYTES {
                    break;
                }
            }
            Err(_) => break, // idle, or out of time
        }
    }
    tracing::debug!(discarded, "a client kept sending after the answer; its connection is cut off");
}

impl AsyncRead for Lingering {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => Pin::new(s).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => Pin::new(s).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}
