//! What several of the core's test files share.

use std::future::Future;

use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// One metric recorded: its kind, name and labels, and its value.
pub type Recorded = (CompositeKey, DebugValue);

/// Runs `work` on a current-thread runtime on tokio's paused clock, with a metrics
/// recorder of its own (nothing else in the process records into it), and returns what
/// `work` returned with every metric recorded meanwhile.
pub fn recorded<T>(work: impl Future<Output = T>) -> (T, Vec<Recorded>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(work));
    let metrics = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, v)| (ck, v))
        .collect();
    (out, metrics)
}

/// The value of label `name` of a recorded metric ("" when it has none). Not every test
/// file that shares this module reads labels this way.
#[allow(dead_code)]
pub fn label(ck: &CompositeKey, name: &str) -> String {
    ck.key()
        .labels()
        .find(|l| l.key() == name)
        .map(|l| l.value().to_owned())
        .unwrap_or_default()
}
