//! `inspect`, `list` and `break`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::wrap::TimeoutStore;
use leasehold::{Key, LeaseInfo, Store, StoreError};
use serde::Serialize;

use crate::failure::Failure;
use crate::stores;

/// The bound on opening the store, on each step of `migrate` and on each store call of
/// `inspect`, `list` and `break` ([`StoreError::bounded`]): an unreachable or locked store
/// fails them in time, with a [`Timeout`](leasehold::StoreErrorKind::Timeout), instead of
/// hanging.
pub(crate) const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

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

fn view_line(v: &View) -> String {
    let remaining = v
        .remaining_ms
        .map(|ms| format!("{ms} ms"))
        .unwrap_or_else(|| "unknown".into());
    format!(
        "{}\tfence {}\towner {}\tremaining {remaining}\n",
        v.key, v.fence, v.owner
    )
}

/// Refuses `memory://`: every `leasehold` process would get its own empty store, so two
/// runs of one key would both run, and `inspect` or `list` would never see a lease.
pub(crate) fn refuse_memory(url: &str) -> Result<(), Failure> {
    if stores::is_memory(url) {
        return Err(Failure::Memory);
    }
    Ok(())
}

/// Opens the store (never `memory://`, see [`refuse_memory`]). A configuration error found
/// before the store was contacted means the URL is wrong (scheme, host, port, parameters):
/// a usage error; a store that refused (credentials, database, permission, file) is a
/// store failure ([`Failure::opening`]).
pub(crate) async fn connect(url: &str) -> Result<Arc<dyn Store>, Failure> {
    refuse_memory(url)?;
    // `leasehold` links every store, so its registry knows every scheme.
    StoreError::bounded("store", "connecting", ADMIN_TIMEOUT, leasehold::open(url))
        .await
        .map_err(Failure::opening)
}

/// [`connect`], with every call bounded by [`ADMIN_TIMEOUT`].
pub(crate) async fn connect_bounded(url: &str) -> Result<TimeoutStore, Failure> {
    Ok(TimeoutStore::new(connect(url).await?, ADMIN_TIMEOUT))
}

fn parse_key(key: &str) -> Result<Key, Failure> {
    Key::new(key).map_err(|e| Failure::Usage(format!("invalid key: {e}")))
}

pub(crate) async fn inspect(url: &str, key: &str, json: bool) -> Result<ExitCode, Failure> {
    let key = parse_key(key)?;
    let store = connect_bounded(url).await?;
    let info = store.inspect(&key).await?;
    let view = info.as_ref().map(View::from);
    let text = if json {
        format!(
            "{}\n",
            serde_json::json!({ "key": key.as_str(), "held": view.is_some(), "lease": view })
        )
    } else if let Some(v) = &view {
        view_line(v)
    } else {
        format!("{key}\tfree\n")
    };
    crate::out::print(&text)
}

pub(crate) async fn list(url: &str, prefix: &str, json: bool) -> Result<ExitCode, Failure> {
    let store = connect_bounded(url).await?;
    let list = store.list(prefix).await?;
    let views: Vec<View> = list.iter().map(View::from).collect();
    let text = if json {
        format!("{}\n", serde_json::to_string(&views).expect("serializable"))
    } else {
        views.iter().map(view_line).collect()
    };
    crate::out::print(&text)
}

pub(crate) async fn break_lease(url: &str, key: &str, json: bool) -> Result<ExitCode, Failure> {
    let key = parse_key(key)?;
    let store = connect_bounded(url).await?;
    let before = store.inspect(&key).await.ok().flatten();
    let fence = store.break_lease(&key).await?;
    // Info, not a warning: breaking the lease is what was asked, and the output says so.
    tracing::info!(%key, fence = fence.get(), evicted = ?before.as_ref().map(|b| b.owner.to_hex()), "lease broken");
    let text = if json {
        format!(
            "{}\n",
            serde_json::json!({ "key": key.as_str(), "fence": fence.get(), "evicted": before.as_ref().map(View::from) })
        )
    } else {
        match &before {
            Some(b) => format!(
                "{key}: evicted owner {} (fence {}); fence advanced to {fence}\n",
                b.owner, b.fence
            ),
            None => format!("{key}: no holder; fence advanced to {fence}\n"),
        }
    };
    crate::out::print(&text)
}
