//! One conformance suite for every engine: every collective and ring messages, over counts,
//! element types, reduce operators, roots, uneven count vectors, in place and out of place and
//! (where the engine runs schedules) every applicable algorithm, checked against a sequential
//! reference on random data.
//!
//! Every rank runs [`check`] with the same [`Options`]; all of them make the same calls in the
//! same order. Inputs come from a seed, so each rank regenerates every rank's input and checks
//! its own outputs against a reference it computes locally (see `reference`): no result is
//! gathered to be checked, so a broken collective cannot hide its own bug.
//!
//! What is checked, per operation:
//!
//! | operation | variants |
//! |---|---|
//! | barrier | completes |
//! | broadcast, reduce | every root pattern (first, last, middle); in place and out of place; a non-root's in-place reduce buffer is left unchanged |
//! | allreduce | in place and out of place |
//! | allgather, gather, scatter, reduce_scatter, alltoall | equal blocks of every count |
//! | their `v` variants | uneven count vectors with zeros (one rank holding everything, counts rotating over [`Options::counts`]); for alltoallv, counts that differ by sender and receiver; with [`Options::displaced`], each vector once more with displacements ([`Parts::with_displs`]: blocks in reverse rank order with gaps, which must keep what they held) |
//! | sendrecv | a ring: rank `r` sends to `r + 1` and receives from `r - 1` (itself in a world of one) |
//!
//! Out of place, the send buffer must come back unchanged. Reductions run every
//! (type, operator) pair the library defines, averages included: integers must match exactly
//! (they wrap), float minima and maxima too; float sums, products and averages within a bound
//! on the rounding of any summation order.
//!
//! A failure names the engine and memory, the world size and rank, the operation, type, reduce
//! operator, count or counts, root and algorithm, and the first wrong element with what it held
//! and what it should have held. A call that returns an error ends the run (the communicator is
//! poisoned); wrong results do not, so every rank still makes every call.
//!
//! Where buffers live is a [`Memory`]: [`HostMemory`] here; a GPU implementation uploads to
//! device memory and hands out [`SendBuf::device`] / [`RecvBuf::device`] (see [`Memory`]).
//!
//! ```
//! use accord::testing::{conformance, run_world};
//! let opts = conformance::Options {
//!     counts: vec![0, 3],
//!     ..conformance::Options::new("in-process")
//! };
//! for summary in run_world(2, |comm| conformance::check(&comm, &conformance::HostMemory, &opts)) {
//!     assert!(summary.unwrap().cases > 0);
//! }
//! ```

mod cases;
mod reference;

use self::reference::{first_mismatch, random, seed_of, Expect};
use crate::buffer::{Parts, RecvBuf, SendBuf};
use crate::dtype::{DataType, ReduceOp};
use crate::fingerprint::OpKind;
use crate::schedule::{algorithms, Algorithm, Collective};
use crate::{Communicator, Completion};
use std::fmt;

