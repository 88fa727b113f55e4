//! Counting, on the way in, the bytes a connection has sent that are not yet a request: the
//! [`Framing`] of what it sends (an HTTP/1.1 head up to its dispatch; an HTTP/2 header block
//! — HEADERS and its CONTINUATION frames — up to END_HEADERS) and [`Metered`], the I/O
//! wrapper that takes those bytes from the process's [`crate::budget::HeadBudget`] as they
//! are read. A read the budget refuses fails: the connection that sent the bytes is closed,
//! and no other. Linear in the bytes read, no allocation.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client sends first to speak HTTP/2 (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const H2_FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// The protocol of a connection as its bytes show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// Not known yet: this many bytes of the HTTP/2 preface matched so far.
    Sniffing(usize),
    /// Everything read until a request is dispatched is its head.
    Http1,
    Http2(H2Frames),
}

impl Default for Framing {
    fn default() -> Self {
        Framing::Sniffing(0)
    }
}

/// Where an HTTP/2 byte stream is: inside a frame's 9-byte header or its payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct H2Frames {
    header: [u8; H2_FRAME_HEADER],
    have: usize,
    payload_left: usize,
    in_payload: bool,
    /// The frame in hand is part of a header block.
    counts: bool,
    /// ... and the block ends with it.
    ends: bool,
}

/// What one read held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fed {
    /// Head bytes among them.
    pub head: usize,
    /// A head was completed by them: what was held before is a request now (HTTP/2, and
    /// the preface).
    pub completed: bool,
    /// Head bytes after the last completion (an open header block's beginning).
    pub open: usize,
}

impl Framing {
    /// Reads `bytes` on from where the stream was.
    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        let mut fed = Fed::default();
        let mut rest = bytes;
        if let Framing::Sniffing(matched) = *self {
            let want = &H2_PREFACE[matched..];
            let n = want.len().min(rest.len());
            if rest[..n] == want[..n] {
                if n == want.len() {
                    // HTTP/2: the preface is no head; what was held for it goes.
                    *self = Framing::Http2(H2Frames::default());
                    fed.completed = true;
                    rest = &rest[n..];
                } else {
                    *self = Framing::Sniffing(matched + n);
                    fed.head = n;
                    fed.open = n;
                    return fed;
                }
            } else {
                *self = Framing::Http1;
            }
        }
        match self {
            Framing::Sniffing(_) => {}
            Framing::Http1 => {
                fed.head += rest.len();
                fed.open += rest.len();
            }
            Framing::Http2(frames) => frames.feed(rest, &mut fed),
        }
        fed
    }

    /// Whether a dispatched request ends the head in flight (HTTP/1.1: a connection reads
    /// the next head only after it).
    pub fn heads_end_at_dispatch(&self) -> bool {
        !matches!(self, Framing::Http2(_))
    }
}

