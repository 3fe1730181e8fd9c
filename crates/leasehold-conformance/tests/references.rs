//! The repository's documents and code point only at things inside the repository that
//! exist. The design and the fault plan are `docs/design.md` and `docs/faults.md`; a
//! reference to the design documents this project once had outside the repository (by
//! their old file names, by row number or by section sign) cannot be followed by a reader
//! of the code, so none may remain.
//!
//! - [`markdown_links_resolve`]: every relative link of every `.md` file names a file (or
//!   directory) that exists, and an anchor the target file has (GitHub's anchors: the
//!   slug of a heading, or an explicit `<a id>`);
//! - [`markdown_path_mentions_exist`]: every repository path a `.md` file names in a code
//!   span (`crates/…`, `docs/…`, `ops/…`, `scripts/…`) exists, and every `file.rs::name`
//!   names a function that file defines;
//! - [`mentions_of_docs_resolve`]: every `docs/<name>.md#<anchor>` written in any text
//!   file (code comments included) names an existing document and one of its anchors;
//! - [`no_markdown_refers_to_documents_outside_the_repository`] and
//!   [`no_code_refers_to_documents_outside_the_repository`]: the old forms are gone, from
//!   the Markdown files and from every other file (the second one lists each offending
//!   line, with the section of `docs/design.md` or the row of `docs/faults.md` it should
//!   point at instead).
//!
//! The checkers are shown to fail on broken input (the `checker_*` tests).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/<name> sits two levels below the root")
        .to_path_buf()
}

/// Every file under `dir`, skipping `.git` and build output (`target`), sorted.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if name == ".git" {
                // A directory, or in a git worktree a file naming one.
                continue;
            }
            if kind.is_dir() {
                if name != "target" {
                    stack.push(path);
                }
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_markdown(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "md")
}

/// The repository's text files (those that read as UTF-8), with their contents.
fn text_files(root: &Path) -> Vec<(PathBuf, String)> {
    walk(root)
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|s| (p, s)))
        .collect()
}

fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

// ---------------------------------------------------------------------------------------
// Markdown: lines outside code blocks, code spans, headings, anchors, links.

/// The lines of `md` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(md: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in md.lines().enumerate() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        let run = |c: char| t.chars().take_while(|&x| x == c).count();
        match fence {
            Some((c, n)) => {
                if indent < 4 && run(c) >= n && t.trim_start_matches(c).trim().is_empty() {
                    fence = None;
                }
            }
            None => {
                let opened = ['`', '~']
                    .into_iter()
                    .find(|&c| indent < 4 && run(c) >= 3)
                    .map(|c| (c, run(c)));
                if opened.is_some() {
                    fence = opened;
                } else {
                    out.push((i + 1, line));
                }
            }
        }
    }
    out
}

/// Splits `line` into text outside code spans and the contents of its code spans.
fn split_code_spans(line: &str) -> (String, Vec<String>) {
    let chars: Vec<char> = line.chars().collect();
    let (mut text, mut spans) = (String::new(), Vec::new());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            text.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: exactly `n` backticks.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                let inner: String = chars[i + n..j].iter().collect();
                spans.push(inner.trim().to_owned());
                text.push(' ');
                i = j + n;
            }
            None => {
                text.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    (text, spans)
}

/// `[text](url)` → `text`, for the text of a heading.
fn strip_links(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](") else {
            break;
        };
        let after = &rest[open + close + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..open + close]);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The anchor GitHub gives a heading: its text (code spans and link texts kept, link
/// targets dropped) lower-cased, every character but letters, digits, `_`, `-` and
/// spaces removed, spaces turned into `-`.
fn slug(heading: &str) -> String {
    strip_links(heading)
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '_' || c == '-' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text of an ATX heading line (`## Text ##`), if it is one.
fn heading_text(line: &str) -> Option<&str> {
    let t = line.trim_start();
    if line.len() - t.len() > 3 {
        return None;
    }
    let level = t.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let rest = rest.trim();
    // A closing sequence of `#`s, preceded by a space, is not part of the text.
    let trimmed = rest.trim_end_matches('#');
    Some(
        if trimmed.len() < rest.len() && (trimmed.is_empty() || trimmed.ends_with(' ')) {
            trimmed.trim_end()
        } else {
            rest
        },
    )
}

/// Every anchor of `md`: its headings' slugs (the second of two equal slugs gets `-1`,
/// the third `-2`, …) and the ids and names of its HTML anchors.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(md) {
        if let Some(text) = heading_text(line) {
            let base = slug(text);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find("<a ") {
                rest = &rest[at + 3..];
                let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
                if let Some(v) = tag.find(attr) {
                    let value = &tag[v + attr.len()..];
                    if let Some(end) = value.find('"') {
                        out.insert(value[..end].to_owned());
                    }
                }
            }
        }
    }
    out
}

