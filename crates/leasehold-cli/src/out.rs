//! Standard output that its reader may close early (`leasehold list | head`): a closed
//! pipe ends the output quietly, never a panic; any other write error is exit 74.

use std::io::Write;
use std::process::ExitCode;

use crate::failure::Failure;

/// Writes `text` to standard output: a closed pipe (`| head`) ends quietly, any other
/// error is exit 74.
pub(crate) fn print(text: &str) -> Result<ExitCode, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(Failure::Output(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}

/// Writes `text` to standard output: `Ok(true)` when its reader has closed the pipe (the
/// caller stops writing), any other error is exit 74.
pub(crate) fn print_or_closed(text: &str) -> Result<bool, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(true),
        Err(e) => Err(Failure::Output(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}
