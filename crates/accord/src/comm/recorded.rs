//! The communicator's side of [`crate::observe`]: what its flight record and counters say, and
//! how a dump describes it.

use super::*;
use crate::observe::{self, trace, Entry, Lane, Metrics, Record, Route, State};

impl Communicator {
    /// The operations this communicator's flight recorder still holds (see
    /// [`crate::observe`]), oldest first per lane; empty with `ACCORD_FLIGHT_RECORDER=0`.
    /// Device operations say [`State::Completed`] once the GPU has finished them.
    pub fn flight_record(&self) -> Vec<Record> {
        self.inner.records()
    }

    /// The flight record as a dump writes it (one communicator's entry; see
    /// [`crate::observe`]'s `dump` format).
    pub fn flight_record_json(&self) -> String {
        serde_json::to_string_pretty(&self.inner.describe()).unwrap_or_default()
    }

    /// Counters since this communicator was created: operations, bytes, errors, time blocked
    /// waiting for peers.
    pub fn metrics(&self) -> Metrics {
        self.inner.metrics()
    }

    /// Make this communicator visible to dumps (once it is complete: see `Inner::derived`).
    pub(super) fn register(&self) {
        if self.inner.flight.is_some() {
            let weak: std::sync::Weak<dyn observe::Recorded> =
                Arc::downgrade(&self.inner) as std::sync::Weak<Inner>;
            observe::register(weak);
        }
    }

    /// Record host collective `seq` entering on `route`.
    #[inline(always)]
    pub(super) fn record_host(
        &self,
        seq: u64,
        op: &Op,
        route: Route,
        ordered: bool,
    ) -> Option<Entry> {
        let f = self.inner.flight.as_ref()?;
        Some(f.begin_host(seq, &op.fp, route, ordered))
    }

    /// Record that a call recorded by `entry` returned.
    #[inline(always)]
    pub(super) fn record_end<T>(&self, entry: Option<Entry>, r: &Result<T>) {
        if let (Some(f), Some(e)) = (&self.inner.flight, entry) {
            f.end(e, r.is_ok());
        }
    }

    /// Set the route of a recorded call once known.
    pub(super) fn record_route(&self, entry: Option<Entry>, route: Route) {
        if let (Some(f), Some(e)) = (&self.inner.flight, entry) {
            f.set_route(e, route);
        }
    }

    /// Record a device collective being enqueued.
    pub(super) fn record_device(&self, op: &Op) -> Option<Entry> {
        Some(self.inner.flight.as_ref()?.begin_device(&op.fp))
    }

    /// Record a device operation's own count once enqueued.
    pub(super) fn record_device_seq(&self, entry: Option<Entry>, device_seq: u64) {
        if let (Some(f), Some(e)) = (&self.inner.flight, entry) {
            f.set_device_seq(e, device_seq);
        }
    }

    /// Record a point-to-point call entering.
    pub(super) fn record_p2p(
        &self,
        kind: OpKind,
        dtype: DataType,
        bytes: usize,
        peer_tag_recv: (usize, u32, bool),
    ) -> Option<Entry> {
        let f = self.inner.flight.as_ref()?;
        Some(f.begin_p2p(kind, dtype, bytes, peer_tag_recv))
    }
}

/// The timeline's hooks (see [`crate::observe::trace`]): each a flag check while it is off.
impl Communicator {
    /// Start tracing a call of this communicator, when the timeline is on.
    #[inline(always)]
    pub(super) fn trace_begin(&self) -> Option<trace::Span> {
        if !trace::enabled() {
            return None;
        }
        trace::begin(
            self.inner.ranks[self.inner.rank],
            self.inner.id,
            &self.inner.name,
        )
    }

    /// Record a traced call: what it was, where it ran, how it ended.
    #[cold]
    pub(super) fn trace_end<T>(
        &self,
        span: trace::Span,
        (name, seq): (String, Option<u64>),
        fp: &crate::fingerprint::Fingerprint,
        route: Route,
        r: &Result<T>,
    ) {
        span.end(
            name,
            serde_json::json!({
                "seq": seq,
                "call": fp.to_string(),
                "bytes": fp.count.saturating_mul(fp.dtype.size() as u64),
                "engine": self.inner.engine_name(route),
                "algorithm": match route {
                    Route::Schedule(Some(a)) => Some(a.to_string()),
                    _ => None,
                },
                "error": r.as_ref().err().map(|e| e.to_string()),
            }),
        );
    }

