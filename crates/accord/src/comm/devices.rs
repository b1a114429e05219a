//! Several GPUs per process: one communicator per GPU, whose ranks are GPUs.
//!
//! A process that drives several GPUs (as with `ncclCommInitAll`) gets one [`Communicator`] per
//! GPU from [`Communicator::attach_devices`]. They take device buffers only (their ranks are
//! GPUs, several per process, so host buffers have no rank to live on); one thread drives them
//! all by issuing one operation on each inside [`crate::gpu::group`].

use super::*;
use crate::gpu::nccl::NcclUniqueId;
use crate::gpu::{Bootstrap, GpuCommunicator};

impl Communicator {
    /// One communicator per GPU in `ordinals`. Collective over this communicator: every rank
    /// passes the same number of GPUs, and GPU `i` of rank `r` becomes rank
    /// `r * ordinals.len() + i`. Issue their operations inside [`crate::gpu::group`].
    pub fn attach_devices(&self, ordinals: &[usize]) -> Result<Vec<Communicator>> {
        self.devices(ordinals, Bootstrap::OverHost)
    }

    /// Like [`Communicator::attach_devices`], joining the NCCL communicator of an id this
    /// process got some other way ([`crate::gpu::unique_id`]): it makes no collective call on
    /// this communicator first, so NCCL versions are not compared.
    pub fn attach_devices_with_id(
        &self,
        uid: &NcclUniqueId,
        ordinals: &[usize],
    ) -> Result<Vec<Communicator>> {
        self.devices(ordinals, Bootstrap::NcclId(uid))
    }

    fn devices(&self, ordinals: &[usize], how: Bootstrap<'_>) -> Result<Vec<Communicator>> {
        self.host_only("attach_devices")?;
        if ordinals.is_empty() {
            return Err(Error::invalid("attach_devices needs at least one GPU"));
        }
        let host = Arc::new(self.clone());
        let engines = GpuCommunicator::create(host, ordinals, how)?;
        let per_process = ordinals.len();
        let label = format!("{}/gpus", self.name());
        // GPU rank r lives in process r / per_process unless the engine says otherwise.
        let process = |h: usize| self.inner.ranks.get(h).copied();
        Ok(engines
            .into_iter()
            .map(|g| {
                let guess = |r: usize| process(r / per_process);
                self.inner.device_rank(g, &process, &guess, &label)
            })
            .collect())
    }

    /// Split communicators of this process's GPUs (from [`Communicator::attach_devices`])
    /// together: `how[i]` is the `(color, key)` of `comms[i]`, as in [`Communicator::split`].
    /// GPUs of one process may pick different colors.
    ///
    /// Every rank first posts its `(color, key)` to the rendezvous store and waits, under the
    /// timeout, until all ranks have: a rank that never calls split is named in a timeout
    /// instead of leaving the others blocked inside the library.
    pub fn split_devices(
        comms: &[Communicator],
        how: &[(Option<u32>, i64)],
    ) -> Result<Vec<Option<Communicator>>> {
        let engines = comms
            .iter()
            .map(|c| match c.inner.host_side {
                false => c.device_engine().cloned(),
                true => Err(Error::invalid(
                    "split_devices splits the communicators of attach_devices; split this one \
                     with split",
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let children = GpuCommunicator::split_group(&engines, how)?;
        Ok(comms
            .iter()
            .zip(children)
            .map(|(parent, child)| {
                let label = format!("{}/split", parent.name());
                // The parent's GPU ranks say which transport rank holds each process.
                let parent_engine = parent.inner.device.get()?;
                let pairs: Vec<(usize, usize)> = parent_engine
                    .host_of()
                    .unwrap_or_default()
                    .iter()
                    .copied()
                    .zip(parent.inner.ranks.iter().copied())
                    .collect();
                let process =
                    |h: usize| pairs.iter().find(|&&(host, _)| host == h).map(|&(_, t)| t);
                let me = parent.inner.ranks[parent.inner.rank];
                child.map(|g| parent.inner.device_rank(g, &process, &|_| Some(me), &label))
            })
            .collect())
    }

    /// Refuse host buffers on a communicator whose ranks are GPUs.
    #[inline(always)]
    pub(super) fn host_only(&self, what: &str) -> Result<()> {
        match self.inner.host_side {
            true => Ok(()),
            false => Err(self.no_host(what)),
        }
    }

    #[cold]
    fn no_host(&self, what: &str) -> Error {
        Error::invalid(format!(
            "{what}: communicator {} drives one of several GPUs of its process and takes \
             device buffers only; use the process's own communicator for host buffers",
            self.name()
        ))
    }

    /// A barrier on a communicator whose ranks are GPUs: ordered on the device, waited for here.
    pub(super) fn device_barrier(&self) -> Result<()> {
        crate::gpu::not_in_group("a barrier of a communicator of several GPUs")?;
        self.check_poison()?;
        let g = self.device_engine()?;
        g.barrier()?.wait()
    }
}

impl Inner {
    /// The communicator of one GPU: its ranks are the device engine's, mapped to the transport
    /// rank of the process that holds each: `process` maps a rank of the communicator the
    /// engine was bootstrapped over, where the engine knows it, `guess` a GPU rank otherwise.
    fn device_rank(
        &self,
        g: GpuCommunicator,
        process: &dyn Fn(usize) -> Option<usize>,
        guess: &dyn Fn(usize) -> Option<usize>,
        label: &str,
    ) -> Communicator {
        let me = self.ranks[self.rank];
        let host_of = g.host_of().map(<[usize]>::to_vec);
        let ranks = (0..g.size())
            .map(|r| match &host_of {
                Some(h) => h.get(r).and_then(|&h| process(h)),
                None => guess(r),
            })
            .map(|t| t.unwrap_or(me))
            .collect();
        let mut id = crate::fingerprint::hash_counts(&[self.id as usize, g.size(), 0x6770_7573]);
        if id <= 1 {
            id = 2; // 1 is the world
        }
        let mut c = self.derived(ranks, g.rank(), id, label.to_string());
        let inner = Arc::get_mut(&mut c.inner).expect("just made");
        inner.host_side = false;
        let _ = inner.device.set(g);
        c.register();
        c
    }
}
