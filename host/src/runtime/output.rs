//! Guest stdout and stderr, turned into log lines tagged with plugin, dispatch and attempt.

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

impl AsyncWrite for LineWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.buffer.extend_from_slice(buf);
        while let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=pos).collect();
            self.emit(&line[..line.len() - 1]);
        }
        if self.buffer.len() > MAX_LOG_LINE {
            let line = std::mem::take(&mut self.buffer);
            self.emit(&line);
        }
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
