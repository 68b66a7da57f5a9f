//! A streaming multipart/form-data reader (RFC 7578, in RFC 2046's framing) over a request body's
//! frames, for the multipart ENVI upload (`multipart`). A part's bytes are handed out as slices of the
//! body's own frames (`Bytes::slice`): nothing of a part's body is copied on its way to the upload
//! writer.
//!
//! axum's `Multipart` (the `multer` crate) copied every frame into a buffer of its own before it split
//! a part's bytes out of it: 0.47 core-seconds per GB in a 2-core profile taken under other builds'
//! load (BENCHMARKS.md, "Ingest, profiled"), 0.04–0.09 on the quiet machine, where dropping it gained a
//! few per cent of ingest (issue 29).
//! Here each frame is searched for the delimiter where it lies. Only the last bytes of a frame that
//! could begin a delimiter are held back, until the frames after them say whether they do; that
//! question is answered on a small copy of the bytes around the frame's end (at most twice the
//! delimiter's length), while the bytes handed out are still slices of their frames.
//!
//! The framing: an optional preamble; `--boundary`, optional transport padding (spaces, tabs) and CRLF;
//! a part's headers up to an empty line; its body up to `CRLF--boundary`; then either `--` (the close
//! delimiter: what follows, the epilogue, is not read) or padding and CRLF (the next part). A body that
//! ends before its close delimiter is an error, never a shorter last part.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use memchr::memmem::Finder;

/// RFC 2046's longest boundary. Bounding it bounds what is held back at a frame's end.
const BOUNDARY_MAX: usize = 70;
/// Most bytes of a part's boundary line and of its header block (each): real ones are a few hundred,
/// and they are gathered in memory.
const HEADERS_MAX: usize = 16 << 10;
/// Most bytes before the first boundary. Clients send none; a body that does not hold the boundary
/// its Content-Type names is refused after this much rather than read to its end.
const PREAMBLE_MAX: usize = 16 << 10;
/// Most headers a part may have (the three the ENVI upload's clients send, and room to spare).
const HEADERS_COUNT_MAX: usize = 32;

/// Why a multipart body cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// It is not multipart/form-data as RFC 7578 frames it (or its Content-Type does not say so).
    Malformed(String),
    /// It ended before its close delimiter, or its frames could not be received.
    Interrupted(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed(m) | Error::Interrupted(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// What a part's headers say: its form field name (Content-Disposition's `name`), when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartHead {
    pub name: Option<String>,
}

/// Where the reader is in the body.
#[derive(Debug)]
enum Phase {
    /// Before the first boundary.
    Preamble,
    /// In a part's body.
    Body,
    /// Just after a `CRLF--boundary`: a part's boundary line, or the close delimiter, comes next.
    Delimited,
    /// After the close delimiter.
    Closed,
    /// An error was met; it is given again.
    Failed(Error),
}

/// What the frames queued so far say about a part's body.
enum Scan {
    /// These bytes are the part's.
    Data(Bytes),
    /// The part ends here (the delimiter was consumed).
    Delimiter,
    /// Nothing can be told without the next frame.
    More,
}

/// A multipart/form-data body read part by part: [`MultipartBody::next_part`] gives each part's head,
/// [`MultipartBody::body`] its bytes.
pub struct MultipartBody<S> {
    frames: S,
    /// Received and not yet consumed, in order: slices of the body's frames.
    queue: VecDeque<Bytes>,
    /// Finds `CRLF--boundary`, which ends a part's body (and the preamble, read as if after a CRLF).
    finder: Finder<'static>,
    /// The bytes around a frame's end, where a delimiter cut by it is looked for.
    scratch: Vec<u8>,
    phase: Phase,
}

/// The boundary a `multipart/form-data` Content-Type names (quoted or not).
pub fn boundary(content_type: &str) -> Result<String, Error> {
    let bad = |m: String| Error::Malformed(m);
    let (essence, params) = content_type.split_at(content_type.find(';').unwrap_or(content_type.len()));
    if !essence.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(bad(format!("the Content-Type is {content_type:?}, not multipart/form-data")));
    }
    let params = parameters(params.as_bytes()).ok_or_else(|| bad(format!("the Content-Type {content_type:?} cannot be parsed")))?;
    let value = params
        .into_iter()
        .find(|(name, _)| name == "boundary")
        .map(|(_, v)| v)
        .ok_or_else(|| bad("the Content-Type names no boundary (multipart/form-data; boundary=...)".into()))?;
    // RFC 2046 allows 1 to 70 characters of a set of printable ones; any printable ASCII is taken,
    // as multer took it, so that a client a little outside the set is not refused.
    if value.is_empty() || value.len() > BOUNDARY_MAX || !value.iter().all(|&c| (b' '..=b'~').contains(&c)) {
        return Err(bad(format!(
            "the Content-Type's boundary {:?} is not 1 to {BOUNDARY_MAX} printable ASCII characters",
            String::from_utf8_lossy(&value)
        )));
    }
    Ok(String::from_utf8_lossy(&value).into_owned())
}

