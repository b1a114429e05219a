//! Host buffers: the shared-memory engine for the ranks of one host, hierarchical collectives
//! across hosts, and otherwise a schedule chosen by the tuner, run over the transport.

use super::*;
use crate::observe::Route;
use std::time::Instant;

impl Communicator {
    /// Run a checked collective on host buffers. `input == None` is in place.
    pub(super) fn on_host(&self, op: &Op, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.host_only(op.kind().name())?;
        let me = self.rank();
        let esz = op.dtype.size();
        match op.coll {
            // A non-root's receive buffer need not hold anything: without a full-size one it
            // reduces through scratch, its own contribution in place or from `input`.
            Collective::Reduce { count, root }
                if me != root && (input.is_none() || output.len() != count * esz) =>
            {
                let mut scratch = vec![0u8; count * esz];
                let input = match input {
                    Some(i) => i,
                    None => &output[..count * esz],
                };
                return self.run_op(op, Some(input), &mut scratch, None);
            }
            // Out-of-place broadcast: the root's send buffer becomes its receive buffer.
            Collective::Broadcast { root, .. } => {
                if let (Some(i), true) = (input, me == root) {
                    output.copy_from_slice(i);
                }
                return self.run_op(op, None, output, None);
            }
            _ => {}
        }
        // Buffers used only at the root may have any length elsewhere: pass none of them.
        let input = input.map(|i| &i[..op.send_len(me) * esz]);
        let out_len = op.recv_len(me) * esz;
        self.run_op(op, input, &mut output[..out_len], None)
    }

    /// Run `op` with buffers of exactly the lengths it needs, ending by `until` where it is a
    /// step of a larger call (else `set_timeout` after it starts).
    fn run_op(
        &self,
        op: &Op,
        input: Option<&[u8]>,
        output: &mut [u8],
        until: Option<Instant>,
    ) -> Result<()> {
        if op
            .reduce
            .is_some_and(|r| crate::dtype::averages_wide(op.dtype, r))
        {
            return self.run_wide(op, input, output, until);
        }
        let (seq, reserved) = self.next_seq()?;
        // Reserved calls may run concurrently and in any order on each rank: they take the
        // message path, which matches by sequence number. Others run in program order.
        let engine = (!reserved)
            .then(|| self.inner.engines.iter().position(|e| e.supports(op)))
            .flatten();
        let span = self.trace_begin();
        let (r, route) = match engine {
            Some(at) => {
                let e = &self.inner.engines[at];
                self.check_poison()?;
                self.explain_engine(op, || e.name());
                let route = Route::Engine(at as u8);
                let rec = self.record_host(seq, op, route, true);
                let call = op.call(self.inner.id, &self.inner.name, seq, self.timeout(), until);
                let r = e.run(&call, op, input, output).map_err(|e| self.fail(e));
                self.record_end(rec, &r);
                (r, route)
            }
            None => {
                self.explain_engine(op, || "a schedule over the transport");
                let rec = self.record_host(seq, op, Route::Schedule(None), !reserved);
                let r = self.run_schedule(seq, op, input, output, rec, until);
                self.record_end(rec, &r);
                (r, Route::Schedule(self.cached_algorithm(op)))
            }
        };
        if let Some(span) = span {
            self.trace_end(
                span,
                (op.kind().name().into(), Some(seq)),
                &op.fp,
                route,
                &r,
            );
        }
        r
    }

    /// Run an f16/bf16 average in f32 (see [`crate::dtype::averages_wide`]): every rank widens,
    /// so the frames and staging agree; the fingerprint still names the caller's type.
    fn run_wide(
        &self,
        op: &Op,
        input: Option<&[u8]>,
        output: &mut [u8],
        until: Option<Instant>,
    ) -> Result<()> {
        let narrow = op.dtype;
        let wide_in = input.map(|i| crate::dtype::widen_half(narrow, i));
        // In place, `output` holds this rank's contribution; otherwise its contents are unused.
        let mut wide_out = crate::dtype::widen_half(narrow, output);
        let wide = Op {
            dtype: DataType::F32,
            ..op.clone()
        };
        self.run_op(&wide, wide_in.as_deref(), &mut wide_out, until)?;
        crate::dtype::narrow_half(narrow, &wide_out, output);
        Ok(())
    }

    /// Run `op`, a step of a call on another communicator, under that call's fingerprint: the
    /// leaders' or a stripe's step of a hierarchical collective, whose frames must carry what
    /// the world call was (its root, its reduce op) so that ranks that disagree fail; its
    /// waits for peers end by `until`, the world call's deadline, so that the steps together
    /// wait no longer than the call's own timeout (a timeout's diagnosis comes after it).
    pub(super) fn run_as(
        &self,
        op: &Op,
        input: Option<&[u8]>,
        output: &mut [u8],
        until: Instant,
    ) -> Result<()> {
        self.run_op(op, input, output, Some(until))
    }

    /// Plan `op` (cached) and run the schedule over the transport.
    fn run_schedule(
        &self,
        seq: u64,
        op: &Op,
        input: Option<&[u8]>,
        output: &mut [u8],
        rec: Option<crate::observe::Entry>,
        until: Option<Instant>,
    ) -> Result<()> {
        self.check_poison()?;
        // The sequence number is spent: from here on, a failure must reach the peers.
        let (sched, algo) = self
            .schedule(&op.coll, op.kind(), op.dtype)
            .map_err(|e| self.fail(e))?;
        self.record_route(rec, Route::Schedule(Some(algo)));
        let bufs = match input {
            Some(i) => Buffers {
                input: i.as_ptr(),
                input_len: i.len(),
                output: output.as_mut_ptr(),
                output_len: output.len(),
            },
            None => Buffers {
                input: output.as_ptr(),
                input_len: output.len(),
                output: output.as_mut_ptr(),
                output_len: output.len(),
            },
        };
        let mut call = op.call(self.inner.id, &self.inner.name, seq, self.timeout(), until);
        // Ranks that chose other algorithms (forced differently) fail on the first frame.
        call.fp = call.fp.with_algorithm(algo);
        let routed = self.routed(call);
        exec::execute(&routed, &sched, &bufs).map_err(|e| self.fail(e))
    }

    /// `call` on this communicator's route through the transport.
    pub(super) fn routed<'a>(&'a self, call: crate::op::Call<'a>) -> Routed<'a> {
        Routed {
            call,
            transport: &*self.inner.transport,
            ranks: &self.inner.ranks,
            shown_as: self.inner.shown_as.as_deref(),
            me: self.rank(),
        }
    }
}
