//! `leasehold man` and `leasehold install-completions`: one man page, leasehold(1), that
//! covers every subcommand, and the command that installs it with the shell completions.
//!
//! One page rather than one per subcommand (`leasehold-run(1)`, …): the subcommands share
//! the global options, the store URLs and the exit statuses, `man leasehold` then shows
//! all of it, and installing is one file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Command};
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use crate::failure::Failure;

/// What `man leasehold` says about the exit status of every subcommand.
const EXIT_STATUS: &str = "\
Every subcommand exits 0 when it did its work; leasehold run exits with the command's own
status (128+N if it was killed by signal N). Otherwise, leasehold's own statuses, taken
from sysexits.h as flock(1) does:
  64  bad usage: flags, key, durations, a store URL that cannot be opened as given,
      memory://; run: a --grace not below half the TTL the store granted
  69  store error: unreachable, no answer in time, authentication, permissions
  70  run: the lease was lost while the command ran; the command was stopped
  71  run: the command ended, but its end was seen only after the lease was lost or its
      validity deadline passed: it may have run on without the lease; check its work
  72  run: the lease was lost before the command could start; it was not started
  73  install-completions: a file could not be created
  74  man, completions: standard output could not be written
  75  run: not acquired (held by another owner past --wait, or at once with --no-wait);
      --conflict-exit-code changes it
  126 run: the command could not be started
A status from leasehold itself comes with exactly one line on standard error, starting
with \"leasehold: \". `leasehold run --json` tells the command's status apart from
leasehold's own (see docs/cli.md).";

const ENVIRONMENT: &str = "\
LEASEHOLD_STORE   the store URL when --store is not given
LEASEHOLD_LOG     the log filter when --log is not given (RUST_LOG works too)
XDG_STATE_HOME    where the default SQLite database lives (leasehold/leases.db)
XDG_DATA_HOME     where install-completions writes (default ~/.local/share)
The command run by `leasehold run` gets LEASEHOLD_KEY, LEASEHOLD_FENCE, LEASEHOLD_OWNER,
LEASEHOLD_VALID_UNTIL (Unix ms) and LEASEHOLD_HEALTH_FILE (a file saying held, at_risk
or lost) in its environment.";

/// Arguments of `leasehold install-completions`.
#[derive(Debug, Args)]
pub(crate) struct InstallArgs {
    /// Install completions for this shell only (repeatable; default: bash, zsh and fish).
    #[arg(long, value_enum)]
    shell: Vec<Shell>,
    /// The data directory to install under (default: $XDG_DATA_HOME, else ~/.local/share).
    #[arg(long, value_name = "DATA_DIR")]
    data_dir: Option<PathBuf>,
}

