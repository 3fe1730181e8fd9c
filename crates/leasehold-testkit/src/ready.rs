//! Waiting for a freshly started server.

use std::fmt;
use std::time::{Duration, Instant};

use crate::process::ServerProcess;

/// Why a server did not get ready.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadyError {
    /// The process exited first.
    Exited,
    /// It did not answer within this long.
    Timeout(Duration),
}

impl fmt::Display for ReadyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadyError::Exited => f.write_str("exited before it was ready"),
            ReadyError::Timeout(d) => write!(f, "did not answer within {d:?}"),
        }
    }
}

/// Polls `answers` every `interval` until it returns true, the process exits, or `timeout`
/// passes.
pub(crate) fn wait_ready(
    process: &ServerProcess,
    timeout: Duration,
    interval: Duration,
    mut answers: impl FnMut() -> bool,
) -> Result<(), ReadyError> {
    let deadline = Instant::now() + timeout;
    loop {
        if !process.is_running() {
            return Err(ReadyError::Exited);
        }
        if answers() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ReadyError::Timeout(timeout));
        }
        std::thread::sleep(interval);
    }
}