/// Where the suite's buffers live.
///
/// The suite needs four things from a memory: put bytes into a new buffer
/// ([`Memory::upload`]), lend that buffer to an operation as its input ([`Buffer::send`]) or
/// output ([`Buffer::recv`]), and read it back ([`Buffer::download`]). It waits on every
/// operation's [`Completion`] (which, for device work, blocks until the work has finished on
/// its stream) before downloading, and drops buffers when it is done with them. Buffers may be
/// empty.
///
/// [`HostMemory`] keeps a `Vec<u8>`. A device implementation allocates and copies in
/// `upload`, lends [`SendBuf::device`] / [`RecvBuf::device`] over its allocation, copies back
/// in `download` and frees the allocation on drop; with [`crate::gpu::DeviceBuffer`]:
///
/// ```ignore
/// struct Gpu<'g>(&'g Communicator); // with a device attached
/// struct GpuBuf(DeviceBuffer<u8>, DeviceSlice);
///
/// impl Memory for Gpu<'_> {
///     fn name(&self) -> String { format!("cuda:{}", self.0.attached_device().unwrap()) }
///     fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_> {
///         let b = self.0.device_copy(bytes).unwrap();
///         // SAFETY: the allocation outlives the slice (both live in GpuBuf).
///         let s = unsafe { DeviceSlice::from_raw(b.slice().ptr(), bytes.len() / dtype.size(), dtype) };
///         Box::new(GpuBuf(b, s))
///     }
/// }
///
/// impl Buffer for GpuBuf {
///     fn send(&self) -> SendBuf<'_> { SendBuf::device(self.1, Stream::Comm) }
///     fn recv(&mut self) -> RecvBuf<'_> { RecvBuf::device(self.1, Stream::Comm) }
///     fn download(&self) -> Vec<u8> { self.0.to_host().unwrap() }
/// }
/// ```
///
/// Every rank calls `upload`, `send` and `recv` the same number of times in the same order
/// (`recv` once per call, just before it), so an implementation may meet the other ranks there:
/// where threads of one process drive several GPUs, no allocation or free may run while a peer's
/// kernel waits for this rank, and a host barrier in `recv` keeps them apart.
///
/// Device engines usually define fewer reduce operators than the host (NCCL has no bitwise
/// ones): restrict [`Options::reduce_ops`] and [`Options::kinds`] to what the engine offers.
pub trait Memory {
    /// What failure messages call this memory (`host`, `cuda:0`).
    fn name(&self) -> String;
    /// A new buffer of `bytes.len()` bytes holding `bytes`, elements of `dtype`.
    fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_>;
}

/// One buffer of a [`Memory`].
pub trait Buffer {
    /// The buffer as an operation's input.
    fn send(&self) -> SendBuf<'_>;
    /// The buffer as an operation's output (or its input and output, in place).
    fn recv(&mut self) -> RecvBuf<'_>;
    /// The buffer's bytes, once the operations that write it have completed.
    fn download(&self) -> Vec<u8>;
}

/// Buffers in host memory (`Vec<u8>`, passed as [`SendBuf::bytes`] / [`RecvBuf::bytes`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory;

struct HostBuffer {
    dtype: DataType,
    bytes: Vec<u8>,
}

impl Memory for HostMemory {
    fn name(&self) -> String {
        "host".into()
    }

    fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_> {
        Box::new(HostBuffer {
            dtype,
            bytes: bytes.to_vec(),
        })
    }
}

impl Buffer for HostBuffer {
    fn send(&self) -> SendBuf<'_> {
        SendBuf::bytes(&self.bytes, self.dtype)
    }

    fn recv(&mut self) -> RecvBuf<'_> {
        RecvBuf::bytes(&mut self.bytes, self.dtype)
    }

    fn download(&self) -> Vec<u8> {
        self.bytes.clone()
    }
}

/// Which algorithms the suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithms {
    /// Whatever the engine picks (shared memory, NCCL, or the tuner's choice of schedule).
    EnginesChoice,
    /// The engine's choice, then every schedule algorithm that applies to the call, forced in
    /// turn with [`Communicator::force_algorithm`]: for engines that run schedules over a
    /// transport.
    EachApplicable,
}

/// What to run. Every rank must pass the same options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The engine's name, for failure messages.
    pub engine: String,
    /// Seed of every input.
    pub seed: u64,
    /// Element counts: of whole buffers (broadcast, reduce, allreduce, sendrecv), of each
    /// rank's block (allgather, gather, scatter, reduce_scatter, alltoall), and the values that
    /// uneven count vectors are made of.
    pub counts: Vec<usize>,
    /// Element types.
    pub dtypes: Vec<DataType>,
    /// Reduce operators (each runs with every type in `dtypes` it is defined for).
    pub reduce_ops: Vec<ReduceOp>,
    /// Which (type, operator) pairs the engine reduces: by default every pair the library
    /// defines; device engines lack a few (see [`crate::gpu::reduces_on_device`]).
    pub reduces: fn(DataType, ReduceOp) -> bool,
    /// Operations to run (`v` variants are kinds of their own; [`OpKind::SendRecv`] is the
    /// ring of messages).
    pub kinds: Vec<OpKind>,
    /// Which algorithms.
    pub algorithms: Algorithms,
    /// Whether each `v` call also runs once (with the engine's algorithm) with displacements:
    /// blocks in reverse rank order with gaps, on both sides that have blocks.
    pub displaced: bool,
}