/// The man page of `cmd` (the whole `leasehold` command), as roff.
pub(crate) fn render(cmd: Command) -> String {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let man = Man::new(cmd.clone())
        .title("LEASEHOLD")
        .manual("User Commands")
        .source(format!("leasehold {}", env!("CARGO_PKG_VERSION")));
    let mut page = Vec::new();
    let rendered = man
        .render_title(&mut page)
        .and_then(|()| man.render_name_section(&mut page))
        .and_then(|()| man.render_synopsis_section(&mut page))
        .and_then(|()| man.render_description_section(&mut page))
        .and_then(|()| man.render_options_section(&mut page));
    rendered.expect("writing to a Vec cannot fail");
    let mut roff = Roff::new();
    roff.control("SH", ["COMMANDS"]);
    let globals: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().to_string())
        .collect();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let mut sub = sub.clone();
        // The global options are described once, above.
        for id in &globals {
            sub = sub.mut_arg(id, |a| a.hide(true));
        }
        let name = format!("leasehold {}", sub.get_name());
        roff.control("SS", [name.as_str()]);
        roff.text([roman(
            sub.get_about().map(|a| a.to_string()).unwrap_or_default(),
        )]);
        flush(&mut roff, &mut page);
        // Its synopsis and options, as paragraphs of this subsection.
        let sub_man = Man::new(sub.clone());
        let mut section = Vec::new();
        let rendered = sub_man
            .render_synopsis_section(&mut section)
            .and_then(|()| sub_man.render_options_section(&mut section));
        rendered.expect("writing to a Vec cannot fail");
        for line in String::from_utf8_lossy(&section).lines() {
            if line.starts_with(".SH") {
                page.extend_from_slice(b".PP\n");
            } else {
                page.extend_from_slice(line.as_bytes());
                page.push(b'\n');
            }
        }
        if let Some(after) = sub.get_after_long_help().or_else(|| sub.get_after_help()) {
            roff.control("PP", []);
            preformatted(&mut roff, &after.to_string());
        }
    }
    roff.control("SH", ["EXIT STATUS"]);
    preformatted(&mut roff, EXIT_STATUS);
    roff.control("SH", ["ENVIRONMENT"]);
    preformatted(&mut roff, ENVIRONMENT);
    if let Some(after) = cmd.get_after_help() {
        roff.control("SH", ["EXAMPLES"]);
        preformatted(&mut roff, &after.to_string());
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([
        bold("flock"),
        roman("(1), "),
        bold("timeout"),
        roman("(1); docs/cli.md and docs/operations.md in the leasehold repository"),
    ]);
    flush(&mut roff, &mut page);
    // Every rendering starts with the same two-line preamble (defining the apostrophe
    // string); the page needs it once, at the top.
    let page = String::from_utf8_lossy(&page).into_owned();
    let mut seen = std::collections::HashSet::new();
    page.lines()
        .filter(|l| {
            !(l.starts_with(".ie \\n(.g .ds Aq") || l.starts_with(".el .ds Aq")) || seen.insert(*l)
        })
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .chars()
        .map(|c| {
            // groff reads ASCII; any other character as its escape, e.g. `\[u2026]`.
            if c.is_ascii() {
                c.to_string()
            } else {
                format!("\\[u{:04X}]", u32::from(c))
            }
        })
        .collect()
}

/// Appends what `roff` holds to `page` and empties it.
fn flush(roff: &mut Roff, page: &mut Vec<u8>) {
    page.extend_from_slice(roff.render().as_bytes());
    *roff = Roff::new();
}

/// `text` as preformatted lines (no filling), escaped.
fn preformatted(roff: &mut Roff, text: &str) {
    roff.control("nf", []);
    for line in text.lines() {
        roff.text([roman(line)]);
    }
    roff.control("fi", []);
}

/// The completion script of `shell`.
pub(crate) fn completions(shell: Shell, cmd: &mut Command) -> String {
    let mut buf = Vec::new();
    clap_complete::generate(shell, cmd, "leasehold", &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// `leasehold install-completions`: the man page and the completions, each where its
/// reader looks for it under the data directory.
pub(crate) fn install(args: &InstallArgs, mut cmd: Command) -> Result<ExitCode, Failure> {
    let data = match &args.data_dir {
        Some(d) => d.clone(),
        None => default_data_dir().ok_or_else(|| {
            Failure::Usage("neither XDG_DATA_HOME nor HOME is set: give --data-dir".into())
        })?,
    };
    let shells = if args.shell.is_empty() {
        vec![Shell::Bash, Shell::Zsh, Shell::Fish]
    } else {
        args.shell.clone()
    };
    write(&data.join("man/man1/leasehold.1"), &render(cmd.clone()))?;
    for shell in shells {
        let path = match shell {
            Shell::Bash => "bash-completion/completions/leasehold",
            Shell::Zsh => "zsh/site-functions/_leasehold",
            Shell::Fish => "fish/vendor_completions.d/leasehold.fish",
            Shell::Elvish => "elvish/lib/leasehold.elv",
            Shell::PowerShell => "powershell/leasehold.ps1",
            _ => return Err(Failure::Usage(format!("cannot install for {shell}"))),
        };
        write(&data.join(path), &completions(shell, &mut cmd))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn default_data_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
}

/// Writes `text` to `path` (creating its directory) and prints the path.
fn write(path: &Path, text: &str) -> Result<(), Failure> {
    let cannot =
        |e: std::io::Error| Failure::CannotCreate(format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    std::fs::write(path, text).map_err(cannot)?;
    // The file is written; a closed standard output (`| head -1`) changes nothing.
    let _ = crate::out::print(&format!("{}\n", path.display()));
    Ok(())
}
