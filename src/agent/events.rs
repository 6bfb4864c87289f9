//! Agent events (`{prefix}/{device_id}/events`): OOM fallback, batch change, config applied or
//! rejected, model reloaded, input rejected. Producers never block; a full queue is counted.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::agent::telemetry::Stats;

/// One event: a type name and its fields.
#[derive(Debug, Clone)]
pub struct AgentEvent {
    pub kind: &'static str,
    pub body: serde_json::Value,
}

/// The producer side, cheap to clone and usable from any thread.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<AgentEvent>,
    stats: Arc<Stats>,
}

impl EventSink {
    pub fn new(capacity: usize, stats: Arc<Stats>) -> (Self, mpsc::Receiver<AgentEvent>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self { tx, stats }, rx)
    }

    /// Queues an event; logs it too, so nothing goes unreported when the queue is full.
    pub fn emit(&self, kind: &'static str, body: serde_json::Value) {
        tracing::info!(event = kind, "{body}");
        if self.tx.try_send(AgentEvent { kind, body }).is_err() {
            self.stats.events_dropped.fetch_add(1, Relaxed);
            tracing::warn!(event = kind, "event queue full; event only logged");
        }
    }
}
