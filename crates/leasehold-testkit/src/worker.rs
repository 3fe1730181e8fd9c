//! [`WorkerProcess`]: a separate OS process (e.g. a lease-holding worker)
//! whose stdout is captured line by line.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::ServerProcess;
use crate::util;

#[derive(Debug, Default)]
struct Lines {
    lines: Vec<String>,
    closed: bool,
}

#[derive(Debug, Default)]
struct Output {
    state: Mutex<Lines>,
    changed: Condvar,
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A child process run by a test, e.g. a worker holding a lease, that the
/// test can pause (`SIGSTOP`), resume, signal and kill on its own.
///
/// Its stdout is read by a background thread into a shared list of lines
/// (without the line terminator; invalid UTF-8 is replaced). Its stderr is
/// left as configured on the command (inherited by default, so it shows up in
/// the test output). Dropping it kills the process and everything it forked.
#[derive(Debug)]
pub struct WorkerProcess {
    process: ServerProcess,
    output: Arc<Output>,
}

impl WorkerProcess {
    /// The command that runs the current test binary again with only the test `test`
    /// selected (`TEST --exact --nocapture --test-threads=1 -q`), so that a test can be its
    /// own worker process: add the worker's settings to the environment, and have `test`
    /// run the worker instead of its body when it finds them.
    ///
    /// # Panics
    ///
    /// Panics if the path of the current executable cannot be read.
    pub fn test_command(test: &str) -> Command {
        let exe = std::env::current_exe()
            .unwrap_or_else(|e| panic!("cannot find the current test binary: {e}"));
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "-q"]);
        cmd
    }

    /// Spawns `cmd` with stdin closed and stdout captured.
    ///
    /// # Panics
    ///
    /// Panics if the command cannot be spawned.
    pub fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let description = util::describe_command(&cmd);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn worker `{description}`: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let output = Arc::new(Output::default());
        let reader_output = Arc::clone(&output);
        let pid = child.id();
        std::thread::Builder::new()
            .name(format!("worker-{pid}-stdout"))
            .spawn(move || read_lines(stdout, &reader_output))
            .unwrap_or_else(|e| panic!("cannot spawn the stdout reader thread: {e}"));
        tracing::debug!(pid, cmd = %description, "worker spawned");
        let name = format!("worker {} (pid {pid})", cmd.get_program().to_string_lossy());
        Self {
            process: ServerProcess::from_child(name, child),
            output,
        }
    }

    /// The worker's PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the worker has not exited yet (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Whether the worker is paused.
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// Stops the worker and its descendants with `SIGSTOP`.
    pub fn pause(&self) {
        self.process.pause();
        crate::proof::record(crate::proof::Injected::WorkerPaused);
    }

    /// Continues the worker and its descendants with `SIGCONT`.
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Kills the worker and its descendants with `SIGKILL` and waits for it.
    pub fn kill(&self) {
        self.process.kill();
        crate::proof::record(crate::proof::Injected::WorkerKilled);
    }

    /// Sends `sig` to the worker process only.
    ///
    /// # Panics
    ///
    /// Panics if the worker has exited.
    pub fn signal(&self, sig: Signal) {
        self.process.signal(sig);
        match sig {
            Signal::SIGSTOP => crate::proof::record(crate::proof::Injected::WorkerPaused),
            Signal::SIGKILL => crate::proof::record(crate::proof::Injected::WorkerKilled),
            _ => {}
        }
    }

    /// Waits up to `timeout` for the worker to exit.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_timeout(timeout)
    }

    /// The exit status, if the worker has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.process.exit_status()
    }

    /// All stdout lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.output.lock().lines.clone()
    }

    /// How many stdout lines have been read so far.
    pub fn line_count(&self) -> usize {
        self.output.lock().lines.len()
    }

    /// Whether the worker's stdout has reached its end.
    pub fn stdout_closed(&self) -> bool {
        self.output.lock().closed
    }

    /// Waits up to `timeout` for a stdout line matching `predicate` (lines
    /// already read count too) and returns the first one. `None` on timeout,
    /// or as soon as stdout is closed without a match.
    pub fn wait_for_line(
        &self,
        predicate: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        self.wait_for_line_from(0, predicate, timeout)
            .map(|(_, line)| line)
    }

    /// Like [`wait_for_line`](Self::wait_for_line) but only considers lines
    /// with index `>= start`; returns the matching line's index too (pass
    /// `index + 1` to wait for the next match).
    pub fn wait_for_line_from(
        &self,
        start: usize,
        mut predicate: impl FnMut(&str) -> bool,
        timeout: Duration,
    ) -> Option<(usize, String)> {
        let deadline = Instant::now() + timeout;
        let mut next = start;
        let mut state = self.output.lock();
        loop {
            while next < state.lines.len() {
                if predicate(&state.lines[next]) {
                    return Some((next, state.lines[next].clone()));
                }
                next += 1;
            }
            if state.closed {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            state = self
                .output
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn read_lines(stdout: std::process::ChildStdout, output: &Output) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                }
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                let line = String::from_utf8_lossy(&buf).into_owned();
                output.lock().lines.push(line);
                output.changed.notify_all();
            }
        }
    }
    output.lock().closed = true;
    output.changed.notify_all();
}