impl MultipartBody<axum::body::BodyDataStream> {
    /// The body of a `multipart/form-data` request, with the boundary its Content-Type names.
    pub fn from_request(req: axum::extract::Request) -> Result<Self, Error> {
        let content_type = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let boundary = boundary(content_type)?;
        Ok(MultipartBody::new(req.into_body().into_data_stream(), &boundary))
    }
}

impl<S, E> MultipartBody<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: fmt::Display,
{
    /// Reads `frames` as a multipart body whose parts are separated by `boundary`.
    pub fn new(frames: S, boundary: &str) -> Self {
        let delimiter = [b"\r\n--", boundary.as_bytes()].concat();
        // RFC 2046 lets the first boundary open the body without the CRLF of the others: the preamble
        // is read as a part's body that follows a CRLF, and the same search ends it.
        let queue = VecDeque::from([Bytes::from_static(b"\r\n")]);
        MultipartBody { frames, queue, finder: Finder::new(&delimiter).into_owned(), scratch: Vec::new(), phase: Phase::Preamble }
    }

    /// The next part's head, once its headers are read (what is left of the part before it, or of the
    /// preamble, is skipped), or None after the close delimiter.
    pub async fn next_part(&mut self) -> Result<Option<PartHead>, Error> {
        loop {
            match &self.phase {
                Phase::Preamble | Phase::Body => {
                    let preamble = matches!(self.phase, Phase::Preamble);
                    let mut skipped = 0;
                    while let Some(bytes) = std::future::poll_fn(|cx| self.poll_body(cx)).await {
                        skipped += bytes?.len();
                        if preamble && skipped > PREAMBLE_MAX {
                            return self.fail(Error::Malformed(format!(
                                "no boundary in the body's first {PREAMBLE_MAX} bytes: is it the one its Content-Type names?"
                            )));
                        }
                    }
                }
                Phase::Delimited => {
                    return match self.part_head().await {
                        Ok(head) => Ok(head),
                        Err(e) => self.fail(e),
                    }
                }
                Phase::Closed => return Ok(None),
                Phase::Failed(e) => return Err(e.clone()),
            }
        }
    }

