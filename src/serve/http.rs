//! HTTP/1.1 framing over a `TcpStream`: reading one request (head parsed
//! by `httparse`, body by `Content-Length`) and writing one response, with
//! keep-alive.
//!
//! Bounds: the head may hold at most `max_header_bytes` (else 431) and 64
//! headers; the body at most `max_body_bytes` (else 413, decided from
//! `Content-Length` before a byte of the body is read). Chunked bodies are
//! refused (411): every client this server is for sends a length.
//!
//! The socket has a short read timeout so that a connection thread notices
//! shutdown between reads; an idle connection is closed after the idle
//! timeout, and at shutdown once it has no request in progress.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::ApiError;

/// How often a blocked read wakes up to look at the stop flag.
pub const TICK: Duration = Duration::from_millis(50);

/// Most headers in a request.
const MAX_HEADERS: usize = 64;

/// A request, read whole.
#[derive(Debug)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The body's bytes.
    pub body: Vec<u8>,
    /// The client asked to close after this request (or speaks HTTP/1.0
    /// without keep-alive).
    pub close: bool,
}

/// A response to write.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// `application/json` or Prometheus' `text/plain; version=0.0.4`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON body.
    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type: "application/json",
            body,
        }
    }

    /// `{"error": message}` with the error's status.
    pub fn error(e: &ApiError) -> Response {
        let body = serde_json::to_vec(&serde_json::json!({ "error": e.message }))
            .unwrap_or_else(|_| b"{\"error\":\"\"}".to_vec());
        Response::json(e.status, body)
    }
}

/// What reading a request gave.
pub enum Incoming {
    /// A request.
    Request(Request),
    /// The client closed the connection, it idled out, or the server stops
    /// and no request had begun.
    Closed,
    /// A request the server refuses before reading it all; answer and close.
    Refused(ApiError),
}

/// Reads requests from one connection; `buf` keeps bytes of a pipelined
/// next request.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Limits and timeouts of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: usize,
    pub idle_timeout: Duration,
}

impl Connection {
    /// Wraps an accepted stream.
    pub fn new(stream: TcpStream) -> io::Result<Connection> {
        stream.set_read_timeout(Some(TICK))?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buf: Vec::with_capacity(8 << 10),
        })
    }

    /// Reads the next request.
    pub fn read_request(&mut self, limits: &Limits, stop: &AtomicBool) -> io::Result<Incoming> {
        let idle_since = Instant::now();
        let head_len = loop {
            if let Some(n) = head_end(&self.buf).filter(|&n| n <= limits.max_header_bytes) {
                break n;
            }
            if self.buf.len() > limits.max_header_bytes {
                return Ok(Incoming::Refused(ApiError::new(
                    431,
                    format!(
                        "request head: over {} bytes (request line and headers)",
                        limits.max_header_bytes
                    ),
                )));
            }
            // Nothing of a request yet: the connection may close on stop or idle.
            let waiting = self.buf.is_empty();
            if waiting
                && (stop.load(Ordering::SeqCst) || idle_since.elapsed() > limits.idle_timeout)
            {
                return Ok(Incoming::Closed);
            }
            if !waiting && idle_since.elapsed() > limits.idle_timeout {
                return Ok(Incoming::Refused(ApiError::new(
                    408,
                    "request head: incomplete after the idle timeout",
                )));
            }
            if !self.fill()? {
                return Ok(Incoming::Closed);
            }
        };
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        let head = match parsed.parse(&self.buf[..head_len]) {
            Ok(httparse::Status::Complete(_)) => head_of(&parsed),
            Ok(httparse::Status::Partial) => {
                return Ok(Incoming::Refused(ApiError::bad_request(
                    "request head: incomplete",
                )));
            }
            Err(e) => {
                return Ok(Incoming::Refused(ApiError::bad_request(format!(
                    "request head: not HTTP/1.1 ({e})"
                ))));
            }
        };
        let head = match head {
            Ok(head) => head,
            Err(e) => return Ok(Incoming::Refused(e)),
        };
        if head.length > limits.max_body_bytes {
            return Ok(Incoming::Refused(ApiError::new(
                413,
                format!(
                    "body: {} bytes; the server takes at most {}",
                    head.length, limits.max_body_bytes
                ),
            )));
        }
        self.buf.drain(..head_len);
        let started = Instant::now();
        while self.buf.len() < head.length {
            if started.elapsed() > limits.idle_timeout {
                return Ok(Incoming::Refused(ApiError::new(
                    408,
                    format!(
                        "body: {} of {} bytes after the idle timeout",
                        self.buf.len(),
                        head.length
                    ),
                )));
            }
            if !self.fill()? {
                return Ok(Incoming::Closed);
            }
        }
        let rest = self.buf.split_off(head.length);
        let body = std::mem::replace(&mut self.buf, rest);
        Ok(Incoming::Request(Request {
            method: head.method,
            path: head.path,
            body,
            close: head.close,
        }))
    }

    /// Reads what is there into `buf`; `false` at end of stream. A timeout
    /// is not an error (the caller checks its clocks and flags).
    fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 << 10];
        match self.stream.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// After a refusal: stops writing, and reads (and drops) what the client
    /// still sends for a moment, so that closing does not reset the
    /// connection before the client has read the answer.
    pub fn linger_close(mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut drained = 0usize;
        while Instant::now() < deadline && drained < 8 << 20 {
            self.buf.clear();
            match self.fill() {
                Ok(true) => drained += self.buf.len(),
                _ => return,
            }
        }
    }

    /// Writes `response`; `close` adds `Connection: close`.
    pub fn write_response(&mut self, response: &Response, close: bool) -> io::Result<()> {
        self.stream.write_all(&encode_response(response, close))?;
        self.stream.flush()
    }
}

