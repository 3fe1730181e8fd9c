//! `leasehold run` tells its command how the lease is doing: a file it can read
//! (`LEASEHOLD_HEALTH_FILE`), and with `--at-risk-signal` a signal at each change between
//! held and at risk.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use leasehold::{Health, Lease};
use nix::sys::signal::Signal;

/// `--at-risk-signal`: a signal name (`USR1`, `SIGUSR1`, `usr1`) or number. Not one that
/// cannot be handled (KILL, STOP) or that job control owns (TSTP, TTIN, TTOU, CONT).
pub(crate) fn parse_signal(s: &str) -> Result<Signal, String> {
    let upper = s.trim().to_ascii_uppercase();
    let sig = if let Ok(n) = upper.parse::<i32>() {
        Signal::try_from(n).map_err(|_| format!("{s:?} is not a signal number"))?
    } else {
        let name = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        Signal::from_str(&name).map_err(|_| format!("{s:?} is not a signal name (e.g. USR1)"))?
    };
    match sig {
        Signal::SIGKILL | Signal::SIGSTOP => Err(format!(
            "{sig} cannot be handled by the command: choose one it can catch (e.g. USR1)"
        )),
        Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU | Signal::SIGCONT => Err(format!(
            "{sig} belongs to job control: choose another (e.g. USR1)"
        )),
        sig => Ok(sig),
    }
}

/// The line the health file holds: `held`, `at_risk <deadline, Unix ms>` or
/// `lost <reason>`.
pub(crate) fn line(health: Health, unix_ms_at: impl Fn(tokio::time::Instant) -> u128) -> String {
    match health {
        Health::AtRisk { deadline, .. } => format!("at_risk {}\n", unix_ms_at(deadline)),
        Health::Lost(reason) => format!("lost {}\n", reason.as_str()),
        other => format!("{}\n", other.as_str()),
    }
}

/// The health file and the last health written to it.
pub(crate) struct HealthFile {
    /// Removed with everything in it when `run` ends.
    dir: tempfile::TempDir,
    path: PathBuf,
    last: &'static str,
    signal: Option<Signal>,
}

impl HealthFile {
    /// Makes the file (in a private directory of its own), saying `held`.
    pub(crate) fn create(signal: Option<Signal>) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-run-")
            .tempdir()?;
        let path = dir.path().join("health");
        let file = Self {
            dir,
            path,
            last: "held",
            signal,
        };
        file.write("held\n")?;
        Ok(file)
    }

    /// The path to give the command (`LEASEHOLD_HEALTH_FILE`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Brings the file up to `health`; returns the signal to send to the command when the
    /// change is one between held and at risk (the file already says which).
    pub(crate) fn update(
        &mut self,
        lease: &Lease,
        unix_ms_at: impl Fn(tokio::time::Instant) -> u128,
    ) -> Option<Signal> {
        let health = lease.health();
        let now = health.as_str();
        if now == self.last {
            return None;
        }
        if let Err(e) = self.write(&line(health, unix_ms_at)) {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot write the health file");
        }
        let was = std::mem::replace(&mut self.last, now);
        tracing::info!(from = was, to = now, "lease health changed");
        // A loss is told by the stop that follows (SIGTERM), not by this signal.
        if health.is_held() { self.signal } else { None }
    }

    /// Replaces the file's content at once (a reader sees the old line or the new one).
    fn write(&self, text: &str) -> std::io::Result<()> {
        let tmp = self.dir.path().join(".health.new");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_taken_by_name_or_number_and_the_unusable_ones_refused() {
        for s in ["USR1", "SIGUSR1", "usr1", " usr1 ", "10"] {
            assert_eq!(parse_signal(s), Ok(Signal::SIGUSR1), "{s}");
        }
        assert_eq!(parse_signal("hup"), Ok(Signal::SIGHUP));
        for s in ["KILL", "9", "STOP", "TSTP", "CONT", "TTIN", "TTOU"] {
            assert!(parse_signal(s).is_err(), "{s} must be refused");
        }
        for s in ["", "USR3", "0", "-1", "99999999999", "SIG", "\u{0}"] {
            assert!(parse_signal(s).is_err(), "{s:?} must be refused");
        }
    }

    #[test]
    fn the_file_says_each_state_on_one_line() {
        let at = tokio::time::Instant::now();
        let ms = |_| 1_700_000_000_123u128;
        assert_eq!(line(Health::Held, ms), "held\n");
        assert_eq!(
            line(
                Health::AtRisk {
                    since: at,
                    deadline: at
                },
                ms
            ),
            "at_risk 1700000000123\n"
        );
        assert_eq!(
            line(Health::Lost(leasehold::LostReason::NotOwner), ms),
            "lost not_owner\n"
        );
    }
}