    /// The current part's body: its bytes as slices of the body's frames, up to its delimiter (empty
    /// before the first part and after the close delimiter). Dropped before its end, the rest is
    /// skipped by the next [`MultipartBody::next_part`].
    pub fn body(&mut self) -> PartBody<'_, S> {
        PartBody { body: self }
    }

    fn fail<T>(&mut self, e: Error) -> Result<T, Error> {
        self.phase = Phase::Failed(e.clone());
        Err(e)
    }

    /// After a delimiter: the close delimiter (None), or a part's boundary line and headers.
    async fn part_head(&mut self) -> Result<Option<PartHead>, Error> {
        let first = self.next_byte().await?.ok_or_else(|| ended("right after a boundary"))?;
        let mut line = vec![first];
        if first == b'-' {
            let second = self.next_byte().await?.ok_or_else(|| ended("right after a boundary"))?;
            if second == b'-' {
                self.phase = Phase::Closed;
                return Ok(None);
            }
            line.push(second);
        } else if matches!(first, b' ' | b'\t' | b'\r') {
            self.read_until(&mut line, b"\r\n", "a boundary line").await?;
        }
        if !line.ends_with(b"\r\n") || !line[..line.len() - 2].iter().all(|&c| c == b' ' || c == b'\t') {
            return Err(Error::Malformed(format!(
                "a boundary is followed by {:?}, not by CRLF or --: the data holds the boundary, or is not multipart",
                String::from_utf8_lossy(&line[..line.len().min(40)])
            )));
        }
        // The boundary line's CRLF opens the block, so that a part without headers (an empty line at
        // once) ends it as a blank line ends any other.
        let mut block = b"\r\n".to_vec();
        self.read_until(&mut block, b"\r\n\r\n", "a part's headers").await?;
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_COUNT_MAX];
        let parsed = match httparse::parse_headers(&block[2..], &mut headers) {
            Ok(httparse::Status::Complete((_, parsed))) => parsed,
            Ok(httparse::Status::Partial) => return Err(Error::Malformed("a part's headers end early".into())),
            Err(e) => return Err(Error::Malformed(format!("a part's headers cannot be parsed: {e}"))),
        };
        let name = match parsed.iter().find(|h| h.name.eq_ignore_ascii_case("content-disposition")) {
            Some(h) => disposition_name(h.value)?,
            None => None,
        };
        self.phase = Phase::Body;
        Ok(Some(PartHead { name }))
    }

    /// The next byte of the body, None at its end (for the boundary line and headers only: the bytes
    /// of a part's body go through `scan`).
    async fn next_byte(&mut self) -> Result<Option<u8>, Error> {
        loop {
            if let Some(front) = self.queue.front_mut() {
                let b = front.get_u8();
                if front.is_empty() {
                    self.queue.pop_front();
                }
                return Ok(Some(b));
            }
            if !std::future::poll_fn(|cx| self.poll_frame(cx)).await? {
                return Ok(None);
            }
        }
    }

    /// Moves bytes of the body into `out` until it ends with `end`, within HEADERS_MAX.
    async fn read_until(&mut self, out: &mut Vec<u8>, end: &[u8], what: &str) -> Result<(), Error> {
        while !out.ends_with(end) {
            if out.len() >= HEADERS_MAX {
                return Err(Error::Malformed(format!("more than {HEADERS_MAX} bytes in {what}")));
            }
            match self.next_byte().await? {
                Some(b) => out.push(b),
                None => return Err(ended(&format!("within {what}"))),
            }
        }
        Ok(())
    }

    /// Queues the next non-empty frame: false at the end of the body.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Error>> {
        loop {
            match ready!(self.frames.poll_next_unpin(cx)) {
                Some(Ok(frame)) if frame.is_empty() => continue,
                Some(Ok(frame)) => {
                    self.queue.push_back(frame);
                    return Poll::Ready(Ok(true));
                }
                Some(Err(e)) => return Poll::Ready(Err(Error::Interrupted(format!("the body could not be received: {e}")))),
                None => return Poll::Ready(Ok(false)),
            }
        }
    }

    /// The next bytes of the preamble or of a part's body, None at its delimiter (the phase is then
    /// `Delimited`).
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        loop {
            match self.scan() {
                Scan::Data(bytes) => return Poll::Ready(Some(Ok(bytes))),
                Scan::Delimiter => {
                    self.phase = Phase::Delimited;
                    return Poll::Ready(None);
                }
                Scan::More => {
                    let e = match ready!(self.poll_frame(cx)) {
                        Ok(true) => continue,
                        Ok(false) => ended(match self.phase {
                            Phase::Preamble => "before its first boundary",
                            _ => "within a part",
                        }),
                        Err(e) => e,
                    };
                    self.phase = Phase::Failed(e.clone());
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    /// Tells what the queued frames hold at the front of a part's body: its bytes up to a delimiter
    /// or up to what could begin one, or the delimiter.
    fn scan(&mut self) -> Scan {
        let needle = self.finder.needle();
        let d = needle.len();
        let Some(front) = self.queue.front_mut() else { return Scan::More };
        if let Some(at) = self.finder.find(front) {
            if at > 0 {
                return Scan::Data(front.split_to(at));
            }
            front.advance(d);
            if front.is_empty() {
                self.queue.pop_front();
            }
            return Scan::Delimiter;
        }
        // No delimiter within the front frame; one may begin in its last d - 1 bytes and go on in the
        // frames after it. Those bytes and the next d - 1 are copied to look at them side by side.
        let from = front.len().saturating_sub(d - 1);
        self.scratch.clear();
        self.scratch.extend_from_slice(&front[from..]);
        let tail = self.scratch.len();
        let mut rest_queued = true;
        for next in self.queue.iter().skip(1) {
            let want = tail + d - 1 - self.scratch.len();
            self.scratch.extend_from_slice(&next[..want.min(next.len())]);
            if want < next.len() {
                rest_queued = false;
                break;
            }
        }
        // The delimiter starts with CR, which the boundary (printable) cannot hold: only a CR can
        // begin one.
        let mut cut = None;
        for p in memchr::memchr_iter(b'\r', &self.scratch[..tail]) {
            let rest = &self.scratch[p..];
            if rest.starts_with(needle) {
                cut = Some((from + p, true));
                break;
            }
            // All that is queued from here could be the start of one: the next frame will tell.
            if rest_queued && needle.starts_with(rest) {
                cut = Some((from + p, false));
                break;
            }
        }
        match cut {
            Some((0, true)) => {
                self.consume(d);
                Scan::Delimiter
            }
            Some((0, false)) => Scan::More,
            Some((at, _)) => self.queue.front_mut().map_or(Scan::More, |front| Scan::Data(front.split_to(at))),
            None => self.queue.pop_front().map_or(Scan::More, Scan::Data),
        }
    }

    /// Drops the first `n` queued bytes (a delimiter that may span frames).
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queue.front_mut() else { return };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.queue.pop_front();
        }
    }
}