/// The client side of one exchange on `stream`: sends a request of
/// `body` and reads the response whole (head, then `Content-Length`
/// bytes). Returns the status. For the server's own warm-up through its
/// listener ([`super::server`]); the stream's read timeout bounds each
/// read.
pub(crate) fn exchange(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    body: &[u8],
) -> io::Result<u16> {
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out)?;
    let mut buf = Vec::with_capacity(out.len().max(8 << 10));
    let mut chunk = vec![0u8; 64 << 10];
    let mut read_more = |buf: &mut Vec<u8>| match stream.read(&mut chunk)? {
        0 => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        n => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    };
    let (head, status, length) = loop {
        if let Some(end) = head_end(&buf) {
            let (status, length) = response_head(&buf[..end])?;
            break (end, status, length);
        }
        read_more(&mut buf)?;
    };
    while buf.len() < head + length {
        read_more(&mut buf)?;
    }
    Ok(status)
}

/// A response head's status and `Content-Length` (0 when absent).
fn response_head(head: &[u8]) -> io::Result<(u16, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    parsed
        .parse(head)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let length = parsed
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0);
    Ok((parsed.code.unwrap_or(0), length))
}

/// `response` as the bytes on the wire; `close` adds `Connection: close`.
pub fn encode_response(response: &Response, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(response.body.len() + 160);
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len(),
        if close { "Connection: close\r\n" } else { "" }
    );
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&response.body);
    out
}

/// The end of the head (after `\r\n\r\n`), when the buffer holds it all.
fn head_end(buf: &[u8]) -> Option<usize> {
    memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4)
}

struct Head {
    method: String,
    path: String,
    length: usize,
    close: bool,
}

fn head_of(parsed: &httparse::Request<'_, '_>) -> Result<Head, ApiError> {
    let method = parsed.method.unwrap_or("").to_string();
    let target = parsed.path.unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    let mut length = 0usize;
    let mut close = parsed.version == Some(0);
    for h in parsed.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        let value = value.trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            match value.parse::<usize>() {
                Ok(n) => length = n,
                Err(_) => {
                    return Err(ApiError::bad_request(format!(
                        "Content-Length: {value:?} is not a length"
                    )));
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ApiError::new(
                411,
                format!("Transfer-Encoding {value:?}: not supported; send Content-Length"),
            ));
        } else if h.name.eq_ignore_ascii_case("connection") {
            let value = value.to_ascii_lowercase();
            if value.contains("close") {
                close = true;
            } else if value.contains("keep-alive") {
                close = false;
            }
        }
    }
    Ok(Head {
        method,
        path,
        length,
        close,
    })
}

/// The reason phrase of the statuses this server sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_ends_at_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }
}