impl Options {
    /// Everything: counts 0, 1, 7 and 1031 (odd, so blocks never divide evenly), every type,
    /// every operator, every operation, the engine's choice of algorithm.
    pub fn new(engine: impl Into<String>) -> Self {
        Options {
            engine: engine.into(),
            seed: 0x00c0_ffee,
            counts: vec![0, 1, 7, 1031],
            dtypes: DataType::ALL.to_vec(),
            reduce_ops: ReduceOp::ALL.to_vec(),
            reduces: |d, o| o.supports(d),
            kinds: OpKind::ALL
                .into_iter()
                .filter(|&k| k != OpKind::P2p)
                .collect(),
            algorithms: Algorithms::EnginesChoice,
            displaced: true,
        }
    }
}

/// What a passing run checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Calls made and checked.
    pub cases: usize,
}

/// One call the suite made, as failure messages name it.
#[derive(Debug, Clone)]
pub struct Case {
    /// Operation (`allreduce`, `gatherv`, ...).
    pub op: OpKind,
    /// Whether the call was in place (`None` where the operation has one form only).
    pub in_place: Option<bool>,
    /// Element type.
    pub dtype: DataType,
    /// Reduce operator, for reductions.
    pub reduce: Option<ReduceOp>,
    /// The count, or the per-rank counts of a `v` variant (this rank's send counts for
    /// alltoallv).
    pub counts: Vec<usize>,
    /// Root, for rooted operations.
    pub root: Option<usize>,
    /// The forced algorithm, or `None` for the engine's choice.
    pub algorithm: Option<Algorithm>,
    /// Whether the blocks were placed with displacements ([`Options::displaced`]).
    pub displaced: bool,
}

/// A call that failed or gave a wrong result.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The engine ([`Options::engine`]) and memory.
    pub engine: String,
    /// World size.
    pub world: usize,
    /// The rank that saw it.
    pub rank: usize,
    /// The call.
    pub case: Case,
    /// What was wrong: the error, or the first wrong element with what it held and should have.
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.case;
        write!(
            f,
            "[{}] world {} rank {}: {}",
            self.engine, self.world, self.rank, c.op
        )?;
        match c.in_place {
            Some(true) => write!(f, " in place")?,
            Some(false) => write!(f, " out of place")?,
            None => {}
        }
        write!(f, " {}", c.dtype)?;
        if let Some(r) = c.reduce {
            write!(f, " {r}")?;
        }
        match c.counts.as_slice() {
            [n] => write!(f, " count {n}")?,
            counts => write!(f, " counts {counts:?}")?,
        }
        if let Some(r) = c.root {
            write!(f, " root {r}")?;
        }
        if c.displaced {
            write!(f, " with displacements")?;
        }
        match c.algorithm {
            Some(a) => write!(f, " algorithm {a}")?,
            None => write!(f, " engine's algorithm")?,
        }
        write!(f, ": {}", self.what)
    }
}

/// The failures of a run (the first [`MAX_REPORTED`]), and how many there were.
#[derive(Clone)]
pub struct Failures {
    /// The first failures, in the order they happened.
    pub first: Vec<Failure>,
    /// How many calls failed in all.
    pub total: usize,
    /// The run's seed ([`Options::seed`]): the same seed makes the same inputs.
    pub seed: u64,
}