    /// The algorithm of the cached plan for `op`, for the timeline.
    pub(super) fn cached_algorithm(&self, op: &Op) -> Option<crate::schedule::Algorithm> {
        if !trace::enabled() {
            return None;
        }
        let cache = self.inner.cache.lock().unwrap();
        cache
            .get(op.kind(), &op.coll, op.dtype.size())
            .map(|(_, a)| *a)
    }
}

impl Inner {
    fn metrics(&self) -> Metrics {
        let mut m = self
            .flight
            .as_ref()
            .map(|f| f.metrics())
            .unwrap_or_default();
        m.blocked_ns = self.transport.mailbox().waits().blocked_ns(self.id);
        m
    }

    fn records(&self) -> Vec<Record> {
        let Some(f) = &self.flight else {
            return vec![];
        };
        let mut rs = f.records();
        // Device work finishes after its call returned: ask the engine how far it got.
        if let Some(g) = self.device.get() {
            let unfinished = g.oldest_unfinished();
            for r in rs.iter_mut().filter(|r| r.state == State::Enqueued) {
                if r.device_seq != 0 && unfinished.is_none_or(|u| r.device_seq < u) {
                    r.state = State::Completed;
                }
            }
        }
        rs
    }

    fn engine_name(&self, route: Route) -> String {
        match route {
            Route::Unknown => String::new(),
            Route::Schedule(_) => "a schedule over the transport".into(),
            Route::Engine(i) => self
                .engines
                .get(i as usize)
                .map_or_else(String::new, |e| e.name().to_string()),
            Route::Device => self.device.get().map_or_else(
                || "the GPU".into(),
                |g| format!("the GPU ({})", g.info().engine),
            ),
        }
    }

    /// This communicator's entry in a dump.
    fn describe(&self) -> serde_json::Value {
        let epoch = observe::clock::Epoch::now();
        let us = |ns: u64| epoch.us(ns);
        let records: Vec<serde_json::Value> = self
            .records()
            .iter()
            .map(|r| {
                let fp = &r.fp;
                serde_json::json!({
                    "lane": r.lane.name(),
                    "seq": r.seq,
                    "op": record_op_name(r),
                    "dtype": fp.dtype.name(),
                    "count": fp.count,
                    "reduce": fp.op.map(|o| o.name()),
                    "root": fp.root,
                    "counts_hash": fp.counts_hash,
                    "peer": r.peer.map(|p| p.0),
                    "tag": r.peer.map(|p| p.1),
                    "state": r.state.name(),
                    "engine": self.engine_name(r.route),
                    "algorithm": match r.route {
                        Route::Schedule(Some(a)) => Some(a.to_string()),
                        _ => None,
                    },
                    "device_seq": r.device_seq,
                    "start_us": us(r.start_ns),
                    "end_us": r.end_ns.map(us),
                    "fingerprint": fp.to_string(),
                })
            })
            .collect();
        let waits = self.transport.mailbox().waits().now();
        let waiting: Vec<serde_json::Value> = waits
            .iter()
            .filter(|b| b.comm == self.id)
            .map(|b| serde_json::json!({"seq": b.seq, "ranks": b.ranks, "gave_up": b.gave_up}))
            .collect();
        let own = self
            .poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let error = own.or_else(|| self.device.get()?.poisoned());
        serde_json::json!({
            "name": self.name,
            "id": self.id,
            "rank": self.rank,
            "size": self.ranks.len(),
            "world_ranks": self.ranks,
            "transport": self.transport.name(),
            "error": error.map(|e| e.to_string()),
            "metrics": self.metrics().to_json(),
            "waiting": waiting,
            "records": records,
        })
    }
}

/// The name users call: sends and receives are told apart by the entry's kind.
fn record_op_name(r: &Record) -> &'static str {
    match (r.lane, r.fp.kind) {
        (Lane::P2p, OpKind::P2p) if r.recv => "recv",
        (Lane::P2p, OpKind::P2p) => "send",
        (Lane::P2p, OpKind::SendRecv) => "sendrecv",
        (_, k) => k.name(),
    }
}

impl observe::Recorded for Inner {
    fn file_key(&self) -> (String, usize, usize) {
        (
            self.resources.job.clone(),
            self.ranks[self.rank],
            self.transport.size(),
        )
    }

    fn snapshot(&self) -> serde_json::Value {
        self.describe()
    }
}
