//! Guest stdout and stderr, turned into log lines tagged with plugin, dispatch and attempt
//! (and scrubbed of the plugin's secrets, as every guest line is: see `host::log`).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::bindings::Level;
use super::host::{GuestState, LogState, MAX_LOG_LINE};

/// One of a guest's output streams.
#[derive(Debug, Clone)]
pub struct GuestOutput {
    plugin: String,
    stream: &'static str,
    log: Arc<Mutex<LogState>>,
}

impl GuestOutput {
    /// The `stream` ("stdout" or "stderr") of an instance of `plugin`.
    pub fn new(plugin: String, stream: &'static str, log: Arc<Mutex<LogState>>) -> Self {
        GuestOutput {
            plugin,
            stream,
            log,
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineWriter {
            out: self.clone(),
            buffer: Vec::new(),
        })
    }
}

struct LineWriter {
    out: GuestOutput,
    buffer: Vec<u8>,
}

impl LineWriter {
    fn emit(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let level = if self.out.stream == "stderr" {
            Level::Warn
        } else {
            Level::Info
        };
        GuestState::emit(
            &self.out.log,
            &self.out.plugin,
            level,
            text.trim_end_matches('\r'),
        );
    }
}

impl LineWriter {
    /// Takes `buf`: every complete line goes out, and a line too long to wait for its end.
    fn take(&mut self, buf: &[u8]) {
        self.buffer.extend_from_slice(buf);
        while let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=pos).collect();
            self.emit(&line[..line.len() - 1]);
        }
        if self.buffer.len() > MAX_LOG_LINE {
            // A line too long to wait for its end goes out now, but not the bytes at its end
            // that may begin a secret: they start the next piece, where the whole secret is
            // scrubbed. (What they hold back is shorter than the plugin's longest secret.)
            let held = self
                .out
                .log
                .lock()
                .map(|log| log.secrets.unfinished(&self.buffer))
                .unwrap_or(0);
            if held < self.buffer.len() {
                let rest = self.buffer.split_off(self.buffer.len() - held);
                let line = std::mem::replace(&mut self.buffer, rest);
                self.emit(&line);
            }
        }
    }
}

impl AsyncWrite for LineWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.take(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.buffer.is_empty() {
            let line = std::mem::take(&mut self.buffer);
            self.emit(&line);
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.buffer.is_empty() {
            let line = std::mem::take(&mut self.buffer);
            self.emit(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::runtime::host::Secrets;

    /// The log lines `write` produces, as the text log shows them.
    fn logged(secrets: &[&str], write: impl FnOnce(&mut LineWriter)) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let log = Arc::new(Mutex::new(LogState {
                secrets: Arc::new(Secrets::new(secrets.iter().copied())),
                ..LogState::default()
            }));
            let mut out = LineWriter {
                out: GuestOutput::new("p".into(), "stdout", log),
                buffer: Vec::new(),
            };
            write(&mut out);
        });
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_secret_in_a_line_or_across_writes_is_scrubbed() {
        let secret = "sk-live-0123456789abcdef";
        let log = logged(&[secret], |out| {
            out.take(b"one sk-live-01");
            out.take(b"23456789abcdef two\n");
        });
        assert!(log.contains("one [redacted] two"), "{log}");
        assert!(!log.contains("sk-live"), "{log}");
    }

    #[test]
    fn a_secret_cut_by_a_long_line_is_scrubbed_in_the_next_piece() {
        let secret = "sk-live-0123456789abcdef";
        // The line passes MAX_LOG_LINE while the secret is half written.
        let pad = "x".repeat(MAX_LOG_LINE - 4);
        let log = logged(&[secret], |out| {
            out.take(format!("{pad}sk-live-0").as_bytes());
            out.take(b"123456789abcdef end\n");
        });
        assert!(!log.contains("sk-live"), "{log}");
        assert!(log.contains("[redacted] end"), "{log}");
        // Without the secret the same bytes go out at the cut, as before.
        let log = logged(&[], |out| {
            out.take(format!("{pad}sk-live-0").as_bytes());
            out.take(b"123456789abcdef end\n");
        });
        assert!(log.contains("xsk-l"), "{log}");
    }
}
