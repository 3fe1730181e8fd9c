//! [`ServerProcess`]: a child process (and the processes it forked) that a
//! test can pause, resume, signal and kill, and that is killed on drop.

use std::fs::OpenOptions;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, Once};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{self, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::util;

#[derive(Debug)]
struct State {
    child: Child,
    status: Option<ExitStatus>,
    paused: bool,
}

impl State {
    /// Reaps the child if it has exited. While this returns `false` the PID
    /// still belongs to our (possibly zombie) child, so signalling it is safe.
    fn exited(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status.is_some()
    }
}

/// A process started by the harness as its direct child.
///
/// Control methods act on the whole process tree: [`pause`](Self::pause)
/// stops the process and every process it forked (a PostgreSQL postmaster's
/// backends, a shell's children), [`kill`](Self::kill) kills them all. Signals
/// are never sent once the child has been reaped, so a recycled PID is never
/// hit. Dropping a `ServerProcess` kills the tree with `SIGKILL` and waits.
///
/// All methods take `&self`, so a server can be shared between threads.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    pid: u32,
    state: Mutex<State>,
}

impl ServerProcess {
    /// Spawns `cmd` with stdin closed and stdout and stderr appended to `log`.
    ///
    /// # Panics
    ///
    /// Panics if the log file cannot be opened or the command cannot be spawned.
    pub fn spawn(name: impl Into<String>, mut cmd: Command, log: &Path) -> Self {
        let name = name.into();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{name}: cannot open log file {}: {e}", log.display()));
        let err_file = file
            .try_clone()
            .unwrap_or_else(|e| panic!("{name}: cannot clone log file handle: {e}"));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err_file));
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{name}: failed to spawn `{}`: {e}",
                util::describe_command(&cmd)
            )
        });
        tracing::debug!(name = %name, pid = child.id(), cmd = %util::describe_command(&cmd), "spawned");
        Self::from_child(name, child)
    }

    /// Wraps an already spawned child process.
    pub fn from_child(name: impl Into<String>, child: Child) -> Self {
        Self {
            name: name.into(),
            pid: child.id(),
            state: Mutex::new(State {
                child,
                status: None,
                paused: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn nix_pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.pid).expect("pid fits in i32"))
    }

    /// The name given at spawn time (used in messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process ID of the direct child.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the child has not exited yet (a paused child is running).
    pub fn is_running(&self) -> bool {
        !self.lock().exited()
    }

    /// Whether [`pause`](Self::pause) was called without a later
    /// [`resume`](Self::resume).
    pub fn is_paused(&self) -> bool {
        let mut st = self.lock();
        st.paused && !st.exited()
    }

    /// The exit status, if the child has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut st = self.lock();
        st.exited();
        st.status
    }

    /// Stops the process and all its descendants with `SIGSTOP`, and waits
    /// until they have all stopped.
    ///
    /// # Panics
    ///
    /// Panics if the process has exited.
    pub fn pause(&self) {
        let mut st = self.lock();
        self.assert_running(&mut st, "pause");
        let pid = self.nix_pid();
        // Stop the parent first so that it cannot fork while we walk the tree.
        send(pid, Signal::SIGSTOP);
        let descendants = util::descendants(pid.as_raw());
        for &child in &descendants {
            send(Pid::from_raw(child), Signal::SIGSTOP);
        }
        st.paused = true;
        // Signal delivery is asynchronous: return only once every process
        // has actually stopped, so the caller's next step sees a frozen server.
        let all_stopped =
            util::poll_until(Duration::from_secs(10), Duration::from_millis(1), || {
                std::iter::once(pid.as_raw())
                .chain(descendants.iter().copied())
                .all(|p| !matches!(util::proc_stat(p), Some((state, _)) if !"TtZX".contains(state)))
                .then_some(())
            });
        if all_stopped.is_none() {
            tracing::warn!(name = %self.name, pid = self.pid, "not every process stopped within 10 s");
        }
        tracing::debug!(name = %self.name, pid = self.pid, "paused");
    }

    /// Continues the process and all its descendants with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// Panics if the process has exited.
    pub fn resume(&self) {
        let mut st = self.lock();
        self.assert_running(&mut st, "resume");
        let pid = self.nix_pid();
        for child in util::descendants(pid.as_raw()) {
            send(Pid::from_raw(child), Signal::SIGCONT);
        }
        send(pid, Signal::SIGCONT);
        st.paused = false;
        tracing::debug!(name = %self.name, pid = self.pid, "resumed");
    }

    /// Sends `sig` to the direct child only.
    ///
    /// # Panics
    ///
    /// Panics if the process has exited.
    pub fn signal(&self, sig: Signal) {
        let mut st = self.lock();
        self.assert_running(&mut st, "signal");
        send(self.nix_pid(), sig);
        match sig {
            Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU => {
                st.paused = true;
            }
            Signal::SIGCONT => st.paused = false,
            _ => {}
        }
    }

    /// Kills the process and all its descendants with `SIGKILL` and waits for
    /// the child. Does nothing if it has already exited.
    pub fn kill(&self) {
        let mut st = self.lock();
        if st.exited() {
            return;
        }
        let pid = self.nix_pid();
        become_subreaper();
        // Freeze the parent so it cannot fork (or reap and reuse PIDs) while
        // we collect its descendants.
        send(pid, Signal::SIGSTOP);
        let descendants = util::descendants(pid.as_raw());
        for &child in &descendants {
            send(Pid::from_raw(child), Signal::SIGKILL);
        }
        send(pid, Signal::SIGKILL);
        match st.child.wait() {
            Ok(status) => st.status = Some(status),
            Err(e) => panic!("{}: waiting for pid {} failed: {e}", self.name, self.pid),
        }
        st.paused = false;
        drop(st);
        reap_orphans(&descendants, Duration::from_secs(10));
        tracing::debug!(name = %self.name, pid = self.pid, "killed");
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut st = self.lock();
                if st.exited() {
                    return st.status;
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `sig` (after `SIGCONT` if paused) and waits up to `timeout` for
    /// the child to exit; kills the tree with `SIGKILL` if it does not.
    /// Returns `true` if it exited by itself.
    pub fn terminate(&self, sig: Signal, timeout: Duration) -> bool {
        {
            let mut st = self.lock();
            if st.exited() {
                return true;
            }
            if st.paused {
                let pid = self.nix_pid();
                for child in util::descendants(pid.as_raw()) {
                    send(Pid::from_raw(child), Signal::SIGCONT);
                }
                send(pid, Signal::SIGCONT);
                st.paused = false;
            }
            send(self.nix_pid(), sig);
        }
        if self.wait_timeout(timeout).is_some() {
            true
        } else {
            tracing::warn!(name = %self.name, pid = self.pid, ?sig, ?timeout, "did not exit in time: killing");
            self.kill();
            false
        }
    }

    fn assert_running(&self, st: &mut State, what: &str) {
        if st.exited() {
            panic!(
                "{}: cannot {what}: process {} has exited ({})",
                self.name,
                self.pid,
                st.status.map(|s| s.to_string()).unwrap_or_default()
            );
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn send(pid: Pid, sig: Signal) {
    // ESRCH: the process is already gone (a zombie can still be signalled).
    if let Err(e) = signal::kill(pid, sig)
        && e != Errno::ESRCH
    {
        tracing::warn!(%pid, ?sig, error = %e, "kill failed");
    }
}

/// Makes this process the reaper of orphaned descendants, so that a process
/// tree killed by [`ServerProcess::kill`] leaves no zombies behind even where
/// PID 1 does not reap.
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::debug!(error = %e, "PR_SET_CHILD_SUBREAPER failed");
        }
    });
}

/// Waits for (and reaps, when they were reparented to us) the given killed
/// processes.
fn reap_orphans(pids: &[i32], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<i32> = pids.to_vec();
    while !pending.is_empty() {
        pending.retain(|&pid| {
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => true,
                Ok(_) => false,
                // Not our child (its parent is still alive and reaps it, or it
                // was reparented elsewhere): done once it is dead or a zombie.
                Err(_) => util::is_alive(pid),
            }
        });
        if pending.is_empty() || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    if !pending.is_empty() {
        tracing::warn!(?pending, "killed processes still present");
    }
}