/// The body ended too soon: `what` says where.
fn ended(what: &str) -> Error {
    Error::Interrupted(format!("the body was cut short: it ended {what}"))
}

/// A part's body, borrowed from its [`MultipartBody`]: its bytes, slices of the body's frames, up to
/// its delimiter.
pub struct PartBody<'a, S> {
    body: &'a mut MultipartBody<S>,
}

impl<S, E> Stream for PartBody<'_, S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: fmt::Display,
{
    type Item = Result<Bytes, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let body = &mut *self.get_mut().body;
        match body.phase {
            Phase::Body => body.poll_body(cx),
            _ => Poll::Ready(None),
        }
    }
}

/// The `name` parameter of a part's Content-Disposition (`form-data; name="header"; filename="x"`),
/// unescaped; None when it has none.
fn disposition_name(value: &[u8]) -> Result<Option<String>, Error> {
    let cut = memchr::memchr(b';', value).unwrap_or(value.len());
    let params = parameters(&value[cut..]).ok_or_else(|| {
        Error::Malformed(format!("a part's Content-Disposition {:?} cannot be parsed", String::from_utf8_lossy(value)))
    })?;
    Ok(params.into_iter().find(|(n, _)| n == "name").map(|(_, v)| String::from_utf8_lossy(&v).into_owned()))
}

