//! `inspect`, `list` and `break`.

use std::process::ExitCode;
use std::sync::Arc;

use leasehold::{Key, LeaseInfo, Store, StoreError, StoreErrorKind};
use serde::Serialize;

use crate::{exit, fail, stores};

#[derive(Serialize)]
struct View {
    key: String,
    owner: String,
    fence: u64,
    remaining_ms: Option<u64>,
}

impl From<&LeaseInfo> for View {
    fn from(i: &LeaseInfo) -> Self {
        Self {
            key: i.key.to_string(),
            owner: i.owner.to_hex(),
            fence: i.fence.get(),
            remaining_ms: i.remaining.map(|r| r.as_millis() as u64),
        }
    }
}

fn print_view(v: &View) {
    let remaining = v
        .remaining_ms
        .map(|ms| format!("{ms} ms"))
        .unwrap_or_else(|| "unknown".into());
    println!(
        "{}\tfence {}\towner {}\tremaining {remaining}",
        v.key, v.fence, v.owner
    );
}

/// Maps a store error to the documented exit code.
pub(crate) fn store_failure(e: &StoreError) -> ExitCode {
    let code = match e.kind() {
        StoreErrorKind::Config if e.backend() == "registry" => exit::USAGE,
        StoreErrorKind::InvalidInput => exit::USAGE,
        _ => exit::STORE,
    };
    fail(code, e)
}

/// Opens the store. A configuration error while opening means the URL is wrong (scheme,
/// host, port, parameters, credentials): a usage error, not a store failure.
///
/// `memory://` is refused: every `leasehold` process would get its own empty store, so two
/// runs of one key would both run, and `inspect` or `list` would never see a lease.
pub(crate) async fn connect(url: &str) -> Result<Arc<dyn Store>, ExitCode> {
    if stores::is_memory(url) {
        return Err(fail(
            exit::USAGE,
            "memory:// keeps leases inside one process, so separate leasehold commands \
             would never exclude each other; use sqlite:// (the default) or a shared store",
        ));
    }
    stores::open(url).await.map_err(|e| match e.kind() {
        StoreErrorKind::Config | StoreErrorKind::InvalidInput => {
            fail(exit::USAGE, format_args!("bad store URL: {e}"))
        }
        _ => store_failure(&e),
    })
}

fn parse_key(key: &str) -> Result<Key, ExitCode> {
    Key::new(key).map_err(|e| fail(exit::USAGE, format_args!("invalid key: {e}")))
}

pub(crate) async fn inspect(url: &str, key: &str, json: bool) -> ExitCode {
    let key = match parse_key(key) {
        Ok(k) => k,
        Err(c) => return c,
    };
    let store = match connect(url).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    match store.inspect(&key).await {
        Ok(info) => {
            let view = info.as_ref().map(View::from);
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "key": key.as_str(), "held": view.is_some(), "lease": view })
                );
            } else if let Some(v) = &view {
                print_view(v);
            } else {
                println!("{key}\tfree");
            }
            ExitCode::SUCCESS
        }
        Err(e) => store_failure(&e),
    }
}

pub(crate) async fn list(url: &str, prefix: &str, json: bool) -> ExitCode {
    let store = match connect(url).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    match store.list(prefix).await {
        Ok(list) => {
            let views: Vec<View> = list.iter().map(View::from).collect();
            if json {
                println!("{}", serde_json::to_string(&views).expect("serializable"));
            } else {
                views.iter().for_each(print_view);
            }
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == StoreErrorKind::Unsupported => fail(
            exit::USAGE,
            format_args!("this store cannot list leases: {e}"),
        ),
        Err(e) => store_failure(&e),
    }
}

pub(crate) async fn break_lease(url: &str, key: &str, json: bool) -> ExitCode {
    let key = match parse_key(key) {
        Ok(k) => k,
        Err(c) => return c,
    };
    let store = match connect(url).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    let before = store.inspect(&key).await.ok().flatten();
    match store.break_lease(&key).await {
        Ok(fence) => {
            tracing::warn!(%key, fence = fence.get(), evicted = ?before.as_ref().map(|b| b.owner.to_hex()), "lease broken");
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "key": key.as_str(), "fence": fence.get(), "evicted": before.as_ref().map(View::from) })
                );
            } else {
                match &before {
                    Some(b) => println!(
                        "{key}: evicted owner {} (fence {}); fence advanced to {fence}",
                        b.owner, b.fence
                    ),
                    None => println!("{key}: no holder; fence advanced to {fence}"),
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == StoreErrorKind::Unsupported => fail(
            exit::USAGE,
            format_args!("this store cannot break leases: {e}"),
        ),
        Err(e) => store_failure(&e),
    }
}
