//! Small helpers shared by the server launchers: binary lookup, temporary
//! directories, running a command with a timeout, asking a server on a port,
//! polling, log tails and the `/proc` process tree.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::unistd::User;
use tempfile::TempDir;

/// Directories searched in addition to `$PATH` (CI environments sometimes run
/// with a `PATH` that lacks the `sbin` directories where `mariadbd` lives).
const EXTRA_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Finds an executable by name, panicking with an install hint when it is missing.
pub(crate) fn find_binary(name: &str, package: &str) -> PathBuf {
    try_find_binary(name).unwrap_or_else(|| panic!("{name} not found: install package {package}"))
}

/// Finds an executable by name in `$PATH` and a few standard directories.
pub(crate) fn try_find_binary(name: &str) -> Option<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A new temporary directory `PREFIX…` in `$TMPDIR`.
pub(crate) fn temp_dir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temporary directory {prefix}…: {e}"))
}

/// A new temporary directory `/tmp/PREFIX…` owned by the OS user `name` (who comes with
/// `package`), and that user. In /tmp rather than `$TMPDIR`: the user must be able to
/// reach it, and socket paths in it must stay short.
pub(crate) fn temp_dir_owned_by(prefix: &str, name: &str, package: &str) -> (TempDir, User) {
    let user = User::from_name(name)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("OS user {name} not found: install package {package}"));
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap_or_else(|e| panic!("cannot create a temporary directory /tmp/{prefix}…: {e}"));
    chown(tmp.path(), &user);
    (tmp, user)
}

/// Gives `path` to `user` (and the user's group).
pub(crate) fn chown(path: &Path, user: &User) {
    std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
        .unwrap_or_else(|e| panic!("cannot chown {} to {}: {e}", path.display(), user.name));
}

/// Runs a command to completion with captured stdout/stderr, killing it and
/// panicking if it does not finish within `timeout`.
pub(crate) fn run_with_timeout(cmd: &mut Command, timeout: Duration, what: &str) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run {what} ({:?}): {e}", cmd.get_program()));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what} did not finish within {timeout:?}: {}",
                    describe_command(cmd)
                );
            }
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("waiting for {what} failed: {e}"),
        }
    };
    // A grandchild that inherited the pipes could keep them open: do not wait
    // for the readers forever.
    let stdout = join_with_timeout(out_thread, Duration::from_secs(5));
    let stderr = join_with_timeout(err_thread, Duration::from_secs(5));
    Output {
        status,
        stdout,
        stderr,
    }
}

fn join_with_timeout(handle: thread::JoinHandle<Vec<u8>>, timeout: Duration) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    while !handle.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    if handle.is_finished() {
        handle.join().unwrap_or_default()
    } else {
        Vec::new()
    }
}

/// Renders a command line for error messages.
pub(crate) fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&shell_quote(arg));
    }
    s
}

fn shell_quote(arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c))
    {
        arg.into_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// Sends `request` to 127.0.0.1:`port` and reads the answer, up to `limit` bytes, until the
/// server closes the connection or `complete` says the answer is whole; `None` when nothing
/// answered.
pub(crate) fn ask(
    port: u16,
    request: &[u8],
    limit: usize,
    complete: impl Fn(&[u8]) -> bool,
) -> Option<Vec<u8>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    stream.write_all(request).ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    while answer.len() < limit && !complete(&answer) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    answer.truncate(limit);
    (!answer.is_empty()).then_some(answer)
}

/// Formats a finished command's output for a panic message.
pub(crate) fn describe_output(out: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end()
    )
}

/// Returns the last `max` bytes of a log file (or a note that it is missing).
pub(crate) fn log_tail(path: &Path, max: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
            if start > 0 {
                format!("[... {start} bytes cut ...]\n{text}")
            } else {
                text
            }
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Reads a whole log file as (lossy) UTF-8; empty when missing.
pub(crate) fn read_log(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Polls `probe` every `interval` until it returns `Some`, or `timeout` passes.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(interval);
    }
}

/// Parses `/proc/<pid>/stat` into `(state, ppid)`.
pub(crate) fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or
    // parentheses: the fields after the *last* ')' are well-formed.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All live descendants of `root` (children first, then grandchildren, ...).
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some((state, ppid)) = proc_stat(pid)
                && state != 'Z'
                && state != 'X'
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(pid) = frontier.pop() {
        if let Some(kids) = children.get(&pid) {
            for &kid in kids {
                if kid != root && !out.contains(&kid) {
                    out.push(kid);
                    frontier.push(kid);
                }
            }
        }
    }
    out
}

/// Whether a process exists and is not a zombie.
pub(crate) fn is_alive(pid: i32) -> bool {
    matches!(proc_stat(pid), Some((state, _)) if state != 'Z' && state != 'X')
}

/// Every rendering of an error a user may see — `Display`, `Debug`, and both of every
/// source in its chain — in one text, for tests that check that no password or key line
/// shows in any of them.
pub fn renderings(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("{e}\n{e:?}\n");
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(&format!("{s}\n{s:?}\n"));
        src = s.source();
    }
    out
}
