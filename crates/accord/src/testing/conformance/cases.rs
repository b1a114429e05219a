//! The calls of the suite, one method per operation: build every rank's inputs, compute the
//! expected result, run the call with each algorithm and buffer placement, compare.

use super::reference::{self, Expect};
use super::{displaced, parts_recv, parts_send, spread, waited, Case, Step, Suite};
use crate::buffer::Parts;
use crate::dtype::DataType;
use crate::fingerprint::OpKind;
use crate::schedule::Collective;

const SEND_CHANGED: &str = "send buffer changed: ";

impl Suite<'_> {
    pub(super) fn barrier(&mut self) -> Step {
        let kind = OpKind::Barrier;
        for algo in self.algorithms(&[Collective::Barrier]) {
            self.force(kind, algo);
            let case = Case {
                op: kind,
                in_place: None,
                dtype: DataType::U8,
                reduce: None,
                counts: vec![0],
                root: None,
                algorithm: algo,
                displaced: false,
            };
            let r = self.comm.barrier();
            self.done(&case, r)?;
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn broadcast(&mut self) -> Step {
        let kind = OpKind::Broadcast;
        for dtype in self.opts.dtypes.clone() {
            for count in self.opts.counts.clone() {
                for root in self.roots() {
                    let seed = self.next_seed();
                    let data = self.input(seed, root, dtype, None, count);
                    let want = Expect::Exact(data.clone());
                    let is_root = self.me == root;
                    for algo in self.algorithms(&[Collective::Broadcast { count, root }]) {
                        self.force(kind, algo);
                        for in_place in [true, false] {
                            let case = Case {
                                op: kind,
                                in_place: Some(in_place),
                                dtype,
                                reduce: None,
                                counts: vec![count],
                                root: Some(root),
                                algorithm: algo,
                                displaced: false,
                            };
                            if in_place {
                                let mut buf = match is_root {
                                    true => self.upload(dtype, &data),
                                    false => self.output(dtype, count),
                                };
                                let r = self.comm.broadcast(buf.recv(), root);
                                self.done(&case, waited(r))?;
                                self.expect(&case, "", &*buf, &want);
                            } else {
                                // Non-roots' send buffers are not read: pass none.
                                let send = self.upload(dtype, if is_root { &data } else { &[] });
                                let mut out = self.output(dtype, count);
                                let r = self.comm.broadcast((send.send(), out.recv()), root);
                                self.done(&case, waited(r))?;
                                self.expect(&case, "", &*out, &want);
                                if is_root {
                                    self.expect(&case, SEND_CHANGED, &*send, &want);
                                }
                            }
                        }
                    }
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn reduce(&mut self) -> Step {
        let kind = OpKind::Reduce;
        for (dtype, op) in self.dtype_ops() {
            for count in self.opts.counts.clone() {
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..self.n)
                    .map(|r| self.input(seed, r, dtype, Some(op), count))
                    .collect();
                let want = reference::reduce(dtype, op, &inputs);
                let mine = Expect::Exact(inputs[self.me].clone());
                for root in self.roots() {
                    let is_root = self.me == root;
                    for algo in self.algorithms(&[Collective::Reduce { count, root }]) {
                        self.force(kind, algo);
                        for in_place in [true, false] {
                            let case = Case {
                                op: kind,
                                in_place: Some(in_place),
                                dtype,
                                reduce: Some(op),
                                counts: vec![count],
                                root: Some(root),
                                algorithm: algo,
                                displaced: false,
                            };
                            if in_place {
                                let mut buf = self.upload(dtype, &inputs[self.me]);
                                let r = self.comm.reduce(buf.recv(), op, root);
                                self.done(&case, waited(r))?;
                                match is_root {
                                    true => self.expect(&case, "", &*buf, &want),
                                    false => self.expect(
                                        &case,
                                        "a non-root's buffer changed: ",
                                        &*buf,
                                        &mine,
                                    ),
                                }
                            } else {
                                // Non-roots' receive buffers are not written: pass none.
                                let send = self.upload(dtype, &inputs[self.me]);
                                let mut out = self.output(dtype, if is_root { count } else { 0 });
                                let r = self.comm.reduce((send.send(), out.recv()), op, root);
                                self.done(&case, waited(r))?;
                                if is_root {
                                    self.expect(&case, "", &*out, &want);
                                }
                                self.expect(&case, SEND_CHANGED, &*send, &mine);
                            }
                        }
                    }
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn all_reduce(&mut self) -> Step {
        self.elementwise(OpKind::AllReduce)
    }

    pub(super) fn scan(&mut self, kind: OpKind) -> Step {
        self.elementwise(kind)
    }

    /// Allreduce, scan or exscan: rank `r` expects the reduction of the inputs of every rank,
    /// of ranks `0..=r` or of ranks `0..r`; rank 0 of an exscan expects its output untouched.
    fn elementwise(&mut self, kind: OpKind) -> Step {
        let upto = match kind {
            OpKind::AllReduce => self.n,
            OpKind::Scan => self.me + 1,
            _ => self.me,
        };
        for (dtype, op) in self.dtype_ops() {
            // A prefix has no single divisor.
            if kind != OpKind::AllReduce && op == crate::dtype::ReduceOp::Avg {
                continue;
            }
            for count in self.opts.counts.clone() {
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..self.n)
                    .map(|r| self.input(seed, r, dtype, Some(op), count))
                    .collect();
                let mine = Expect::Exact(inputs[self.me].clone());
                let want = (upto > 0).then(|| reference::reduce(dtype, op, &inputs[..upto]));
                let coll = match kind {
                    OpKind::AllReduce => Collective::AllReduce { count },
                    _ => Collective::Scan {
                        count,
                        exclusive: kind == OpKind::ExScan,
                    },
                };
                for algo in self.algorithms(&[coll]) {
                    self.force(kind, algo);
                    for in_place in [true, false] {
                        let case = Case {
                            op: kind,
                            in_place: Some(in_place),
                            dtype,
                            reduce: Some(op),
                            counts: vec![count],
                            root: None,
                            algorithm: algo,
                            displaced: false,
                        };
                        if in_place {
                            let mut buf = self.upload(dtype, &inputs[self.me]);
                            let r = self.reduce_call(kind, buf.recv(), op);
                            self.done(&case, waited(r))?;
                            self.expect(&case, "", &*buf, want.as_ref().unwrap_or(&mine));
                        } else {
                            let send = self.upload(dtype, &inputs[self.me]);
                            let mut out = self.output(dtype, count);
                            let untouched = want.is_none().then(|| Expect::Exact(out.download()));
                            let r = self.reduce_call(kind, (send.send(), out.recv()), op);
                            self.done(&case, waited(r))?;
                            let want = want.as_ref().or(untouched.as_ref()).expect("one of them");
                            self.expect(&case, "", &*out, want);
                            self.expect(&case, SEND_CHANGED, &*send, &mine);
                        }
                    }
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    /// The call of [`Suite::elementwise`]'s `kind`.
    fn reduce_call<'b>(
        &self,
        kind: OpKind,
        io: impl crate::buffer::AsInOut<'b>,
        op: crate::dtype::ReduceOp,
    ) -> crate::Result<crate::Completion> {
        match kind {
            OpKind::AllReduce => self.comm.all_reduce(io, op),
            OpKind::Scan => self.comm.scan(io, op),
            _ => self.comm.exscan(io, op),
        }
    }

    /// Per-rank counts to run `kind` with: equal blocks of every count, or uneven vectors for
    /// a `v` variant.
    fn count_vectors(&self, v: bool) -> Vec<Vec<usize>> {
        match v {
            true => self.uneven_counts(),
            false => self.opts.counts.iter().map(|&c| vec![c; self.n]).collect(),
        }
    }

    /// How a case names its counts: the count, or a `v` call's vector.
    fn case_counts(v: bool, counts: &[usize]) -> Vec<usize> {
        match v {
            true => counts.to_vec(),
            false => counts[..1].to_vec(),
        }
    }

    pub(super) fn all_gather(&mut self, kind: OpKind) -> Step {
        let v = kind == OpKind::AllGatherV;
        for dtype in self.opts.dtypes.clone() {
            for counts in self.count_vectors(v) {
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..self.n)
                    .map(|r| self.input(seed, r, dtype, None, counts[r]))
                    .collect();
                let want = Expect::Exact(inputs.concat());
                let mine = Expect::Exact(inputs[self.me].clone());
                let total = counts.iter().sum();
                let coll = Collective::AllGather {
                    counts: counts.clone(),
                };
                for algo in self.algorithms(&[coll]) {
                    self.force(kind, algo);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: None,
                        counts: Self::case_counts(v, &counts),
                        root: None,
                        algorithm: algo,
                        displaced: false,
                    };
                    let send = self.upload(dtype, &inputs[self.me]);
                    let mut out = self.output(dtype, total);
                    let recv = parts_recv(out.recv(), v.then_some(counts.as_slice()));
                    let r = self.comm.all_gather(send.send(), recv);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &want);
                    self.expect(&case, SEND_CHANGED, &*send, &mine);
                }
                if v && self.opts.displaced {
                    // Blocks in reverse rank order with gaps, which must keep their pattern.
                    let (displs, len) = displaced(&counts);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: None,
                        counts: counts.clone(),
                        root: None,
                        algorithm: None,
                        displaced: true,
                    };
                    let want =
                        Expect::Exact(spread(&inputs.concat(), &counts, &displs, len, dtype));
                    let send = self.upload(dtype, &inputs[self.me]);
                    let mut out = self.output(dtype, len);
                    let recv = Parts::with_displs(out.recv(), &counts, &displs);
                    let r = self.comm.all_gather(send.send(), recv);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &want);
                    self.expect(&case, SEND_CHANGED, &*send, &mine);
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn gather(&mut self, kind: OpKind) -> Step {
        let v = kind == OpKind::GatherV;
        for dtype in self.opts.dtypes.clone() {
            for counts in self.count_vectors(v) {
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..self.n)
                    .map(|r| self.input(seed, r, dtype, None, counts[r]))
                    .collect();
                let want = Expect::Exact(inputs.concat());
                let mine = Expect::Exact(inputs[self.me].clone());
                let total = counts.iter().sum();
                for root in self.roots() {
                    let is_root = self.me == root;
                    let coll = Collective::Gather {
                        counts: counts.clone(),
                        root,
                    };
                    for algo in self.algorithms(&[coll]) {
                        self.force(kind, algo);
                        let case = Case {
                            op: kind,
                            in_place: None,
                            dtype,
                            reduce: None,
                            counts: Self::case_counts(v, &counts),
                            root: Some(root),
                            algorithm: algo,
                            displaced: false,
                        };
                        // Non-roots' receive buffers are not written: pass none.
                        let send = self.upload(dtype, &inputs[self.me]);
                        let mut out = self.output(dtype, if is_root { total } else { 0 });
                        let recv = parts_recv(out.recv(), v.then_some(counts.as_slice()));
                        let r = self.comm.gather(send.send(), recv, root);
                        self.done(&case, waited(r))?;
                        if is_root {
                            self.expect(&case, "", &*out, &want);
                        }
                        self.expect(&case, SEND_CHANGED, &*send, &mine);
                    }
                    if v && self.opts.displaced {
                        let (displs, len) = displaced(&counts);
                        let case = Case {
                            op: kind,
                            in_place: None,
                            dtype,
                            reduce: None,
                            counts: counts.clone(),
                            root: Some(root),
                            algorithm: None,
                            displaced: true,
                        };
                        let packed = match &want {
                            Expect::Exact(b) => b.clone(),
                            Expect::Approx { .. } => unreachable!("gathers move data exactly"),
                        };
                        let spread_want =
                            Expect::Exact(spread(&packed, &counts, &displs, len, dtype));
                        // Non-roots pass no buffer: their blocks are not checked.
                        let send = self.upload(dtype, &inputs[self.me]);
                        let mut out = self.output(dtype, if is_root { len } else { 0 });
                        let recv = Parts::with_displs(out.recv(), &counts, &displs);
                        let r = self.comm.gather(send.send(), recv, root);
                        self.done(&case, waited(r))?;
                        if is_root {
                            self.expect(&case, "", &*out, &spread_want);
                        }
                        self.expect(&case, SEND_CHANGED, &*send, &mine);
                    }
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn scatter(&mut self, kind: OpKind) -> Step {
        let v = kind == OpKind::ScatterV;
        for dtype in self.opts.dtypes.clone() {
            for counts in self.count_vectors(v) {
                let total = counts.iter().sum();
                let start: usize = counts[..self.me].iter().sum();
                for root in self.roots() {
                    let is_root = self.me == root;
                    let seed = self.next_seed();
                    let all = self.input(seed, root, dtype, None, total);
                    let whole = Expect::Exact(all.clone());
                    let want = whole.slice(dtype, start, counts[self.me]);
                    let coll = Collective::Scatter {
                        counts: counts.clone(),
                        root,
                    };
                    for algo in self.algorithms(&[coll]) {
                        self.force(kind, algo);
                        let case = Case {
                            op: kind,
                            in_place: None,
                            dtype,
                            reduce: None,
                            counts: Self::case_counts(v, &counts),
                            root: Some(root),
                            algorithm: algo,
                            displaced: false,
                        };
                        // Non-roots' send buffers are not read: pass none.
                        let send = self.upload(dtype, if is_root { &all } else { &[] });
                        let mut out = self.output(dtype, counts[self.me]);
                        let sent = parts_send(send.send(), v.then_some(counts.as_slice()));
                        let r = self.comm.scatter(sent, out.recv(), root);
                        self.done(&case, waited(r))?;
                        self.expect(&case, "", &*out, &want);
                        if is_root {
                            self.expect(&case, SEND_CHANGED, &*send, &whole);
                        }
                    }
                    if v && self.opts.displaced {
                        let (displs, len) = displaced(&counts);
                        let case = Case {
                            op: kind,
                            in_place: None,
                            dtype,
                            reduce: None,
                            counts: counts.clone(),
                            root: Some(root),
                            algorithm: None,
                            displaced: true,
                        };
                        let spread_all = spread(&all, &counts, &displs, len, dtype);
                        let send = self.upload(dtype, if is_root { &spread_all } else { &[] });
                        let mut out = self.output(dtype, counts[self.me]);
                        let sent = Parts::with_displs(send.send(), &counts, &displs);
                        let r = self.comm.scatter(sent, out.recv(), root);
                        self.done(&case, waited(r))?;
                        self.expect(&case, "", &*out, &want);
                        if is_root {
                            self.expect(&case, SEND_CHANGED, &*send, &Expect::Exact(spread_all));
                        }
                    }
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    pub(super) fn reduce_scatter(&mut self, kind: OpKind) -> Step {
        let v = kind == OpKind::ReduceScatterV;
        for (dtype, op) in self.dtype_ops() {
            for counts in self.count_vectors(v) {
                let total = counts.iter().sum();
                let start: usize = counts[..self.me].iter().sum();
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..self.n)
                    .map(|r| self.input(seed, r, dtype, Some(op), total))
                    .collect();
                let want =
                    reference::reduce(dtype, op, &inputs).slice(dtype, start, counts[self.me]);
                let mine = Expect::Exact(inputs[self.me].clone());
                let coll = Collective::ReduceScatter {
                    counts: counts.clone(),
                };
                for algo in self.algorithms(&[coll]) {
                    self.force(kind, algo);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: Some(op),
                        counts: Self::case_counts(v, &counts),
                        root: None,
                        algorithm: algo,
                        displaced: false,
                    };
                    let send = self.upload(dtype, &inputs[self.me]);
                    let mut out = self.output(dtype, counts[self.me]);
                    let sent = parts_send(send.send(), v.then_some(counts.as_slice()));
                    let r = self.comm.reduce_scatter(sent, out.recv(), op);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &want);
                    self.expect(&case, SEND_CHANGED, &*send, &mine);
                }
                if v && self.opts.displaced {
                    let (displs, len) = displaced(&counts);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: Some(op),
                        counts: counts.clone(),
                        root: None,
                        algorithm: None,
                        displaced: true,
                    };
                    let spread_in = spread(&inputs[self.me], &counts, &displs, len, dtype);
                    let send = self.upload(dtype, &spread_in);
                    let mut out = self.output(dtype, counts[self.me]);
                    let sent = Parts::with_displs(send.send(), &counts, &displs);
                    let r = self.comm.reduce_scatter(sent, out.recv(), op);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &want);
                    self.expect(&case, SEND_CHANGED, &*send, &Expect::Exact(spread_in));
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    /// Rank `r`'s block counts to each rank: equal blocks of each count, or (alltoallv) counts
    /// that differ by sender and receiver, zeros included.
    fn all_to_all_matrices(&self, v: bool) -> Vec<Vec<Vec<usize>>> {
        let (n, c) = (self.n, &self.opts.counts);
        match v {
            false => c.iter().map(|&k| vec![vec![k; n]; n]).collect(),
            true => vec![(0..n)
                .map(|r| (0..n).map(|j| c[(r + 2 * j + 1) % c.len()]).collect())
                .collect()],
        }
    }

    pub(super) fn all_to_all(&mut self, kind: OpKind) -> Step {
        let v = kind == OpKind::AllToAllV;
        let (n, me) = (self.n, self.me);
        for dtype in self.opts.dtypes.clone() {
            let esz = dtype.size();
            for m in self.all_to_all_matrices(v) {
                let send_counts = m[me].clone();
                let recv_counts: Vec<usize> = (0..n).map(|r| m[r][me]).collect();
                let seed = self.next_seed();
                let inputs: Vec<_> = (0..n)
                    .map(|r| self.input(seed, r, dtype, None, m[r].iter().sum()))
                    .collect();
                let want = Expect::Exact(
                    (0..n)
                        .flat_map(|src| {
                            let off: usize = m[src][..me].iter().sum();
                            inputs[src][off * esz..(off + m[src][me]) * esz].to_vec()
                        })
                        .collect(),
                );
                let mine = Expect::Exact(inputs[me].clone());
                // What every rank computes: its own send and receive counts.
                let colls: Vec<_> = (0..n)
                    .map(|r| Collective::AllToAll {
                        send_counts: m[r].clone(),
                        recv_counts: (0..n).map(|s| m[s][r]).collect(),
                    })
                    .collect();
                for algo in self.algorithms(&colls) {
                    self.force(kind, algo);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: None,
                        counts: Self::case_counts(v, &send_counts),
                        root: None,
                        algorithm: algo,
                        displaced: false,
                    };
                    let send = self.upload(dtype, &inputs[me]);
                    let mut out = self.output(dtype, recv_counts.iter().sum());
                    let sent = parts_send(send.send(), v.then_some(send_counts.as_slice()));
                    let recv = parts_recv(out.recv(), v.then_some(recv_counts.as_slice()));
                    let r = self.comm.all_to_all(sent, recv);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &want);
                    self.expect(&case, SEND_CHANGED, &*send, &mine);
                }
                if v && self.opts.displaced {
                    let (sd, slen) = displaced(&send_counts);
                    let (rd, rlen) = displaced(&recv_counts);
                    let case = Case {
                        op: kind,
                        in_place: None,
                        dtype,
                        reduce: None,
                        counts: send_counts.clone(),
                        root: None,
                        algorithm: None,
                        displaced: true,
                    };
                    let packed = match &want {
                        Expect::Exact(b) => b.clone(),
                        Expect::Approx { .. } => unreachable!("alltoall moves data exactly"),
                    };
                    let spread_want =
                        Expect::Exact(spread(&packed, &recv_counts, &rd, rlen, dtype));
                    let spread_in = spread(&inputs[me], &send_counts, &sd, slen, dtype);
                    let send = self.upload(dtype, &spread_in);
                    let mut out = self.output(dtype, rlen);
                    let sent = Parts::with_displs(send.send(), &send_counts, &sd);
                    let recv = Parts::with_displs(out.recv(), &recv_counts, &rd);
                    let r = self.comm.all_to_all(sent, recv);
                    self.done(&case, waited(r))?;
                    self.expect(&case, "", &*out, &spread_want);
                    self.expect(&case, SEND_CHANGED, &*send, &Expect::Exact(spread_in));
                }
            }
        }
        self.unforce(kind);
        Ok(())
    }

    /// Messages around a ring: rank `r` sends to `r + 1` and receives from `r - 1`.
    pub(super) fn ring(&mut self) -> Step {
        let (n, me) = (self.n, self.me);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        for dtype in self.opts.dtypes.clone() {
            for count in self.opts.counts.clone() {
                let seed = self.next_seed();
                let want = Expect::Exact(self.input(seed, prev, dtype, None, count));
                let data = self.input(seed, me, dtype, None, count);
                let case = Case {
                    op: OpKind::SendRecv,
                    in_place: None,
                    dtype,
                    reduce: None,
                    counts: vec![count],
                    root: None,
                    algorithm: None,
                    displaced: false,
                };
                let send = self.upload(dtype, &data);
                let mut out = self.output(dtype, count);
                // Tag 0: device messages are matched by order alone.
                let r = self.comm.sendrecv(send.send(), next, out.recv(), prev, 0);
                self.done(&case, waited(r))?;
                self.expect(&case, "", &*out, &want);
                self.expect(&case, SEND_CHANGED, &*send, &Expect::Exact(data));
            }
        }
        Ok(())
    }
}
