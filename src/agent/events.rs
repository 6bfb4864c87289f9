//! Agent events (`{prefix}/{device_id}/events`): OOM fallback, batch change, config applied or
//! rejected, model reloaded, input rejected... ([`EventBody`] lists them). Producers never
//! block; a full queue is counted. The publisher wraps each body in the envelope
//! ([`crate::agent::messages::Event`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::sync::mpsc;

pub use crate::agent::messages::EventBody;
use crate::agent::telemetry::Stats;

/// The producer side, cheap to clone and usable from any thread.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<EventBody>,
    stats: Arc<Stats>,
}

impl EventSink {
    /// A sink whose queue holds `capacity` events, and the publisher's end of it.
    pub fn new(capacity: usize, stats: Arc<Stats>) -> (Self, mpsc::Receiver<EventBody>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self { tx, stats }, rx)
    }

    /// Queues an event; logs it too, so nothing goes unreported when the queue is full.
    pub fn emit(&self, body: EventBody) {
        let kind = body.kind();
        tracing::info!(event = kind, "{}", serde_json::to_string(&body).unwrap_or_default());
        if self.tx.try_send(body).is_err() {
            self.stats.events_dropped.fetch_add(1, Relaxed);
            tracing::warn!(event = kind, "event queue full; event only logged");
        }
    }
}
