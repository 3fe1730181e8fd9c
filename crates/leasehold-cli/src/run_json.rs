//! `leasehold run --json`: one line of JSON on standard output when `run` ends, after
//! everything the command printed, so a script can tell the command's own exit status
//! from leasehold's (both share the process's exit status) and learn the fence it ran
//! under. The format is documented in `docs/cli.md`.

use std::time::Instant;

use serde::Serialize;

use crate::failure::Failure;

/// What `run` learned on its way; printed as the result object.
#[derive(Debug, Serialize)]
pub(crate) struct Facts {
    /// The key as given.
    key: String,
    /// `completed` (the command ran to its end under the lease; `exit_code` is its
    /// status), `completed_after_loss` (it ran to its end, but its end was seen only after
    /// the lease was lost: check the work), or what leasehold failed at: `usage`,
    /// `store_error`, `not_acquired`, `lost_before_start`, `lease_lost`, `cannot_execute`,
    /// `internal`.
    outcome: &'static str,
    /// The process's exit status.
    exit_code: u8,
    /// The command's own exit status when it ran to its end (`completed`,
    /// `completed_after_loss`); `None` otherwise.
    command_exit_code: Option<u8>,
    /// The fence the command ran under, if the lease was acquired.
    fence: Option<u64>,
    /// The owner token (hex), if the lease was acquired.
    owner: Option<String>,
    /// How long the lease was held, in milliseconds, if it was acquired.
    held_ms: Option<u64>,
    /// Whether the lease was released at the end (false: not acquired, already lost, or
    /// left to expire because processes of the command could not be confirmed gone).
    released: bool,
    /// With `--hold-at-least`: until when (Unix ms) the lease is left in the store, which
    /// then expires it; `None` otherwise.
    left_until_ms: Option<u64>,
    /// leasehold's one-line error, if it failed.
    error: Option<String>,
    #[serde(skip)]
    acquired_at: Option<Instant>,
}

impl Facts {
    pub(crate) fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            outcome: "completed",
            exit_code: 0,
            command_exit_code: None,
            fence: None,
            owner: None,
            held_ms: None,
            released: false,
            left_until_ms: None,
            error: None,
            acquired_at: None,
        }
    }

    /// The lease was acquired.
    pub(crate) fn acquired(&mut self, fence: u64, owner: String) {
        self.fence = Some(fence);
        self.owner = Some(owner);
        self.acquired_at = Some(Instant::now());
    }

    /// The lease was left in the store until `unix_ms` (`--hold-at-least`).
    pub(crate) fn left_until(&mut self, unix_ms: u128) {
        self.left_until_ms = Some(u64::try_from(unix_ms).unwrap_or(u64::MAX));
    }

    /// The hold ended; `released` tells whether the store confirmed the release.
    pub(crate) fn ended(&mut self, released: bool) {
        self.released = released;
        self.held_ms = self
            .acquired_at
            .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX));
    }

    /// Prints the result object for `result` (the command's status, or the failure).
    pub(crate) fn print(mut self, result: &Result<u8, Failure>) {
        match result {
            Ok(code) => {
                self.exit_code = *code;
                self.command_exit_code = Some(*code);
            }
            Err(failure) => {
                self.exit_code = failure.code();
                self.outcome = outcome(failure);
                self.error = Some(failure.to_string());
                if let Failure::CompletedAfterLoss { status, .. } = failure {
                    self.command_exit_code = Some(*status);
                }
            }
        }
        if self.held_ms.is_none() && self.acquired_at.is_some() {
            self.ended(false);
        }
        let line = serde_json::to_string(&self).expect("serializable");
        // A closed standard output changes nothing: the exit status says it all.
        let _ = crate::out::print(&format!("{line}\n"));
    }
}

/// The `outcome` of a failure.
fn outcome(failure: &Failure) -> &'static str {
    match failure {
        Failure::Usage(_) | Failure::BadUrl(_) | Failure::Memory | Failure::PasswordFile(_) => {
            "usage"
        }
        Failure::Store(_) if failure.code() == crate::exit::USAGE => "usage",
        Failure::Store(_) => "store_error",
        Failure::NotAcquired { .. } => "not_acquired",
        Failure::LeaseLost(_) => "lease_lost",
        Failure::CompletedAfterLoss { .. } => "completed_after_loss",
        Failure::LostBeforeStart(_) => "lost_before_start",
        Failure::CannotExecute(_) => "cannot_execute",
        // `run` never fails so: only `doctor --require` does.
        Failure::CannotCreate(_)
        | Failure::Output(_)
        | Failure::Internal(_)
        | Failure::NotHolding(_) => "internal",
    }
}