/// Failures reported in full; later ones are only counted.
pub const MAX_REPORTED: usize = 10;

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} conformance failure(s) (seed {:#x}):",
            self.total, self.seed
        )?;
        for x in &self.first {
            writeln!(f, "  {x}")?;
        }
        if self.total > self.first.len() {
            writeln!(f, "  ... and {} more", self.total - self.first.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Run the suite on this rank of `comm` with buffers in `mem`. Every rank of `comm` must call it
/// with the same options. A call that returns an error ends the run (the communicator is
/// poisoned); wrong results are collected and the run goes on, so every rank makes every call.
pub fn check(comm: &Communicator, mem: &dyn Memory, opts: &Options) -> Result<Summary, Failures> {
    let mut suite = Suite {
        comm,
        mem,
        opts,
        engine: format!("{}; {} memory", opts.engine, mem.name()),
        n: comm.size(),
        me: comm.rank(),
        case_seq: 0,
        summary: Summary::default(),
        failures: Failures {
            first: Vec::new(),
            total: 0,
            seed: opts.seed,
        },
    };
    // An error poisons the communicator: later calls would only repeat it.
    let _ = suite.run_all();
    if suite.failures.total == 0 {
        Ok(suite.summary)
    } else {
        Err(suite.failures)
    }
}

/// A call returned an error; the run stops.
struct Stop;

type Step = Result<(), Stop>;

struct Suite<'a> {
    comm: &'a Communicator,
    mem: &'a dyn Memory,
    opts: &'a Options,
    engine: String,
    n: usize,
    me: usize,
    /// Inputs of the k-th data set come from seed (options' seed, k, rank): every rank counts
    /// data sets in the same order.
    case_seq: u64,
    summary: Summary,
    failures: Failures,
}

impl<'a> Suite<'a> {
    fn run_all(&mut self) -> Step {
        let kinds = self.opts.kinds.clone();
        for kind in kinds {
            match kind {
                OpKind::Barrier => self.barrier()?,
                OpKind::Broadcast => self.broadcast()?,
                OpKind::Reduce => self.reduce()?,
                OpKind::AllReduce => self.all_reduce()?,
                OpKind::AllGather | OpKind::AllGatherV => self.all_gather(kind)?,
                OpKind::Gather | OpKind::GatherV => self.gather(kind)?,
                OpKind::Scatter | OpKind::ScatterV => self.scatter(kind)?,
                OpKind::ReduceScatter | OpKind::ReduceScatterV => self.reduce_scatter(kind)?,
                OpKind::AllToAll | OpKind::AllToAllV => self.all_to_all(kind)?,
                OpKind::SendRecv => self.ring()?,
                OpKind::Scan | OpKind::ExScan => self.scan(kind)?,
                OpKind::P2p => {}
            }
        }
        Ok(())
    }

    /// A fresh seed for one data set; `inputs(..)` derives every rank's input from it.
    fn next_seed(&mut self) -> u64 {
        self.case_seq += 1;
        seed_of(&[self.opts.seed, self.case_seq])
    }

    /// Rank `rank`'s input of the data set `seed`.
    fn input(
        &self,
        seed: u64,
        rank: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        count: usize,
    ) -> Vec<u8> {
        random(dtype, op, count, seed_of(&[seed, rank as u64]))
    }

    /// Every (type, operator) pair of the options that the library defines.
    fn dtype_ops(&self) -> Vec<(DataType, ReduceOp)> {
        let mut v = Vec::new();
        for &d in &self.opts.dtypes {
            for &o in &self.opts.reduce_ops {
                if (self.opts.reduces)(d, o) {
                    v.push((d, o));
                }
            }
        }
        v
    }

    /// Roots to try: first, last and middle rank.
    fn roots(&self) -> Vec<usize> {
        let mut r = vec![0, self.n - 1, self.n / 2];
        r.dedup();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// Uneven per-rank counts, with zeros: one rank holding the largest count and the others
    /// none, and counts rotating over the options' counts.
    fn uneven_counts(&self) -> Vec<Vec<usize>> {
        let c = &self.opts.counts;
        let big = c.iter().copied().max().unwrap_or(0);
        let one_holds_all: Vec<usize> = (0..self.n)
            .map(|r| if r == self.n / 2 { big } else { 0 })
            .collect();
        let rotating: Vec<usize> = (0..self.n).map(|r| c[(r + 1) % c.len()]).collect();
        vec![one_holds_all, rotating]
    }

    /// The algorithms to run a call with: each that applies to what every rank computes
    /// (`colls`, one per rank where they differ), or the engine's choice.
    fn algorithms(&self, colls: &[Collective]) -> Vec<Option<Algorithm>> {
        match self.opts.algorithms {
            Algorithms::EnginesChoice => vec![None],
            Algorithms::EachApplicable => std::iter::once(None)
                .chain(
                    algorithms::applicable(&colls[0])
                        .iter()
                        .filter(|a| colls.iter().all(|c| algorithms::applicable(c).contains(a)))
                        .map(|&a| Some(a)),
                )
                .collect(),
        }
    }

    /// Make `algo` the algorithm of `kind`'s calls (`None`: the engine's choice).
    fn force(&self, kind: OpKind, algo: Option<Algorithm>) {
        if self.opts.algorithms == Algorithms::EachApplicable {
            self.comm.force_algorithm(base_kind(kind), algo);
        }
    }

    /// Undo [`Suite::force`] once a kind's calls are done.
    fn unforce(&self, kind: OpKind) {
        if self.opts.algorithms == Algorithms::EachApplicable {
            self.comm.force_algorithm(base_kind(kind), None);
        }
    }

    fn fail(&mut self, case: &Case, what: String) {
        self.failures.total += 1;
        if self.failures.first.len() < MAX_REPORTED {
            self.failures.first.push(Failure {
                engine: self.engine.clone(),
                world: self.n,
                rank: self.me,
                case: case.clone(),
                what,
            });
        }
    }

    /// The outcome of a call: completed, or recorded as a failure that stops the run.
    fn done(&mut self, case: &Case, r: crate::Result<()>) -> Step {
        self.summary.cases += 1;
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.fail(case, format!("error: {e}"));
                Err(Stop)
            }
        }
    }

    /// Compare a buffer with what it must hold; `what` names the buffer when it is not the
    /// output.
    fn expect(&mut self, case: &Case, what: &str, buf: &dyn Buffer, want: &Expect) {
        if let Some(m) = first_mismatch(case.dtype, &buf.download(), want) {
            self.fail(case, format!("{what}{m}"));
        }
    }

    /// An output buffer of `count` elements filled with a pattern no result should equal
    /// everywhere.
    fn output(&self, dtype: DataType, count: usize) -> Box<dyn Buffer + 'a> {
        self.mem.upload(dtype, &vec![0xa5; count * dtype.size()])
    }

    /// A buffer holding `bytes`.
    fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + 'a> {
        self.mem.upload(dtype, bytes)
    }
}