impl H2Frames {
    fn feed(&mut self, mut bytes: &[u8], fed: &mut Fed) {
        while !bytes.is_empty() {
            if !self.in_payload {
                let n = (H2_FRAME_HEADER - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                bytes = &bytes[n..];
                if self.have < H2_FRAME_HEADER {
                    return;
                }
                let h = &self.header;
                self.payload_left =
                    (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                self.counts = matches!(h[3], HEADERS | CONTINUATION | PUSH_PROMISE);
                self.ends = self.counts && h[4] & END_HEADERS != 0;
                self.have = 0;
                self.in_payload = true;
                if self.counts {
                    fed.head += H2_FRAME_HEADER;
                    fed.open += H2_FRAME_HEADER;
                }
            }
            let n = self.payload_left.min(bytes.len());
            if self.counts {
                fed.head += n;
                fed.open += n;
            }
            self.payload_left -= n;
            bytes = &bytes[n..];
            if self.payload_left == 0 {
                self.in_payload = false;
                if self.ends {
                    fed.completed = true;
                    fed.open = 0;
                }
            }
        }
    }
}

/// What [`Metered`] reports its reads to.
pub trait Account: Send + Sync {
    /// `bytes` were just read; false refuses them (the read fails, the connection closes).
    fn read(&self, bytes: &[u8], below_tls: bool) -> bool;
}

/// An I/O stream whose reads are accounted: below TLS (the handshake's bytes) or above it
/// (the plaintext's heads).
pub struct Metered<T> {
    inner: T,
    account: Arc<dyn Account>,
    below_tls: bool,
}

impl<T> Metered<T> {
    /// Under a TLS layer: counts the handshake.
    pub fn below_tls(inner: T, account: Arc<dyn Account>) -> Metered<T> {
        Metered {
            inner,
            account,
            below_tls: true,
        }
    }

    /// Over the plaintext (TLS, or a plain socket): counts request heads.
    pub fn plaintext(inner: T, account: Arc<dyn Account>) -> Metered<T> {
        Metered {
            inner,
            account,
            below_tls: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if !new.is_empty() && !self.account.read(new, self.below_tls) {
            return Poll::Ready(Err(io::Error::other(
                "the memory budget for request heads refused these bytes",
            )));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![
            (n >> 16) as u8,
            (n >> 8) as u8,
            n as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `bytes` in pieces of `step`, summing what was fed, as the meter would.
    fn feed_in(f: &mut Framing, bytes: &[u8], step: usize) -> (usize, usize) {
        // (held at the end, completions)
        let (mut held, mut done) = (0, 0);
        for chunk in bytes.chunks(step) {
            let fed = f.feed(chunk);
            if fed.completed {
                held = fed.open;
                done += 1;
            } else {
                held += fed.head;
            }
        }
        (held, done)
    }

    #[test]
    fn an_http1_head_is_held_until_dispatch() {
        let mut f = Framing::default();
        let head = b"GET /apis HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaa";
        for step in [1, 3, 7, 100] {
            let mut f2 = Framing::default();
            assert_eq!(feed_in(&mut f2, head, step), (head.len(), 0), "step {step}");
            assert_eq!(f2, Framing::Http1);
        }
        // "PRI" shared with the preface, then not HTTP/2.
        assert_eq!(feed_in(&mut f, b"PRI-NOT", 2), (7, 0));
        assert!(f.heads_end_at_dispatch());
    }

    #[test]
    fn an_http2_header_block_is_held_until_end_headers_and_nothing_else_is() {
        let mut stream = H2_PREFACE.to_vec();
        stream.extend(frame(0x4, 0, &[0; 12])); // SETTINGS: no head
        stream.extend(frame(0x8, 0, &[0; 4])); // WINDOW_UPDATE
        stream.extend(frame(HEADERS, 0, &[1; 100])); // a block begun...
        stream.extend(frame(CONTINUATION, 0, &[2; 200]));
        for step in [1, 5, 9, 64, 4096] {
            let mut f = Framing::default();
            let (held, done) = feed_in(&mut f, &stream, step);
            assert_eq!(held, 9 + 100 + 9 + 200, "step {step}");
            assert_eq!(done, 1, "the preface only");
            assert!(!f.heads_end_at_dispatch());
            // ...and ended: nothing held; DATA afterwards is no head.
            let mut end = frame(CONTINUATION, END_HEADERS, &[3; 50]);
            end.extend(frame(0x0, 0, &[0; 1000]));
            let (held, done) = feed_in(&mut f, &end, step);
            assert_eq!((held, done > 0), (0, true), "step {step}");
        }
    }

    #[test]
    fn a_block_begun_after_one_ends_in_the_same_read_is_held() {
        let mut f = Framing::Http2(H2Frames::default());
        let mut bytes = frame(HEADERS, END_HEADERS, &[0; 30]);
        bytes.extend(frame(HEADERS, 0, &[0; 40]));
        let fed = f.feed(&bytes);
        assert!(fed.completed);
        assert_eq!(fed.open, 49);
        assert_eq!(fed.head, 39 + 49);
        // An empty frame ending a block.
        let fed = f.feed(&frame(CONTINUATION, END_HEADERS, &[]));
        assert_eq!((fed.completed, fed.open), (true, 0));
    }
}