/// The parameters of a header value after its first `;` (`; a=b; c="d\"e"`): names lowercased (they
/// are case-insensitive), values as sent, quoted strings unescaped. None where they do not parse.
fn parameters(mut s: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    fn skip_space(s: &[u8]) -> &[u8] {
        let n = s.iter().take_while(|&&c| c == b' ' || c == b'\t').count();
        &s[n..]
    }
    let mut out = Vec::new();
    loop {
        s = skip_space(s);
        let Some((&first, after)) = s.split_first() else { return Some(out) };
        if first != b';' {
            return None;
        }
        s = skip_space(after);
        if s.is_empty() {
            return Some(out); // a trailing `;`
        }
        let name_len = s.iter().take_while(|&&c| c != b'=' && c != b';' && c != b' ' && c != b'\t').count();
        if name_len == 0 {
            return None;
        }
        let name = String::from_utf8_lossy(&s[..name_len]).to_ascii_lowercase();
        s = skip_space(&s[name_len..]);
        s = skip_space(s.strip_prefix(b"=")?);
        let mut value = Vec::new();
        if let Some(quoted) = s.strip_prefix(b"\"") {
            // A quoted string: a backslash takes the byte after it as it is.
            let mut i = 0;
            loop {
                match quoted.get(i)? {
                    b'"' => break,
                    b'\\' => {
                        value.push(*quoted.get(i + 1)?);
                        i += 2;
                    }
                    &c => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
            s = &quoted[i + 1..];
        } else {
            let n = s.iter().take_while(|&&c| c != b';' && c != b' ' && c != b'\t').count();
            value.extend_from_slice(&s[..n]);
            s = &s[n..];
        }
        out.push((name, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    type Frames = futures::stream::Iter<std::vec::IntoIter<Result<Bytes, std::io::Error>>>;

    fn reader(frames: &[Bytes], boundary: &str) -> MultipartBody<Frames> {
        let frames: Vec<Result<Bytes, std::io::Error>> = frames.iter().cloned().map(Ok).collect();
        MultipartBody::new(futures::stream::iter(frames), boundary)
    }

    /// A part as read: its name, its bytes, and the pieces they were handed out in.
    struct Read {
        name: Option<String>,
        bytes: Vec<u8>,
        pieces: Vec<Bytes>,
    }

    async fn read_all(frames: &[Bytes], boundary: &str) -> Result<Vec<Read>, Error> {
        let mut body = reader(frames, boundary);
        let mut out = Vec::new();
        while let Some(head) = body.next_part().await? {
            let mut pieces = Vec::new();
            let mut part = body.body();
            while let Some(piece) = part.next().await {
                pieces.push(piece?);
            }
            out.push(Read { name: head.name, bytes: pieces.concat(), pieces });
        }
        Ok(out)
    }

    /// `parts` as RFC 7578 encodes them.
    fn encode(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, bytes) in parts {
            out.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes());
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        out
    }

    /// `body` cut into frames of `size()` bytes, each in an allocation of its own (as a socket's reads
    /// would be), so that a piece handed out can be traced to its frame.
    fn cut(body: &[u8], mut size: impl FnMut() -> usize) -> Vec<Bytes> {
        let mut frames = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let n = size().clamp(1, body.len() - at);
            frames.push(Bytes::from(body[at..at + n].to_vec()));
            at += n;
        }
        frames
    }

    /// Whether `piece` lies within one of `frames` (it was not copied out of them).
    fn within_a_frame(piece: &Bytes, frames: &[Bytes]) -> bool {
        let (p, n) = (piece.as_ptr() as usize, piece.len());
        frames.iter().any(|f| {
            let (s, m) = (f.as_ptr() as usize, f.len());
            p >= s && p + n <= s + m
        })
    }

    /// Bytes that make a delimiter search work: random, with many CR, LF and `-`, and beginnings of the
    /// delimiter that stop short of it (and the boundary after `--` without the CRLF), never the
    /// delimiter itself.
    fn tricky(rng: &mut StdRng, len: usize, boundary: &str) -> Vec<u8> {
        let delimiter = format!("\r\n--{boundary}").into_bytes();
        let mut out = Vec::with_capacity(len + delimiter.len());
        while out.len() < len {
            match rng.random_range(0..12) {
                0..=3 => out.push(rng.random()),
                4 => out.push(b'\r'),
                5 => out.push(b'\n'),
                6 => out.push(b'-'),
                7 => out.extend_from_slice(b"\r\n"),
                8 => out.extend_from_slice(&delimiter[2..]),
                _ => {
                    let k = rng.random_range(1..delimiter.len());
                    out.extend_from_slice(&delimiter[..k]);
                }
            }
        }
        out.truncate(len);
        // A beginning followed by the right bytes may have made a whole delimiter: break it.
        let finder = Finder::new(&delimiter);
        while let Some(at) = finder.find(&out) {
            out[at + 2] = b'x';
        }
        out
    }

    #[tokio::test]
    async fn the_same_parts_whatever_the_frame_cuts() {
        let mut rng = StdRng::seed_from_u64(29);
        for boundary in ["XyZ", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "a'()+_,./:=? b"] {
            let d = boundary.len() + 4;
            let header = b"ENVI\nsamples = 4\nlines = 3\n".to_vec();
            let data = tricky(&mut rng, 20_000, boundary);
            let small = tricky(&mut rng, 3 * d, boundary);
            let almost = [b"\r\n--", &boundary.as_bytes()[..boundary.len() - 1]].concat();
            let parts: [(&str, &[u8]); 7] =
                [("header", &header), ("empty", b""), ("data", &data), ("small", &small), ("cr", b"\r"), ("almost", &almost), ("last", b"-")];
            let body = encode(boundary, &parts);
            let mut cuts: Vec<(String, Vec<Bytes>)> = [1, 2, 3, 7, boundary.len() - 1, boundary.len() + 1, d - 1, d, d + 1, 4096, body.len()]
                .into_iter()
                .map(|n| (format!("frames of {n} bytes"), cut(&body, || n)))
                .collect();
            for seed in 0..40 {
                let mut r = StdRng::seed_from_u64(seed);
                let most = if seed % 2 == 0 { 3 * d } else { 5000 };
                cuts.push((format!("random cuts (seed {seed})"), cut(&body, || r.random_range(1..most))));
            }
            for (how, frames) in &cuts {
                let got = read_all(frames, boundary).await.unwrap_or_else(|e| panic!("{boundary:?}, {how}: {e}"));
                assert_eq!(got.len(), parts.len(), "{boundary:?}, {how}");
                for (read, (name, bytes)) in got.iter().zip(parts) {
                    assert_eq!(read.name.as_deref(), Some(name), "{boundary:?}, {how}");
                    assert!(read.bytes == bytes, "{boundary:?}, {how}: part {name} differs");
                    // Even where a delimiter (or what looks like the start of one) straddles frames,
                    // the bytes handed out are slices of the frames, never copies.
                    for piece in &read.pieces {
                        assert!(!piece.is_empty() && within_a_frame(piece, frames), "{boundary:?}, {how}: a piece of {name} was copied");
                    }
                }
            }
        }
    }

    /// Where no delimiter could begin near a frame's end, each frame's share of the part is handed out
    /// whole, as a slice of it: one piece per frame, pointing into the frame.
    #[tokio::test]
    async fn a_part_body_is_handed_out_as_its_frames() {
        let mut rng = StdRng::seed_from_u64(3);
        let boundary = "hypermnf-7d3c2a19e8b4";
        let data: Vec<u8> = (0..1_000_000).map(|_| rng.random_range(0u8..=255)).map(|b| if b == b'\r' { b'r' } else { b }).collect();
        let body = encode(boundary, &[("header", b"ENVI\n"), ("data", &data)]);
        let start = Finder::new(&data).find(&body).unwrap();
        for size in [4096, 65536, 400 << 10] {
            let frames = cut(&body, || size);
            let got = read_all(&frames, boundary).await.unwrap();
            assert!(got[1].bytes == data);
            let touched = (start + data.len()).div_ceil(size) - start / size;
            assert_eq!(got[1].pieces.len(), touched, "frames of {size}");
            for (i, piece) in got[1].pieces.iter().enumerate() {
                let frame = &frames[start / size + i];
                let (p, s) = (piece.as_ptr() as usize, frame.as_ptr() as usize);
                assert!(p >= s && p + piece.len() <= s + frame.len(), "frames of {size}: piece {i} is not a slice of its frame");
            }
        }
    }

    /// An independent encoder: reqwest's forms (what the tests post), its random boundary, a filename
    /// with quotes and semicolons (which it escapes), an empty name and an empty part.
    #[tokio::test]
    async fn parts_encoded_by_reqwest() {
        use reqwest::multipart::{Form, Part};
        let form = Form::new();
        let boundary = form.boundary().to_string();
        let mut rng = StdRng::seed_from_u64(11);
        let data = tricky(&mut rng, 300_000, &boundary);
        let header = "ENVI\r\nsamples = 4\r\n\r\n--\r\n";
        let form = form
            .text("params", r#"{"components": 3}"#)
            .part("header", Part::text(header).file_name("a \"quoted\"; name=\"data\" \\ name.hdr"))
            .part("data", Part::bytes(data.clone()).file_name("cube.img").mime_str("application/octet-stream").unwrap())
            .part("", Part::bytes(Vec::new()));
        let content_type = format!("multipart/form-data; boundary={boundary}");
        assert_eq!(super::boundary(&content_type).unwrap(), boundary);
        let own: Vec<Bytes> = form.into_stream().map(|f| f.unwrap()).collect().await;
        let whole = own.concat();
        let expected: [(&str, &[u8]); 4] = [("params", br#"{"components": 3}"#), ("header", header.as_bytes()), ("data", &data), ("", b"")];
        let mut cuts = vec![("reqwest's frames".to_string(), own.clone()), ("one frame".into(), vec![Bytes::from(whole.clone())])];
        for seed in 0..8 {
            let mut r = StdRng::seed_from_u64(seed);
            cuts.push((format!("random cuts (seed {seed})"), cut(&whole, || r.random_range(1..200))));
        }
        for (how, frames) in &cuts {
            let got = read_all(frames, &boundary).await.unwrap_or_else(|e| panic!("{how}: {e}"));
            let got: Vec<(Option<&str>, &[u8])> = got.iter().map(|r| (r.name.as_deref(), &r.bytes[..])).collect();
            let want: Vec<(Option<&str>, &[u8])> = expected.iter().map(|&(n, b)| (Some(n), b)).collect();
            assert!(got == want, "{how}: the parts differ");
        }
    }

    #[tokio::test]
    async fn preamble_and_epilogue_are_skipped() {
        let body = b"This is the preamble, --B in it is no boundary.\r\n-- B neither\r\n--B\r\n\
            Content-Disposition: form-data; name=a\r\n\r\nA\r\n--B--\r\nThe epilogue: \r\n--B\r\nnot a part";
        let got = read_all(&cut(body, || 5), "B").await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].name.as_deref(), &got[0].bytes[..]), (Some("a"), &b"A"[..]));
        // The close delimiter at the very end, with nothing after it.
        let got = read_all(&[Bytes::from_static(b"--B\r\n\r\nA\r\n--B--")], "B").await.unwrap();
        assert_eq!((got.len(), &got[0].bytes[..]), (1, &b"A"[..]));
    }

    #[test]
    fn the_boundary_of_a_content_type() {
        for (ct, b) in [
            ("multipart/form-data; boundary=abc", "abc"),
            ("multipart/form-data;boundary=------abc123", "------abc123"),
            ("Multipart/Form-Data; charset=utf-8; BOUNDARY=\"a b:c;d\"", "a b:c;d"),
            ("multipart/form-data; boundary=\"q\\\"uote\"", "q\"uote"),
            ("multipart/form-data ; boundary = x ; other=1", "x"),
        ] {
            assert_eq!(boundary(ct).as_deref(), Ok(b), "{ct}");
        }
        for ct in [
            "",
            "multipart/form-data",
            "multipart/form-data; charset=utf-8",
            "multipart/mixed; boundary=abc",
            "text/plain; boundary=abc",
            "multipart/form-data; boundary=",
            "multipart/form-data; boundary=\"\"",
            "multipart/form-data; boundary=\"unclosed",
            "multipart/form-data; boundary=x\u{e9}",
        ] {
            assert!(matches!(boundary(ct), Err(Error::Malformed(_))), "{ct:?}");
        }
        let long = format!("multipart/form-data; boundary={}", "b".repeat(71));
        assert!(boundary(&long).is_err());
        let longest = format!("multipart/form-data; boundary={}", "b".repeat(70));
        assert_eq!(boundary(&longest).unwrap().len(), 70);
    }

    #[tokio::test]
    async fn transport_padding_after_a_boundary() {
        let body = b"--B \t \r\nContent-Disposition: form-data; name=a\r\n\r\nA\r\n--B\t\r\n\
            Content-Disposition: form-data; name=b\r\n\r\nB\r\n--B--";
        let got = read_all(&cut(body, || 3), "B").await.unwrap();
        let names: Vec<_> = got.iter().map(|r| (r.name.clone().unwrap(), r.bytes.clone())).collect();
        assert_eq!(names, [("a".to_string(), b"A".to_vec()), ("b".to_string(), b"B".to_vec())]);
        // Anything else after a boundary is no boundary line: the data held the boundary.
        for bad in [&b"--B x\r\n\r\nA\r\n--B--"[..], b"--B\r\n\r\nA\r\n--Bx\r\n\r\n\r\n--B--", b"--B\r\n\r\nA\r\n--B-x"] {
            let e = read_all(&[Bytes::from_static(bad)], "B").await.err();
            assert!(matches!(e, Some(Error::Malformed(_))), "{:?}: {e:?}", String::from_utf8_lossy(bad));
        }
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        let whole = encode("B", &[("header", b"ENVI\n"), ("data", b"0123456789")]);
        // Every cut but the one after the close delimiter's `--` (what follows it is the epilogue).
        let end = whole.len() - 2;
        for len in 0..end {
            let frames = cut(&whole[..len], || 4);
            let e = read_all(&frames, "B").await.err();
            assert!(matches!(e, Some(Error::Interrupted(_))), "cut at {len}: {e:?}");
        }
        // In a part's body, the bytes before the cut come out, then the error: never a shorter part.
        let cut_short = &whole[..whole.len() - 10];
        let mut body = reader(&[Bytes::copy_from_slice(cut_short)], "B");
        body.next_part().await.unwrap();
        body.next_part().await.unwrap();
        let mut part = body.body();
        assert_eq!(part.next().await.unwrap().unwrap(), Bytes::from_static(b"012345678"));
        let e = part.next().await.unwrap().unwrap_err();
        assert_eq!(e.to_string(), "the body was cut short: it ended within a part");
        assert_eq!(body.next_part().await, Err(e));
        // A frame that cannot be received ends the part with its error.
        let frames: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(Bytes::from_static(b"--B\r\n\r\nAB")), Err(std::io::Error::other("connection reset"))];
        let mut body = MultipartBody::new(futures::stream::iter(frames), "B");
        body.next_part().await.unwrap();
        let mut part = body.body();
        assert_eq!(part.next().await.unwrap().unwrap(), Bytes::from_static(b"AB"));
        let e = part.next().await.unwrap().unwrap_err();
        assert!(matches!(&e, Error::Interrupted(m) if m.contains("connection reset")), "{e:?}");
    }

    #[tokio::test]
    async fn a_body_without_its_boundary() {
        let body = encode("B", &[("data", b"x")]);
        let e = read_all(&cut(&body, || 7), "C").await.err();
        assert!(matches!(&e, Some(Error::Interrupted(m)) if m.contains("before its first boundary")), "{e:?}");
        // Not read to its end: refused after PREAMBLE_MAX bytes.
        let frames = vec![Bytes::from(vec![b'x'; PREAMBLE_MAX + 1]), Bytes::from(body)];
        let e = read_all(&frames, "C").await.err();
        assert!(matches!(&e, Some(Error::Malformed(m)) if m.contains("no boundary")), "{e:?}");
    }

    #[tokio::test]
    async fn a_header_block_too_long() {
        let long = format!("--B\r\nContent-Disposition: form-data; name=a\r\nX-Long: {}\r\n\r\nA\r\n--B--", "y".repeat(HEADERS_MAX));
        let e = read_all(&cut(long.as_bytes(), || 1000), "B").await.err();
        assert!(matches!(&e, Some(Error::Malformed(m)) if m.contains("more than 16384 bytes")), "{e:?}");
        let padded = format!("--B{}\r\n\r\nA\r\n--B--", " ".repeat(HEADERS_MAX));
        let e = read_all(&[Bytes::from(padded)], "B").await.err();
        assert!(matches!(&e, Some(Error::Malformed(m)) if m.contains("boundary line")), "{e:?}");
        let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
        let e = read_all(&[Bytes::from(format!("--B\r\n{many}\r\nA\r\n--B--"))], "B").await.err();
        assert!(matches!(&e, Some(Error::Malformed(m)) if m.contains("cannot be parsed")), "{e:?}");
        let bad = read_all(&[Bytes::from_static(b"--B\r\nNo colon here\r\n\r\nA\r\n--B--")], "B").await.err();
        assert!(matches!(bad, Some(Error::Malformed(_))), "{bad:?}");
    }

    #[tokio::test]
    async fn part_names() {
        for (headers, name) in [
            ("Content-Disposition: form-data; name=\"data\"\r\n", Some("data")),
            ("content-disposition: form-data; name=data\r\n", Some("data")),
            ("CONTENT-DISPOSITION: Form-Data; NAME=\"header\"; filename=\"h.hdr\"\r\n", Some("header")),
            ("Content-Disposition: form-data; filename=\"x\\\"; name=\\\"evil\"; name=\"params\"\r\n", Some("params")),
            ("Content-Disposition: form-data; name=\"a\\\\b\\\"c\"\r\n", Some("a\\b\"c")),
            ("Content-Disposition: form-data; name=\"\"\r\n", Some("")),
            ("Content-Type: text/plain\r\nContent-Disposition: form-data;name=\"x;y\" \r\n", Some("x;y")),
            ("Content-Disposition: form-data\r\n", None),
            ("Content-Disposition: form-data; filename=\"cube.img\"\r\n", None),
            ("Content-Type: application/octet-stream\r\n", None),
            ("", None),
        ] {
            let body = format!("--B\r\n{headers}\r\nbody\r\n--B--\r\n");
            let got = read_all(&cut(body.as_bytes(), || 2), "B").await.unwrap_or_else(|e| panic!("{headers:?}: {e}"));
            assert_eq!((got[0].name.as_deref(), &got[0].bytes[..]), (name, &b"body"[..]), "{headers:?}");
        }
        for headers in ["Content-Disposition: form-data; name=\"unclosed\r\n", "Content-Disposition: form-data; name\r\n"] {
            let body = format!("--B\r\n{headers}\r\nbody\r\n--B--\r\n");
            let e = read_all(&[Bytes::from(body)], "B").await.err();
            assert!(matches!(&e, Some(Error::Malformed(m)) if m.contains("Content-Disposition")), "{headers:?}: {e:?}");
        }
    }

    #[tokio::test]
    async fn an_unread_part_body_is_skipped() {
        let mut rng = StdRng::seed_from_u64(5);
        let big = tricky(&mut rng, 50_000, "B");
        let body = encode("B", &[("a", &big), ("b", b"second"), ("c", &big), ("d", b"fourth")]);
        let frames = cut(&body, || 999);
        let mut reader = reader(&frames, "B");
        assert_eq!(reader.next_part().await.unwrap().unwrap().name.as_deref(), Some("a"));
        assert_eq!(reader.next_part().await.unwrap().unwrap().name.as_deref(), Some("b"));
        let second: Vec<Bytes> = reader.body().map(Result::unwrap).collect().await;
        assert_eq!(second.concat(), b"second");
        assert_eq!(reader.next_part().await.unwrap().unwrap().name.as_deref(), Some("c"));
        // Read in part, then left.
        let mut part = reader.body();
        assert!(!part.next().await.unwrap().unwrap().is_empty());
        assert_eq!(reader.next_part().await.unwrap().unwrap().name.as_deref(), Some("d"));
        assert_eq!(reader.next_part().await.unwrap(), None);
        assert_eq!(reader.next_part().await.unwrap(), None);
        // After the close delimiter, a part's body is empty.
        assert!(reader.body().next().await.is_none());
    }
}