/// A call's result once it has completed (at once on host memory; on its stream on a device).
fn waited(r: crate::Result<Completion>) -> crate::Result<()> {
    r.and_then(|c| c.wait())
}

/// The kind [`Communicator::force_algorithm`] keys on (the `v` variants share their base's).
fn base_kind(kind: OpKind) -> OpKind {
    match kind {
        OpKind::AllGatherV => OpKind::AllGather,
        OpKind::GatherV => OpKind::Gather,
        OpKind::ScatterV => OpKind::Scatter,
        OpKind::ReduceScatterV => OpKind::ReduceScatter,
        OpKind::AllToAllV => OpKind::AllToAll,
        k => k,
    }
}

/// Displacements that place the blocks of `counts` in reverse rank order, one or two elements
/// apart with one before the first and two after the last; and the buffer length they need.
fn displaced(counts: &[usize]) -> (Vec<usize>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut at = 1;
    for (i, &c) in counts.iter().enumerate().rev() {
        displs[i] = at;
        at += c + 1 + i % 2;
    }
    (displs, at + 1)
}

/// The blocks of `packed` (back to back, `counts` elements of `dtype` each) at `displs` in a
/// buffer of `len` elements whose other bytes hold the suite's output pattern.
fn spread(
    packed: &[u8],
    counts: &[usize],
    displs: &[usize],
    len: usize,
    dtype: DataType,
) -> Vec<u8> {
    let esz = dtype.size();
    let mut out = vec![0xa5; len * esz];
    let mut from = 0;
    for (&c, &d) in counts.iter().zip(displs) {
        out[d * esz..(d + c) * esz].copy_from_slice(&packed[from * esz..(from + c) * esz]);
        from += c;
    }
    out
}

