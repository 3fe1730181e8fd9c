//! Issue 27 item 2: the README's first program, pasted into a new project, builds and runs.
//!
//! The test does what the README tells a new user to do. It makes a new cargo project in a
//! temporary directory and writes the README's `Cargo.toml` and `src/main.rs` blocks into
//! it as they stand; each block is found by the HTML comment `<!-- readme-example: NAME -->`
//! on the line above its fence. The one change is the `leasehold` dependency: the README's
//! git dependency on the repository (the workspace's `repository` URL) becomes a path
//! dependency on this checkout. Then `cargo run --offline`, twice. Each run prints what the
//! README's `output` block shows, numbers aside. The second run's fence is higher than the
//! first's.
//!
//! It is cheap because it reuses the workspace's build. It copies the workspace's
//! `Cargo.lock` (the same versions, nothing to resolve), builds in the workspace's target
//! directory, and gives the project the workspace's `[profile.*]` tables as its
//! `.cargo/config.toml` (the profile is part of each artifact's identity). Only the crates
//! whose features differ from the workspace build are compiled again. The number of crates
//! compiled is printed (`--nocapture` shows it).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/<name> sits two levels below the root")
        .to_path_buf()
}

/// A fenced code block: its info string (`toml`, `rust,no_run`, …) and its text.
#[derive(Debug)]
struct Block {
    info: String,
    text: String,
}

/// The blocks of `md` that follow a `<!-- readme-example: NAME -->` line, by NAME.
fn marked_blocks(md: &str) -> BTreeMap<String, Block> {
    let mut blocks = BTreeMap::new();
    let mut lines = md.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .trim()
            .strip_prefix("<!-- readme-example:")
            .and_then(|rest| rest.strip_suffix("-->"))
            .map(str::trim)
        else {
            continue;
        };
        let fence = lines
            .by_ref()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("`readme-example: {name}` is followed by nothing"));
        let info = fence
            .strip_prefix("```")
            .unwrap_or_else(|| panic!("`readme-example: {name}` is not followed by a ``` fence"));
        let mut text = String::new();
        for l in lines.by_ref().take_while(|l| l.trim_end() != "```") {
            text.push_str(l);
            text.push('\n');
        }
        let previous = blocks.insert(
            name.to_owned(),
            Block {
                info: info.trim().to_owned(),
                text,
            },
        );
        assert!(previous.is_none(), "two blocks marked `{name}`");
    }
    blocks
}

/// The value of `key = "…"` on a line of its own in `toml` (the first one).
fn toml_string(toml: &str, key: &str) -> Option<String> {
    toml.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(key)?.trim_start().strip_prefix('=')?;
        Some(rest.trim().trim_matches('"').to_owned())
    })
}

