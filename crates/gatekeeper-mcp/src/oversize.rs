//! A stdio server's answers larger than the gate reads (`max_result_mib`): told, not lost.
//!
//! rmcp's stdio transport drops a line longer than its cap without a word, so a call whose
//! answer is too large used to wait for its deadline and end as "outcome unknown". The
//! gate reads the server's stdout through [`Capped`] instead: each line is passed on whole
//! while it fits; a line that grows past the cap is read to its end and dropped, and in
//! its place comes an answer of the gate's own to the same request id (found at the start
//! of the line, where servers write it): a tool result with `isError` that says how large
//! the answer was and what the limit is. So a read fails at once with the reason, and a
//! send is recorded as applied with that note (the tool ran; only its answer was not read).
//! A line whose id cannot be found is dropped with a warning, and its request ends at its
//! deadline as before.

use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, ReadBuf};
use tracing::warn;

/// How much of an oversized line is kept to find its id.
const HEAD_BYTES: usize = 512;
/// How much is read from the server at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// A server's stdout, with each line capped at `limit` bytes.
pub struct Capped<R> {
    inner: R,
    limit: usize,
    /// The server, for messages.
    server: String,
    /// The line being read, while it fits.
    line: Vec<u8>,
    /// The start and length of a line that did not fit, while it is being skipped.
    skipping: Option<(Vec<u8>, usize)>,
    /// Bytes ready for the reader, and how many of them it took.
    out: Vec<u8>,
    taken: usize,
    eof: bool,
    /// Where the server's output is read into.
    buffer: Vec<u8>,
}

impl<R> Capped<R> {
    /// `inner` with every line over `limit` bytes replaced by the gate's answer.
    pub fn new(inner: R, limit: usize, server: impl Into<String>) -> Self {
        Self {
            inner,
            limit,
            server: server.into(),
            line: Vec::new(),
            skipping: None,
            out: Vec::new(),
            taken: 0,
            eof: false,
            buffer: vec![0; CHUNK_BYTES],
        }
    }

    /// Take `chunk` of the server's output into lines.
    fn take(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let (segment, ends) = match chunk.iter().position(|b| *b == b'\n') {
                Some(at) => (&chunk[..at], true),
                None => (chunk, false),
            };
            chunk = &chunk[segment.len() + usize::from(ends)..];
            if let Some((head, total)) = &mut self.skipping {
                let room = HEAD_BYTES.saturating_sub(head.len());
                head.extend_from_slice(&segment[..segment.len().min(room)]);
                *total += segment.len();
            } else if self.line.len() + segment.len() > self.limit {
                let mut head = std::mem::take(&mut self.line);
                let total = head.len() + segment.len();
                head.truncate(HEAD_BYTES);
                let room = HEAD_BYTES.saturating_sub(head.len());
                head.extend_from_slice(&segment[..segment.len().min(room)]);
                self.skipping = Some((head, total));
            } else {
                self.line.extend_from_slice(segment);
            }
            if ends {
                self.end_line();
            }
        }
    }

    /// A line ended: pass it on, or the gate's answer in place of one that did not fit.
    fn end_line(&mut self) {
        if let Some((head, total)) = self.skipping.take() {
            match request_id(&head) {
                Some(id) => {
                    warn!(server = %self.server, bytes = total, limit = self.limit, "downstream.answer.too-large: answered in its place");
                    let answer = too_large(id, total, self.limit);
                    self.out.extend_from_slice(answer.to_string().as_bytes());
                    self.out.push(b'\n');
                }
                None => {
                    warn!(server = %self.server, bytes = total, limit = self.limit, "downstream.answer.too-large: no request id found in it, dropped; its request ends at its deadline");
                }
            }
            return;
        }
        self.out.append(&mut self.line);
        self.out.push(b'\n');
    }
}

/// The id of the JSON-RPC response that starts with `head`, when it names one there.
fn request_id(head: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(head);
    let at = text.find("\"id\"")? + 4;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    match values.next()? {
        Ok(id @ (Value::Number(_) | Value::String(_))) => Some(id),
        _ => None,
    }
}

/// The gate's answer in place of one of `bytes` bytes, over `limit`.
fn too_large(id: Value, bytes: usize, limit: usize) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "content": [{
                "type": "text",
                "text": format!(
                    "(The server's answer was {bytes} bytes, over the {limit} bytes the gate reads in one message, so it was not read. A person can raise max_result_mib in the server's [[server]] table.)"
                )
            }],
            "isError": true
        }
    })
}

impl<R: AsyncRead + Unpin> AsyncRead for Capped<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.out.len() {
                let n = (this.out.len() - this.taken).min(buf.remaining());
                buf.put_slice(&this.out[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.out.len() {
                    this.out.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut buffer = std::mem::take(&mut this.buffer);
            let mut read = ReadBuf::new(&mut buffer);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            let filled = read.filled().len();
            match polled {
                Poll::Pending => {
                    this.buffer = buffer;
                    return Poll::Pending;
                }
                Poll::Ready(Err(error)) => {
                    this.buffer = buffer;
                    return Poll::Ready(Err(error));
                }
                Poll::Ready(Ok(())) if filled == 0 => {
                    this.eof = true;
                    // A last line without its newline is passed on as it is.
                    if this.skipping.is_none() && !this.line.is_empty() {
                        this.out.append(&mut this.line);
                    }
                }
                Poll::Ready(Ok(())) => this.take(&buffer[..filled]),
            }
            this.buffer = buffer;
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;

    use super::*;

    async fn through(input: &[u8], limit: usize) -> String {
        let mut capped = Capped::new(input, limit, "s");
        let mut out = String::new();
        capped.read_to_string(&mut out).await.expect("reads");
        out
    }

    #[tokio::test]
    async fn lines_that_fit_pass_whole_and_one_that_does_not_is_answered_by_the_gate() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}}}",
            "x".repeat(200)
        );
        let input = format!("{{\"a\":1}}\n{big}\n{{\"b\":2}}\n");
        let out = through(input.as_bytes(), 100).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0], "{\"a\":1}");
        assert_eq!(lines[2], "{\"b\":2}");
        let answer: Value = serde_json::from_str(lines[1]).expect("json");
        assert_eq!(answer["id"], 7);
        assert_eq!(answer["result"]["isError"], true);
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .expect("text");
        assert!(
            text.starts_with(&format!(
                "(The server's answer was {} bytes, over the 100 bytes",
                big.len()
            )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_line_without_an_id_at_its_start_is_dropped_and_the_rest_passes() {
        let big = format!("{{\"result\":\"{}\",\"id\":1}}", "y".repeat(1000));
        let out = through(format!("{big}\nnext\n").as_bytes(), 100).await;
        assert_eq!(out, "next\n");
    }

    #[tokio::test]
    async fn a_string_id_and_a_last_line_without_its_newline_are_kept() {
        let big = format!("{{\"id\": \"r-1\", \"result\": \"{}\"}}", "z".repeat(500));
        let out = through(format!("{big}\ntail").as_bytes(), 100).await;
        let mut lines = out.lines();
        let answer: Value = serde_json::from_str(lines.next().expect("answer")).expect("json");
        assert_eq!(answer["id"], "r-1");
        assert_eq!(lines.next(), Some("tail"));
    }
}