/// `buf` as a `v` call's buffer when `counts` is given.
fn parts_send<'a>(buf: SendBuf<'a>, counts: Option<&'a [usize]>) -> SendBuf<'a> {
    match counts {
        Some(c) => crate::buffer::AsSend::into_send(Parts::new(buf, c)),
        None => buf,
    }
}

fn parts_recv<'a>(buf: RecvBuf<'a>, counts: Option<&'a [usize]>) -> RecvBuf<'a> {
    match counts {
        Some(c) => crate::buffer::AsRecv::into_recv(Parts::new(buf, c)),
        None => buf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::run_world;

    /// Host memory that misreports what a buffer holds: `download` flips the first byte.
    struct Flipping;

    struct FlippingBuffer(Box<dyn Buffer>);

    impl Memory for Flipping {
        fn name(&self) -> String {
            "flipping".into()
        }
        fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_> {
            Box::new(FlippingBuffer(HostMemory.upload(dtype, bytes)))
        }
    }

    impl Buffer for FlippingBuffer {
        fn send(&self) -> SendBuf<'_> {
            self.0.send()
        }
        fn recv(&mut self) -> RecvBuf<'_> {
            self.0.recv()
        }
        fn download(&self) -> Vec<u8> {
            let mut b = self.0.download();
            if let Some(x) = b.first_mut() {
                *x ^= 1;
            }
            b
        }
    }

    fn small(engine: &str) -> Options {
        Options {
            counts: vec![0, 2],
            algorithms: Algorithms::EachApplicable,
            ..Options::new(engine)
        }
    }

    #[test]
    fn host_memory_passes_and_counts_its_calls() {
        let opts = small("unit");
        for r in run_world(3, |c| check(&c, &HostMemory, &opts)) {
            assert!(r.unwrap().cases > 100);
        }
    }

    #[test]
    fn a_wrong_result_is_named_with_its_call_and_element() {
        let opts = small("unit");
        let results = run_world(2, |c| check(&c, &Flipping, &opts));
        for (rank, r) in results.into_iter().enumerate() {
            let f = r.unwrap_err();
            assert!(f.total > MAX_REPORTED, "{f}");
            assert_eq!(f.first.len(), MAX_REPORTED);
            let first = f.first[0].to_string();
            let want = format!(
                "[unit; flipping memory] world 2 rank {rank}: broadcast in place f16 count 2 \
                 root 0 engine's algorithm: element 0: got "
            );
            assert!(first.starts_with(&want), "{first}");
            let all = f.to_string();
            assert!(
                all.contains("(seed 0xc0ffee)") && all.contains("more"),
                "{all}"
            );
        }
    }

    /// Host memory whose receive buffers are one byte short: every call is refused.
    struct Short;

    struct ShortBuffer(Vec<u8>, DataType);

    impl Memory for Short {
        fn name(&self) -> String {
            "short".into()
        }
        fn upload(&self, dtype: DataType, bytes: &[u8]) -> Box<dyn Buffer + '_> {
            Box::new(ShortBuffer(bytes.to_vec(), dtype))
        }
    }

    impl Buffer for ShortBuffer {
        fn send(&self) -> SendBuf<'_> {
            SendBuf::bytes(&self.0, self.1)
        }
        fn recv(&mut self) -> RecvBuf<'_> {
            let n = self.0.len().saturating_sub(1);
            RecvBuf::bytes(&mut self.0[..n], self.1)
        }
        fn download(&self) -> Vec<u8> {
            self.0.clone()
        }
    }

    #[test]
    fn an_error_ends_the_run_and_is_reported() {
        let opts = Options {
            kinds: vec![OpKind::AllReduce, OpKind::AllGather],
            ..small("unit")
        };
        for r in run_world(2, |c| check(&c, &Short, &opts)) {
            let f = r.unwrap_err();
            assert_eq!(f.total, 1, "{f}");
            let msg = f.first[0].to_string();
            assert!(msg.contains("allreduce in place f16 sum count 2"), "{msg}");
            assert!(msg.contains("error: "), "{msg}");
        }
    }
}
