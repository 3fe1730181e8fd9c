//! The `after_help` of the subcommands other than `run` and `demo`: an example and the
//! exit statuses, the same as the table in `docs/cli.md` (a test compares them).

/// `leasehold inspect`.
pub(crate) const INSPECT: &str = "\
With --json, one line: {\"key\":...,\"held\":true|false,\"lease\":{\"key\",\"owner\",\"fence\",\"remaining_ms\"}|null}.

Exit status:
  0   printed (the lease may be held or free: see \"held\")
  64  bad usage (flags, key, a bad store URL: scheme, host, port, parameters;
      memory://; an unusable --store-password-file)
  69  store error (unreachable, no answer within 10s, refused credentials, no
      such database, no privilege, an unusable SQLite file, missing tables)

Example:
  leasehold inspect nightly-invoices --json";

/// `leasehold list`.
pub(crate) const LIST: &str = "\
With --json, one line: an array of {\"key\",\"owner\",\"fence\",\"remaining_ms\"}.

Exit status:
  0   printed (possibly nothing)
  64  bad usage, or a bad store URL
  69  store error (unreachable, no answer within 10s, refused credentials, no
      such database, no privilege, an unusable SQLite file, missing tables)

Example:
  leasehold list job:";

/// `leasehold break`.
pub(crate) const BREAK: &str = "\
With --json, one line: {\"key\":...,\"fence\":N,\"evicted\":{...}|null}.

Exit status:
  0   broken (or there was no holder); the fence was advanced
  64  bad usage, key, or a bad store URL
  69  store error (unreachable, no answer within 10s, refused credentials, no
      such database, no privilege, an unusable SQLite file, missing tables)

Example:
  leasehold break nightly-invoices";

/// `leasehold completions`.
pub(crate) const COMPLETIONS: &str = "\
Exit status:
  0   printed
  64  bad usage (unknown shell)
  74  standard output could not be written

Example:
  leasehold completions bash > ~/.local/share/bash-completion/completions/leasehold";

/// `leasehold man`.
pub(crate) const MAN: &str = "\
One page, leasehold(1), covers every subcommand.

Exit status:
  0   printed
  64  bad usage
  74  standard output could not be written

Example:
  leasehold man > ~/.local/share/man/man1/leasehold.1";

/// `leasehold install-completions`.
pub(crate) const INSTALL: &str = "\
Writes, under DATA_DIR (default $XDG_DATA_HOME, else ~/.local/share):
  man/man1/leasehold.1                      the man page (man finds it when ~/.local/bin
                                            is on PATH)
  bash-completion/completions/leasehold     bash (loaded on demand by bash-completion)
  zsh/site-functions/_leasehold             zsh (add the directory to fpath)
  fish/vendor_completions.d/leasehold.fish  fish
and prints each path written.

Exit status:
  0   installed
  64  bad usage
  73  a file or directory could not be created

Example:
  leasehold install-completions --shell bash";