/// The link targets of `md` outside code (inline links, images, reference definitions),
/// with their line numbers.
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(md) {
        let (text, _) = split_code_spans(line);
        // A reference definition: `[label]: target`.
        let t = text.trim_start();
        if t.starts_with('[')
            && let Some(close) = t.find("]:")
            && !t[..close].contains("](")
        {
            if let Some(target) = t[close + 2..].split_whitespace().next() {
                out.push((n, target.trim_matches(['<', '>']).to_owned()));
            }
            continue;
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            // Up to the matching `)`, nested parentheses allowed.
            let mut depth = 0usize;
            let mut end = None;
            for (i, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = Some(i);
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let Some(end) = end else {
                break;
            };
            let inner = after[..end].trim();
            // Drop a title: `(target "title")`.
            let target = inner.split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_owned()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// Whether `target` points outside the repository (a URL) or is a rustdoc path
/// (`crate::Lease`, `leasehold_core::Store`): not a file to look for.
fn is_external(target: &str) -> bool {
    target.contains("://")
        || target.starts_with("mailto:")
        || (target.contains("::") && !target.contains('/'))
}

/// Checks one link `target` of the Markdown file `from`; `None` if it resolves.
/// `anchors_of` gives the anchors of a Markdown file (`None`: unreadable).
fn check_link(
    root: &Path,
    from: &Path,
    target: &str,
    anchors_of: &mut dyn FnMut(&Path) -> Option<BTreeSet<String>>,
) -> Option<String> {
    if target.is_empty() || is_external(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let path = path.replace("%20", " ");
    let file = if path.is_empty() {
        from.to_path_buf()
    } else if let Some(abs) = path.strip_prefix('/') {
        root.join(abs)
    } else {
        from.parent().unwrap_or(root).join(&path)
    };
    if !file.exists() {
        return Some(format!("`{target}`: no such file or directory"));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if !is_markdown(&file) {
        return Some(format!(
            "`{target}`: an anchor in a file that is not Markdown"
        ));
    }
    match anchors_of(&file) {
        Some(found) if found.contains(anchor) => None,
        Some(_) => Some(format!(
            "`{target}`: no heading or anchor `#{anchor}` in {}",
            shown(root, &file)
        )),
        None => Some(format!("`{target}`: cannot read the target")),
    }
}

/// Every dangling link of the Markdown files `mds` (path, contents), as
/// `file:line: problem`.
fn dangling_links(root: &Path, mds: &[(PathBuf, String)]) -> Vec<String> {
    let mut cache: BTreeMap<PathBuf, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut anchors_of = |p: &Path| {
        cache
            .entry(p.to_path_buf())
            .or_insert_with(|| std::fs::read_to_string(p).ok().map(|s| anchors(&s)))
            .clone()
    };
    let mut errors = Vec::new();
    for (path, md) in mds {
        for (n, target) in links(md) {
            if let Some(e) = check_link(root, path, &target, &mut anchors_of) {
                errors.push(format!("{}:{n}: {e}", shown(root, path)));
            }
        }
    }
    errors
}

/// Whether `source` defines a function `name` (`fn name(` or `fn name<`).
fn defines_fn(source: &str, name: &str) -> bool {
    source.contains(&format!("fn {name}(")) || source.contains(&format!("fn {name}<"))
}

/// Every repository path named in a code span of the Markdown files `mds` that does not
/// exist, and every `file.rs::name` whose file defines no function `name`.
fn dangling_path_mentions(root: &Path, mds: &[(PathBuf, String)]) -> Vec<String> {
    const TOP: [&str; 4] = ["crates/", "docs/", "ops/", "scripts/"];
    let mut errors = Vec::new();
    for (path, md) in mds {
        for (n, line) in prose_lines(md) {
            for span in split_code_spans(line).1 {
                if !TOP.iter().any(|t| span.starts_with(t)) || span.contains(char::is_whitespace) {
                    continue;
                }
                let (file, name) = match span.split_once("::") {
                    Some((f, name)) => (f, Some(name)),
                    None => (span.as_str(), None),
                };
                let file = file.split('#').next().unwrap_or(file);
                // Globs and placeholders (`crates/*/README.md`, `crates/<name>`) name no one file.
                if file.contains(['*', '<', '{', '…']) {
                    continue;
                }
                let full = root.join(file);
                let problem = match (std::fs::read_to_string(&full), name) {
                    _ if !full.exists() => Some("no such file or directory".to_owned()),
                    (Ok(source), Some(name)) if !defines_fn(&source, name) => {
                        Some(format!("no function `{name}` in it"))
                    }
                    _ => None,
                };
                if let Some(p) = problem {
                    errors.push(format!("{}:{n}: `{span}`: {p}", shown(root, path)));
                }
            }
        }
    }
    errors
}

/// Every `docs/<name>.md` (with an optional `#anchor`) written in `text`.
fn docs_mentions(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("docs/") {
            let tail = &rest[at + 5..];
            let name_len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(tail.len());
            let after_name = &tail[name_len..];
            if name_len > 0 && after_name.starts_with(".md") {
                let mut mention = format!("docs/{}.md", &tail[..name_len]);
                if let Some(anchor) = after_name[3..].strip_prefix('#') {
                    let len = anchor
                        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                        .unwrap_or(anchor.len());
                    if len > 0 {
                        mention.push('#');
                        mention.push_str(&anchor[..len]);
                    }
                }
                out.push((i + 1, mention));
            }
            rest = tail;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// References to the design documents that lived outside the repository.

/// The old reference forms on `line`, as found: the file names of the two documents,
/// a fault plan row by number (`FAULTS` then a digit, `row`, `rows`), a fault plan section
/// by its quoted title, and a design section by its section sign. The identifier
/// `FAULTS` (a Rust constant, `FAULTS.contains(…)`) is not one. Returns where each
/// starts (a byte offset).
fn outside_references(line: &str) -> Vec<usize> {
    const DOCS: [&str; 2] = ["FAULTS", "DESIGN"];
    let mut found = Vec::new();
    for doc in DOCS {
        let mut from = 0;
        while let Some(at) = line[from..].find(doc) {
            let start = from + at;
            let end = start + doc.len();
            from = end;
            let word = |c: char| c.is_alphanumeric() || c == '_';
            if line[..start].chars().next_back().is_some_and(word)
                || line[end..].chars().next().is_some_and(word)
            {
                continue;
            }
            let after = &line[end..];
            let file_or_section =
                after.starts_with(".md") || after.starts_with(" §") || after.starts_with('§');
            let row = after.strip_prefix(' ').is_some_and(|a| {
                a.starts_with(|c: char| c.is_ascii_digit()) || a.starts_with("row")
            });
            let quoted_section = after.starts_with(" \"") || after.starts_with(": \"");
            let is_reference = file_or_section || (doc == "FAULTS" && (row || quoted_section));
            if is_reference {
                found.push(start);
            }
        }
    }
    found
}

/// `line` without its indentation and comment or quote markers (`//!`, `///`, `//`, `#`,
/// `>`, `*`).
fn continuation(line: &str) -> &str {
    let t = line.trim_start();
    t.trim_start_matches(['/', '!', '#', '>', '*']).trim_start()
}

/// Every line of `files` with an old reference form, as `file:line: text`. A reference
/// broken across two lines (the document's name ending one, the row starting the next)
/// counts on the line where it starts.
fn outside_reference_lines(root: &Path, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let next = lines.get(i + 1).map_or("", |l| continuation(l));
            let joined = format!("{line} {next}");
            if outside_references(&joined)
                .iter()
                .any(|&start| start < line.len())
            {
                out.push(format!("{}:{}: {}", shown(root, path), i + 1, line.trim()));
            }
        }
    }
    out
}

fn report(what: &str, errors: &[String]) {
    assert!(
        errors.is_empty(),
        "{} {what}:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// The repository.

fn markdown_files(root: &Path) -> Vec<(PathBuf, String)> {
    text_files(root)
        .into_iter()
        .filter(|(p, _)| is_markdown(p))
        .collect()
}

#[test]
fn markdown_links_resolve() {
    let root = root();
    let mds = markdown_files(&root);
    assert!(
        mds.len() >= 10,
        "found only {} Markdown files under {}",
        mds.len(),
        root.display()
    );
    report(
        "relative links that do not resolve",
        &dangling_links(&root, &mds),
    );
}

#[test]
fn markdown_path_mentions_exist() {
    let root = root();
    report(
        "paths named in Markdown that do not exist",
        &dangling_path_mentions(&root, &markdown_files(&root)),
    );
}

#[test]
fn mentions_of_docs_resolve() {
    let root = root();
    let docs = root.join("docs");
    let mut errors = Vec::new();
    for (path, text) in text_files(&root) {
        for (n, mention) in docs_mentions(&text) {
            let target = mention.trim_start_matches("docs/");
            let mut anchors_of = |p: &Path| std::fs::read_to_string(p).ok().map(|s| anchors(&s));
            if let Some(e) = check_link(&root, &docs.join("x"), target, &mut anchors_of) {
                errors.push(format!("{}:{n}: {e}", shown(&root, &path)));
            }
        }
    }
    report("mentions of docs/*.md that do not resolve", &errors);
}

#[test]
fn no_markdown_refers_to_documents_outside_the_repository() {
    let root = root();
    report(
        "lines of Markdown refer to the old design documents (point at docs/design.md or docs/faults.md)",
        &outside_reference_lines(&root, &markdown_files(&root)),
    );
}

/// Fails until every code comment that refers to the old design documents is rewritten
/// to point at `docs/design.md` or `docs/faults.md` (issue 25, item 6); it lists each
/// offending line.
#[test]
fn no_code_refers_to_documents_outside_the_repository() {
    let root = root();
    let code: Vec<(PathBuf, String)> = text_files(&root)
        .into_iter()
        .filter(|(p, _)| !is_markdown(p))
        .collect();
    report(
        "lines of code refer to the old design documents (point at docs/design.md or docs/faults.md)",
        &outside_reference_lines(&root, &code),
    );
}

// ---------------------------------------------------------------------------------------
// The checkers fail on broken input.

#[test]
fn checker_slugs_are_githubs() {
    assert_eq!(slug("3. The store contract"), "3-the-store-contract");
    assert_eq!(
        slug("4.11 Ambiguous replies and orphans"),
        "411-ambiguous-replies-and-orphans"
    );
    assert_eq!(
        slug("What it guarantees — and what it does not"),
        "what-it-guarantees--and-what-it-does-not"
    );
    assert_eq!(slug("`GET_LOCK` sessions"), "get_lock-sessions");
    assert_eq!(
        slug("3.2 Expiry runs on the store's clock"),
        "32-expiry-runs-on-the-stores-clock"
    );
    assert_eq!(slug("See [the design](design.md)"), "see-the-design");
    assert_eq!(
        heading_text("## 14. Client wall-clock jump ##"),
        Some("14. Client wall-clock jump")
    );
    assert_eq!(heading_text("#hashtag"), None);
    assert_eq!(heading_text("    ## indented code"), None);
    let md = "# A\n## A\n```\n# not a heading\n```\n## A\n<a id=\"x.1\"></a>\n";
    let found = anchors(md);
    let want: BTreeSet<String> = ["a", "a-1", "a-2", "x.1"].map(String::from).into();
    assert_eq!(found, want);
}

#[test]
fn checker_finds_dangling_links_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("papers")).unwrap();
    std::fs::create_dir_all(root.join("crates/c/sql")).unwrap();
    std::fs::write(
        root.join("papers/design.md"),
        "# Design\n## 3. The store contract\n",
    )
    .unwrap();
    let readme = "\
# C
[ok](../../papers/design.md#3-the-store-contract) [dir](sql/) [here](#c) [root](/papers/design.md)
[missing file](../../papers/faults.md#14-client-wall-clock-jump)
[missing anchor](../../papers/design.md#4-the-holder-side) [bad here](#nowhere)
[rust](crate::Lease) [web](https://example.com/x.md#y) `[code](nowhere.md)`
[anchor in a directory](sql/#x)
```text
[fenced](nowhere.md)
```
[ref]: ../../papers/gone.md
";
    let readme_path = root.join("crates/c/README.md");
    std::fs::write(&readme_path, readme).unwrap();
    let errors = dangling_links(root, &[(readme_path, readme.to_owned())]);
    let lines: Vec<&str> = errors
        .iter()
        .map(|e| e.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            "crates/c/README.md:3",
            "crates/c/README.md:4",
            "crates/c/README.md:4",
            "crates/c/README.md:6",
            "crates/c/README.md:10",
        ],
        "{errors:#?}"
    );
    assert!(errors[0].contains("no such file"), "{}", errors[0]);
    assert!(
        errors[1].contains("no heading or anchor `#4-the-holder-side`"),
        "{}",
        errors[1]
    );
    assert!(errors[2].contains("`#nowhere`"), "{}", errors[2]);
}

#[test]
fn checker_finds_paths_and_functions_that_do_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("crates/c/tests")).unwrap();
    std::fs::write(root.join("crates/c/tests/t.rs"), "#[test]\nfn here() {}\n").unwrap();
    let md = "`crates/c/tests/t.rs::here` `crates/c/tests/t.rs::gone` `crates/c/tests/u.rs`\n\
              `crates/*/README.md` `crates/c` `cargo run -p crates/x` `ops/nothing.yml`\n";
    let errors = dangling_path_mentions(root, &[(root.join("a.md"), md.to_owned())]);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].contains("no function `gone`"), "{}", errors[0]);
    assert!(errors[1].contains("u.rs"), "{}", errors[1]);
    assert!(errors[2].contains("ops/nothing.yml"), "{}", errors[2]);
}

#[test]
fn checker_reads_docs_mentions_in_code() {
    let text = "//! See `docs/design.md#3-the-store-contract` and docs/faults.md, not docs/.\n\
                // (docs/faults.md#14-client-wall-clock-jump).\n";
    assert_eq!(
        docs_mentions(text),
        [
            (1, "docs/design.md#3-the-store-contract".to_owned()),
            (1, "docs/faults.md".to_owned()),
            (2, "docs/faults.md#14-client-wall-clock-jump".to_owned()),
        ]
    );
}

#[test]
fn checker_finds_the_old_reference_forms_and_not_the_identifier() {
    // Built from pieces, so that this file does not contain them.
    let doc = |s: &str| format!("{}{s}", concat!("FAULT", "S"));
    let design = |s: &str| format!("{}{s}", concat!("DESIG", "N"));
    for bad in [
        doc(".md"),
        doc(" 14"),
        doc(" 9-10);"),
        doc(" row 22"),
        doc(" rows 2, 4"),
        doc(" \"History checker\""),
        doc(": \"Always\""),
        design(" §3"),
        design(".md"),
        format!("(see {})", design(" §4, \"Store-side clocks\"")),
    ] {
        assert!(!outside_references(&bad).is_empty(), "not flagged: {bad}");
    }
    for fine in [
        doc(": [&str; 11] = ["),
        format!("if !{}.contains(&fault) {{", concat!("FAULT", "S")),
        format!("for fault in {} {{", concat!("FAULT", "S")),
        format!("MY_{}", doc(" 14")),
        "docs/faults.md#14-client-wall-clock-jump".to_owned(),
        design("ED"),
    ] {
        assert!(outside_references(&fine).is_empty(), "flagged: {fine}");
    }
    // Broken across lines, in a comment: counted on the first line only.
    let text = format!(
        "/// a reuse of fences ({}\n/// rows 10, 11, 13) is admitted\nfn f() {{}}\n",
        concat!("FAULT", "S")
    );
    let lines = outside_reference_lines(Path::new(""), &[(PathBuf::from("x.rs"), text)]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("x.rs:1:"), "{lines:?}");
}
