//! Sub-communicators: `split` by color and key, `subgroup` by a list of ranks.

use super::*;

impl Communicator {
    /// Split into disjoint communicators: ranks passing the same `color` form one, ordered by
    /// (`key`, current rank). Ranks passing `None` get `None`. Collective over this communicator.
    ///
    /// A communicator of one GPU per process from [`Communicator::attach_devices`] splits its
    /// device engine; those of several GPUs per process split together with
    /// [`Communicator::split_devices`].
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        if !self.inner.host_side {
            if self.device_engine()?.multi() {
                return Err(Error::invalid(
                    "this communicator drives one of several GPUs of its process: split all \
                     of them at once with Communicator::split_devices",
                ));
            }
            let mut v = Self::split_devices(std::slice::from_ref(self), &[(color, key)])?;
            return Ok(v.pop().flatten());
        }
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * self.size()];
        self.all_gather(&mine, &mut all)?;
        let split_no = self.inner.splits.fetch_add(1, Ordering::Relaxed);
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] == color as i64)
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort();
        let ranks: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        Ok(Some(self.child(
            &ranks,
            split_no,
            &format!("split{split_no}/color{color}"),
            color as u64,
        )))
    }

    /// A communicator of the listed ranks (in that order). Collective over this communicator:
    /// every rank calls it with the same list; ranks not listed get `None`.
    pub fn subgroup(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        self.host_only("subgroup")?;
        for (i, &r) in ranks.iter().enumerate() {
            self.check_rank("subgroup member", r)?;
            if ranks[..i].contains(&r) {
                return Err(Error::invalid(format!("subgroup lists rank {r} twice")));
            }
        }
        // Agreeing on the list is part of the call's fingerprint: a broadcast of its hash.
        let mut h = [crate::fingerprint::hash_counts(ranks)];
        let mine = h[0];
        self.broadcast(&mut h, 0)?;
        if h[0] != mine {
            return Err(self.fail(Error::invalid(format!(
                "subgroup: rank {} passed a different rank list than rank 0",
                self.rank()
            ))));
        }
        let split_no = self.inner.splits.fetch_add(1, Ordering::Relaxed);
        if !ranks.contains(&self.rank()) {
            return Ok(None);
        }
        Ok(Some(self.child(
            ranks,
            split_no,
            &format!("group{split_no}"),
            mine,
        )))
    }

    /// A child over `members` (ranks of this communicator).
    pub(super) fn child(
        &self,
        members: &[usize],
        split_no: u64,
        label: &str,
        salt: u64,
    ) -> Communicator {
        self.child_shown(members, split_no, label, salt, false)
    }

    /// Like [`Communicator::child`], for a communicator that runs steps of this one's calls (the
    /// hierarchy's leaders and stripes): its errors name ranks as this communicator does, and it
    /// shares this one's deadline.
    pub(super) fn step_child(
        &self,
        members: &[usize],
        split_no: u64,
        label: &str,
        salt: u64,
    ) -> Communicator {
        self.child_shown(members, split_no, label, salt, true)
    }

    fn child_shown(
        &self,
        members: &[usize],
        split_no: u64,
        label: &str,
        salt: u64,
        shown: bool,
    ) -> Communicator {
        let p = &self.inner;
        let ranks: Vec<usize> = members.iter().map(|&r| p.ranks[r]).collect();
        let rank = members
            .iter()
            .position(|&r| r == p.rank)
            .expect("caller is a member");
        let mut id =
            crate::fingerprint::hash_counts(&[p.id as usize, split_no as usize, salt as usize]);
        if id <= 1 {
            id = 2; // 1 is the world
        }
        let mut c = p.derived(ranks, rank, id, format!("{}/{label}", p.name));
        if shown {
            let inner = Arc::get_mut(&mut c.inner).expect("just made");
            inner.shown_as = Some(members.to_vec());
            inner.timeout = p.timeout.clone();
        }
        c.register();
        c
    }
}

impl Inner {
    /// A communicator over the same transport and resources as this one, with its own order,
    /// poison and plans: `ranks` maps its ranks to transport ranks. Not yet visible to
    /// flight-record dumps: the caller registers it once it is complete.
    pub(super) fn derived(
        &self,
        ranks: Vec<usize>,
        rank: usize,
        id: u64,
        name: String,
    ) -> Communicator {
        Communicator {
            inner: Arc::new(Inner {
                transport: self.transport.clone(),
                ranks,
                shown_as: None,
                rank,
                id,
                name,
                seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                timeout: Arc::new(AtomicDuration::new(self.timeout.get())),
                poison: Mutex::new(None),
                poisoned: Default::default(),
                closed: Default::default(),
                cache: Mutex::default(),
                forced: Mutex::new(HashMap::new()),
                explain: self.explain,
                explained: Default::default(),
                model: self.model,
                engines: Vec::new(),
                resources: self.resources.clone(),
                turns: Arc::default(),
                device: Default::default(),
                attaching: Default::default(),
                host_side: true,
                symmetric: Default::default(),
                flight: crate::observe::new_recorder(),
            }),
            reserved: None,
        }
    }
}
