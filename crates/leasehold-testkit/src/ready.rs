//! Waiting for a freshly started server, and starting one on a free port.

use std::fmt;
use std::time::{Duration, Instant};

use crate::process::ServerProcess;

/// How many ports a first start tries before giving up.
const START_ATTEMPTS: usize = 4;

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

/// Starts a server on a port from `pick_port` and waits until `ready`. If it exits because
/// its port was taken meanwhile (`port_taken`, read from its log: a race between parallel
/// test processes), tries another port, up to 4 in all. Panics with `logs()` otherwise.
pub(crate) fn start_on_free_port(
    what: &str,
    mut pick_port: impl FnMut() -> u16,
    mut spawn: impl FnMut(u16) -> ServerProcess,
    mut ready: impl FnMut(&ServerProcess, u16) -> Result<(), ReadyError>,
    port_taken: impl Fn() -> bool,
    logs: impl Fn() -> String,
) -> (ServerProcess, u16) {
    for attempt in 1..=START_ATTEMPTS {
        let port = pick_port();
        let process = spawn(port);
        match ready(&process, port) {
            Ok(()) => return (process, port),
            Err(e) => {
                drop(process);
                if e == ReadyError::Exited && attempt < START_ATTEMPTS && port_taken() {
                    tracing::warn!(port, attempt, "{what} port taken: retrying on another port");
                    continue;
                }
                panic!("{what} on port {port} {e}\n{}", logs());
            }
        }
    }
    unreachable!("the last start attempt either returns or panics")
}