/// The workspace manifest's `[profile.*]` tables, as the text of a cargo configuration file.
fn profile_tables(manifest: &str) -> String {
    let mut out = String::new();
    let mut in_profile = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_profile = t.starts_with("[profile.");
        }
        if in_profile {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `line` with every run of digits replaced by `N`.
fn without_numbers(line: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// Whether rustdoc would hide `line` (`# code` or a lone `#`): GitHub shows it as written.
fn is_hidden_line(line: &str) -> bool {
    let t = line.trim_start();
    t == "#" || t.starts_with("# ")
}

/// What a finished `cargo` gave.
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `cargo args` in `dir`, building in `target`, stopped after `limit`.
fn cargo(dir: &Path, target: &Path, args: &[&str], limit: Duration) -> Ran {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_TERM_COLOR", "never")
        .env("CARGO_TERM_PROGRESS_WHEN", "never")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cargo starts");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cargo {args:?} still running after {limit:?}:\n{}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ran {
        success: status.success(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The fence a run printed: the number on its line that names the fence.
fn fence_of(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.split_once("fence ").map(|(_, n)| n))
        .and_then(|n| n.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fence in the program's output:\n{stdout}"))
}

#[test]
fn the_readmes_first_program_builds_and_runs_in_a_new_project() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = marked_blocks(&readme);
    let block = |name: &str| {
        blocks
            .get(name)
            .unwrap_or_else(|| panic!("README.md has no block marked `readme-example: {name}`"))
    };
    let (manifest, main, output) = (block("Cargo.toml"), block("src/main.rs"), block("output"));
    assert_eq!(manifest.info, "toml");
    assert_eq!(output.info, "text");
    // Highlighted as Rust on GitHub, compiled by the crate's doctests (`no_run`: it would
    // open a database file in the doctest's directory).
    assert_eq!(main.info, "rust,no_run");

    // A complete program, as GitHub shows it: no line that only rustdoc hides.
    let hidden: Vec<&str> = main.text.lines().filter(|l| is_hidden_line(l)).collect();
    assert!(
        hidden.is_empty(),
        "the README's first program has lines rustdoc hides and GitHub shows: {hidden:?}"
    );
    assert!(
        main.text.contains("fn main()"),
        "no `fn main()`:\n{}",
        main.text
    );

    // The one change: the git dependency on the repository becomes a path dependency.
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let repository = toml_string(&workspace, "repository").expect("workspace repository URL");
    let git = format!("git = \"{repository}\"");
    let dependency: Vec<&str> = manifest
        .text
        .lines()
        .filter(|l| l.trim_start().starts_with("leasehold ="))
        .collect();
    assert!(
        dependency.len() == 1 && dependency[0].contains(&git),
        "the README's Cargo.toml must depend on leasehold with `{git}` (nothing is published \
         yet), on one line:\n{}",
        manifest.text
    );
    let crate_dir = root.join("crates/leasehold");
    let path = crate_dir.to_str().expect("a UTF-8 checkout path");
    assert!(!path.contains(['"', '\\']), "{path}");
    let cargo_toml = manifest.text.replace(&git, &format!("path = \"{path}\""));

    let project = tempfile::tempdir().expect("a temporary directory");
    let dir = project.path();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join(".cargo")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), cargo_toml).unwrap();
    std::fs::write(dir.join("src/main.rs"), &main.text).unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::write(dir.join(".cargo/config.toml"), profile_tables(&workspace)).unwrap();

    // The workspace's target directory (`CARGO_TARGET_TMPDIR` is `<target>/tmp`).
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory");
    let limit = Duration::from_secs(15 * 60);
    let mut fences = Vec::new();
    for attempt in 1..=2 {
        let started = Instant::now();
        let ran = cargo(dir, target, &["run", "--offline"], limit);
        let compiled: Vec<&str> = ran
            .stderr
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("Compiling "))
            .filter_map(|c| c.split_whitespace().next())
            .collect();
        eprintln!(
            "run {attempt}: {} crates compiled in {:.1} s {compiled:?}",
            compiled.len(),
            started.elapsed().as_secs_f64()
        );
        assert!(
            ran.success,
            "`cargo run` of the README's first program failed:\n{}\n--- stdout ---\n{}",
            ran.stderr, ran.stdout
        );
        let printed: Vec<String> = ran.stdout.lines().map(without_numbers).collect();
        let promised: Vec<String> = output.text.lines().map(without_numbers).collect();
        assert_eq!(
            printed, promised,
            "the program's output differs from the README's output block:\n{}",
            ran.stdout
        );
        fences.push(fence_of(&ran.stdout));
    }
    assert!(
        fences[1] > fences[0],
        "the second run's fence is not higher: {fences:?}"
    );
}

#[test]
fn checker_finds_marked_blocks_and_hidden_lines() {
    let md = "text\n<!-- readme-example: a.toml -->\n\n```toml\nx = 1\n```\n\
              <!-- readme-example: main -->\n```rust,no_run\n# fn hidden() {}\nfn main() {}\n```\n";
    let blocks = marked_blocks(md);
    assert_eq!(blocks["a.toml"].info, "toml");
    assert_eq!(blocks["a.toml"].text, "x = 1\n");
    assert_eq!(blocks["main"].info, "rust,no_run");
    let hidden: Vec<&str> = blocks["main"]
        .text
        .lines()
        .filter(|l| is_hidden_line(l))
        .collect();
    assert_eq!(hidden, ["# fn hidden() {}"]);
    assert!(!is_hidden_line("#[tokio::main]"));
    assert!(is_hidden_line("    #"));
    assert_eq!(
        without_numbers("fence 1796327008488223, 3 ok"),
        "fence N, N ok"
    );
    assert_eq!(
        toml_string(
            "[workspace.package]\nrepository = \"https://x/y\"\n",
            "repository"
        ),
        Some("https://x/y".to_owned())
    );
    let profiles = profile_tables("[workspace]\nm = 1\n[profile.dev]\ndebug = 0\n[lints]\nx = 1\n");
    assert_eq!(profiles, "[profile.dev]\ndebug = 0\n");
}
