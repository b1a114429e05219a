//! `accord sim --profile`: what a call would take on hosts x ranks per host, priced with a
//! profile measured by `accord bench --calibrate`, following the path Accord takes there:
//!
//! - one host: the shared-memory engine's measured times (interpolated between sizes, log-log),
//!   or, for what the engine does not run, the schedule over the point-to-point rings;
//! - one rank per host: the schedule the tuner picks for TCP (with its built-in costs, or the
//!   profile `ACCORD_TUNER_PROFILE` names, as the library does), simulated message by message
//!   with the measured message times (one way, or both ways at once where the sender receives at
//!   least half as much in the same round, from its peer or another: a ring's round; a
//!   zero-byte token does not load the link) and the reduction's cost measured for arrays of
//!   the call's size (beyond the caches it runs at memory's pace);
//! - several ranks per host, hierarchically: allreduce and broadcast take the engine's step
//!   inside each host, the leaders' schedule between hosts and the engine's broadcast; on hosts
//!   of two ranks an allreduce whose copies on the host stay below 64 KiB together
//!   (`ACCORD_HIER_STRIPE_BYTES`) takes every rank's schedule over its stripe with the whole
//!   vector instead, all at once, and from 64 KiB it is striped (the engine's reduce-scatter,
//!   one slice's allreduce per local rank between hosts, the engine's allgather; from 32 MiB in
//!   four pieces whose host and network steps overlap, but not on one machine, where they
//!   compete for its memory); reduce-scatter and allgather below 1 MiB
//!   (`ACCORD_HIER_BLOCKS_BYTES`) and all-to-all of blocks below 32 KiB
//!   (`ACCORD_HIER_ALLTOALL_BLOCK_BYTES`) go over the stripes (the engine's step inside each
//!   host, one schedule per local rank between hosts, all at once), larger ones after a
//!   barrier inside each host and one on each stripe; a barrier meets inside each host, then
//!   on every stripe at once, then inside each host again; everything else is one schedule
//!   over all ranks whose messages cost the shared-memory rings' price inside a host and TCP's
//!   between hosts (ranks placed host by host).
//!
//! Messages of one round that compete for the same resource cost more, by the slowdown the
//! calibration measured with several pairs of ranks exchanging at once (the profile's `crowd`:
//! a round of `m` such messages is priced as `m / 2` pairs): with `--one-machine` (the hosts
//! are network namespaces or ranks of the machine that was calibrated, as `bench/multihost.sh`
//! and `bench/sim_check.sh` run them) every message of a round, network or shared memory,
//! competes with every other (they copy through the same memory on the same CPUs); otherwise
//! only the network messages leaving the same host do (its link and CPUs). The shared-memory
//! engine's times are taken as measured, whatever else runs beside it.

use accord::schedule::calibrated::{points, Calibrated};
use accord::schedule::tuner::CostModel;
use accord::schedule::{sim, Collective};
use serde_json::Value;
use std::collections::HashMap;

/// A calibrated machine.
pub struct Profile {
    tcp: CostModel,
    shm: CostModel,
    /// A message's price (bytes -> us) over TCP and through the rings: one way (half a ping-pong
    /// round trip) and in an exchange (both ranks sending at once).
    tcp_msg: [Vec<(f64, f64)>; 2],
    shm_msg: [Vec<(f64, f64)>; 2],
    /// An exchange's time with several pairs of ranks exchanging at once: (pairs, table),
    /// ascending; empty when calibrated on fewer than 4 ranks.
    crowd: Vec<(f64, Vec<(f64, f64)>)>,
    /// The reduction's cost per byte by the size of the arrays reduced: (bytes, us per byte),
    /// ascending; empty in profiles that timed one size only (`tcp.gamma_us_per_byte`).
    gamma: Vec<(f64, f64)>,
    /// The shared-memory engine's times per operation: (bytes, us), ascending.
    engine: HashMap<String, Vec<(f64, f64)>>,
    /// Ranks the engine was timed on.
    pub ranks: usize,
}

impl Profile {
    pub fn load(path: &str) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        Self::from_json(&v, path)
    }

    /// The profile in `v`; `path` names it in errors.
    fn from_json(v: &Value, path: &str) -> Result<Profile, String> {
        // Refuses what is not a profile, or one without both links' ping-pong times.
        let models = Calibrated::from_json(v, path)?;
        let engine = v["shm_engine"]
            .as_object()
            .map(|m| m.iter().map(|(k, t)| (k.clone(), points(t))).collect())
            .unwrap_or_default();
        Ok(Profile {
            tcp: models.tcp,
            shm: models.shm,
            tcp_msg: [points(&v["tcp"]["pingpong"]), points(&v["tcp"]["exchange"])],
            shm_msg: [points(&v["shm"]["pingpong"]), points(&v["shm"]["exchange"])],
            crowd: crowd_tables(&v["tcp"]["crowd"]),
            gamma: points(&v["gamma"]),
            engine,
            ranks: v["ranks"].as_u64().unwrap_or(2) as usize,
        })
    }

    /// The shared-memory engine's time for `op` on `bytes`, if it runs `op`.
    fn engine(&self, op: &str, bytes: usize) -> Option<f64> {
        let t = self.engine.get(op).filter(|t| !t.is_empty())?;
        Some(interpolate(t, bytes))
    }

    /// The reduction's cost per byte in a call on `bytes` per rank: the calibration's, for
    /// arrays of that size (linear in the log of the size between the sizes timed, the nearest
    /// one's outside them), since the call's buffers are what the reductions stream through.
    fn gamma(&self, bytes: usize) -> f64 {
        let t = &self.gamma;
        let b = bytes.max(1) as f64;
        match t.partition_point(|p| p.0 < b) {
            _ if t.is_empty() => self.tcp.gamma_us_per_byte,
            0 => t[0].1,
            i if i == t.len() => t[i - 1].1,
            i => {
                let ((b0, g0), (b1, g1)) = (t[i - 1], t[i]);
                g0 + (b.ln() - b0.ln()) / (b1.ln() - b0.ln()) * (g1 - g0)
            }
        }
    }

    /// A barrier of the ranks of one host: an exchange of the smallest message through the
    /// rings.
    fn host_barrier(&self) -> f64 {
        self.message(true, 0, true)
    }

    /// A message of `bytes`, one way or in an exchange: the measured times where there are
    /// some, else the fit.
    fn message(&self, local: bool, bytes: usize, exchange: bool) -> f64 {
        let (tables, m) = match local {
            true => (&self.shm_msg, &self.shm),
            false => (&self.tcp_msg, &self.tcp),
        };
        let table = &tables[usize::from(exchange)];
        match table.is_empty() {
            true => m.alpha_us + bytes as f64 * m.beta_us_per_byte,
            false => interpolate(table, bytes.max(1)),
        }
    }

    /// How much slower a network message of `bytes` is when `pairs` pairs of ranks exchange at
    /// once than when one pair does (1 for one pair or less; linear between the pair counts the
    /// calibration timed, continued beyond the largest; never below 1 nor below a smaller
    /// crowd's).
    fn slowdown(&self, pairs: f64, bytes: usize) -> f64 {
        let one = &self.tcp_msg[1];
        if pairs <= 1.0 || self.crowd.is_empty() || one.is_empty() {
            return 1.0;
        }
        let base = interpolate(one, bytes.max(1));
        // More pairs never make a message faster: a crowd measured faster than a smaller one
        // (the spread between runs of small messages) counts as the smaller one.
        let mut points = vec![(1.0, 1.0)];
        for (p, t) in &self.crowd {
            let f = interpolate(t, bytes.max(1)) / base;
            points.push((*p, f.max(points[points.len() - 1].1)));
        }
        let i = points
            .partition_point(|q| q.0 < pairs)
            .clamp(1, points.len() - 1);
        let ((p0, f0), (p1, f1)) = (points[i - 1], points[i]);
        (f0 + (pairs - p0) * (f1 - f0) / (p1 - p0)).max(1.0)
    }

    /// The TCP schedule Accord's tuner picks for `coll` on `world` ranks, simulated with the
    /// calibrated costs, where ranks `r / per_host` share a host; `streams` copies of it run at
    /// once (the stripes of a striped allreduce), competing as the placement says.
    fn schedule(
        &self,
        coll: &Collective,
        world: usize,
        per_host: usize,
        place: &Placement,
        streams: usize,
    ) -> Result<f64, String> {
        // The tuner's model as the library builds it (calibrated where ACCORD_TUNER_PROFILE
        // says; `run` refused an unreadable one): for the slowest link among these ranks.
        let config = accord::config::get();
        let link = match per_host >= world {
            true => accord::transport::LinkKind::SharedMemory,
            false => accord::transport::LinkKind::Tcp,
        };
        // A call in pieces takes the algorithm of a piece, as the library's does.
        let model = config.cost_model(link);
        let algo = accord::schedule::pieces::select(coll, world, 4, &model, config.piece_bytes);
        let host = |r: usize| r / per_host;
        // On one machine a round's shared-memory copies compete with its network messages for
        // the same memory and CPUs: they count in the crowd and are slowed by it too.
        let crowded = |local: bool| !local || place.one_machine;
        let message = |m: &sim::Message| {
            let local = host(m.src) == host(m.dst);
            let t = self.message(local, m.bytes, m.exchange);
            match crowded(local) {
                true => t * self.slowdown((m.crowd * streams) as f64 / 2.0, m.bytes),
                false => t,
            }
        };
        let domain = |s: usize, d: usize| match (host(s) == host(d), place.one_machine) {
            (_, true) => Some(0),
            (true, false) => None,
            (false, false) => Some(host(s)),
        };
        let gamma = self.gamma(coll.elements() * 4);
        sim::simulate_on(coll, world, 4, algo, &message, &domain, gamma)
            .map(|s| s.time_us)
            .map_err(|e| e.to_string())
    }

    /// Predicted time of `op` on `bytes` (f32, sizes as `accord bench` counts them) over
    /// `hosts` x `per_host` ranks, and the path it takes.
    pub fn predict(
        &self,
        op: &str,
        place: &Placement,
        bytes: usize,
    ) -> Result<(f64, &'static str), String> {
        let (hosts, per_host) = (place.hosts, place.per_host);
        let n = hosts * per_host;
        let count = bytes / 4;
        let coll = crate::bench::collective_of(op, n, count)
            .ok_or_else(|| format!("unknown operation {op:?}"))?;
        if n == 1 {
            return Ok((0.0, "one rank"));
        }
        if hosts == 1 {
            if let Some(t) = self.engine(op, bytes) {
                return Ok((t, "shared-memory engine"));
            }
            return Ok((
                self.schedule(&coll, n, per_host, place, 1)?,
                "schedule over shared-memory rings",
            ));
        }
        if per_host > 1 {
            let eng = |op: &str, b: usize| self.engine(op, b).unwrap_or(0.0);
            // The bytes a call of blocks moves: whole blocks of the ranks (4080 of allgather
            // over 6 ranks for 4096), what the library's limits for reduce-scatter and
            // allgather compare; an all-to-all's compares one block.
            let blocks = n * (count / n) * 4;
            match op {
                "allreduce" if accord::comm::allreduce_striped(bytes, count, per_host) => {
                    // From ACCORD_HIER_PIPELINE_BYTES in pieces: the caller's host steps on one
                    // piece overlap another piece's step between hosts, on separate hosts; on
                    // one machine both copy through the same memory on the same CPUs, and
                    // measured gain nothing from it (4 x 2 namespaces, 64 MiB: 1.6-1.9x the
                    // time overlapped steps would take).
                    let pieces = accord::comm::allreduce_pieces(bytes);
                    let slice = count.div_ceil(pieces * per_host);
                    let slice_coll = Collective::AllReduce { count: slice };
                    let net = self.schedule(&slice_coll, hosts, 1, place, per_host)?;
                    let piece = bytes / pieces;
                    let host = eng("reduce_scatter", piece) + eng("allgather", piece);
                    let t = match place.one_machine {
                        true => pieces as f64 * (host + net),
                        false => host + net + (pieces - 1) as f64 * host.max(net),
                    };
                    return Ok((t, "hosts' engines, striped between hosts"));
                }
                "allreduce" if accord::comm::allreduce_whole_on_stripes(bytes, per_host) => {
                    // Every rank reduces its host's sums over its stripe, all at once.
                    let net = self.schedule(&coll, hosts, 1, place, per_host)?;
                    return Ok((
                        eng("allreduce", bytes) + net,
                        "hosts' engines, stripes between hosts",
                    ));
                }
                "allreduce" => {
                    let net = self.schedule(&coll, hosts, 1, place, 1)?;
                    return Ok((
                        eng("allreduce", bytes) + net + eng("broadcast", bytes),
                        "hosts' engines, leaders between hosts",
                    ));
                }
                "broadcast" => {
                    let net = self.schedule(&coll, hosts, 1, place, 1)?;
                    return Ok((
                        2.0 * eng("broadcast", bytes) + net,
                        "hosts' engines, leaders between hosts",
                    ));
                }
                "reduce_scatter" | "allgather"
                    if blocks < accord::config::get().hier_blocks_bytes =>
                {
                    // Each stripe moves the blocks of its hosts' ranks: a world buffer's share.
                    let stripe = crate::bench::collective_of(op, hosts, count / per_host)
                        .ok_or_else(|| format!("unknown operation {op:?}"))?;
                    let net = self.schedule(&stripe, hosts, 1, place, per_host)?;
                    // An allgather's ranks first compare the call inside the host (a barrier:
                    // its stripe's step comes before any step of the engine).
                    let agree = match op {
                        "allgather" => self.host_barrier(),
                        _ => 0.0,
                    };
                    return Ok((
                        agree + eng(op, bytes) + net,
                        "hosts' engines, stripes between hosts",
                    ));
                }
                "alltoall" if accord::comm::alltoall_on_stripes((count / n) * 4) => {
                    // Each stripe carries a host's blocks for its hosts' ranks: the same bytes
                    // per rank in `R` times fewer, larger messages.
                    let stripe = crate::bench::collective_of(op, hosts, count)
                        .ok_or_else(|| format!("unknown operation {op:?}"))?;
                    let net = self.schedule(&stripe, hosts, 1, place, per_host)?;
                    return Ok((
                        eng(op, bytes) + net,
                        "hosts' engines, stripes between hosts",
                    ));
                }
                "barrier" => {
                    // Inside each host, then on every stripe at once (once a stripe has met,
                    // every rank of every host has arrived), then inside each host again.
                    let stripes = self.schedule(&coll, hosts, 1, place, per_host)?;
                    return Ok((
                        2.0 * self.host_barrier() + stripes,
                        "hosts' engines, stripes between hosts",
                    ));
                }
                "reduce_scatter" | "allgather" | "alltoall" => {
                    // Too large for the stripes: one schedule over every rank, after the host's
                    // ranks and then each stripe have compared the call (a barrier each).
                    let stripes = self.schedule(&Collective::Barrier, hosts, 1, place, per_host)?;
                    let flat = self.schedule(&coll, n, per_host, place, 1)?;
                    return Ok((
                        self.host_barrier() + stripes + flat,
                        "schedule over TCP and shared-memory rings",
                    ));
                }
                _ => {}
            }
        }
        let path = match per_host {
            1 => "schedule over TCP",
            _ => "schedule over TCP and shared-memory rings",
        };
        Ok((self.schedule(&coll, n, per_host, place, 1)?, path))
    }
}

/// Where the simulated ranks run.
pub struct Placement {
    pub hosts: usize,
    pub per_host: usize,
    /// Every host is a part of one machine (network namespaces, or ranks over loopback), so
    /// all network messages compete with each other.
    pub one_machine: bool,
}

impl Placement {
    /// `n` ranks, `per_host` on each host.
    pub fn new(n: usize, per_host: usize, one_machine: bool) -> Result<Placement, String> {
        if per_host == 0 || n == 0 || !n.is_multiple_of(per_host) {
            return Err(format!(
                "{n} ranks cannot be placed {per_host} per host (-n must be a multiple of \
                 --per-host)"
            ));
        }
        Ok(Placement {
            hosts: n / per_host,
            per_host,
            one_machine,
        })
    }
}

/// The calibration's crowd tables, by number of pairs.
fn crowd_tables(v: &Value) -> Vec<(f64, Vec<(f64, f64)>)> {
    let mut t: Vec<(f64, Vec<(f64, f64)>)> = (v.as_array().into_iter().flatten())
        .filter_map(|c| Some((c["pairs"].as_f64()?, points(&c["exchange"]))))
        .filter(|(p, t)| *p > 1.0 && !t.is_empty())
        .collect();
    t.sort_by(|a, b| a.0.total_cmp(&b.0));
    t
}

/// Time at `bytes` from (bytes, us) points, ascending: log-log between points, the first
/// point's time below them, proportional to the bytes beyond them.
fn interpolate(t: &[(f64, f64)], bytes: usize) -> f64 {
    let b = bytes as f64;
    if bytes == 0 {
        return 0.0;
    }
    match t.partition_point(|p| p.0 < b) {
        0 => t[0].1,
        i if i == t.len() => {
            // Beyond the largest size: time grows with the bytes.
            let (b1, t1) = t[t.len() - 1];
            t1 * b / b1
        }
        i => {
            let ((b0, t0), (b1, t1)) = (t[i - 1], t[i]);
            let f = (b.ln() - b0.ln()) / (b1.ln() - b0.ln());
            (t0.ln() + f * (t1.ln() - t0.ln())).exp()
        }
    }
}

/// `accord sim OP --profile P`: one row per size.
pub fn run(
    op: &str,
    place: &Placement,
    sizes: (usize, usize),
    factor: usize,
    profile: &str,
    json: Option<&str>,
) -> Result<(), String> {
    let (hosts, per_host, one_machine) = (place.hosts, place.per_host, place.one_machine);
    let n = hosts * per_host;
    // The tuner reads it as the library does (where the library would refuse to start).
    if let Some(Err(e)) = &accord::config::get().tuner_profile {
        return Err(format!("ACCORD_TUNER_PROFILE: {e}"));
    }
    let p = Profile::load(profile)?;
    println!(
        "# accord sim {op}: {hosts} host(s) x {per_host} rank(s){}, f32, priced with {profile} \
         (shared-memory engine timed on {} ranks; crowds of up to {} pairs)",
        if one_machine { " on one machine" } else { "" },
        p.ranks,
        p.crowd.last().map_or(1.0, |c| c.0)
    );
    println!("# {:>12} {:>14}  path", "size(B)", "predicted(us)");
    let mut rows = Vec::new();
    let mut bytes = sizes.0.max(4);
    let total = crate::progress::steps(bytes, sizes.1, factor);
    let progress = crate::progress::Progress::stderr(total, &format!("sim {op}"));
    for step in 0.. {
        progress.at(step, bytes);
        let (t, path) = p.predict(op, place, bytes)?;
        progress.suspend(|| println!("  {bytes:>12} {t:>14.2}  {path}"));
        rows.push(serde_json::json!({"bytes": bytes, "predicted_us": t, "path": path}));
        if bytes >= sizes.1 {
            break;
        }
        bytes = (bytes * factor.max(2)).min(sizes.1);
    }
    if let Some(path) = json {
        let doc = serde_json::json!({
            "schema": crate::bench::JSON_SCHEMA, "op": op, "hosts": hosts,
            "per_host": per_host, "ranks": n, "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile whose TCP messages cost 10 us + 1 us/KiB one way and in an exchange, and whose
    /// exchanges take 2x as long with 2 pairs at once and 3x with 4.
    fn profile() -> Profile {
        profile_with_crowds(&[(4, 3.0), (2, 2.0)])
    }

    /// Messages as in [`profile`]; an exchange takes `factor` times as long with `pairs` pairs
    /// at once, for each `(pairs, factor)`.
    fn profile_with_crowds(crowds: &[(u32, f64)]) -> Profile {
        let table = |f: f64| -> Vec<Value> {
            [1024.0, 1048576.0]
                .iter()
                .map(|&b| serde_json::json!([b, f * (10.0 + b / 1024.0)]))
                .collect()
        };
        let crowd: Vec<Value> = (crowds.iter())
            .map(|&(pairs, f)| serde_json::json!({"pairs": pairs, "exchange": table(f)}))
            .collect();
        let link = serde_json::json!({"pingpong": table(1.0), "exchange": table(1.0),
            "crowd": crowd});
        let v = serde_json::json!({"accord_profile": 1, "gamma_us_per_byte": 1e-4,
            "tcp": link, "shm": link, "ranks": 2});
        Profile::from_json(&v, "test profile").unwrap()
    }

    #[test]
    fn crowded_rounds_cost_what_the_calibration_measured() {
        let p = profile();
        let b = 1 << 20;
        assert_eq!(p.slowdown(1.0, b), 1.0);
        assert!((p.slowdown(1.5, b) - 1.5).abs() < 1e-9);
        assert!((p.slowdown(2.0, b) - 2.0).abs() < 1e-9);
        assert!((p.slowdown(4.0, b) - 3.0).abs() < 1e-9);
        assert!(
            (p.slowdown(8.0, b) - 5.0).abs() < 1e-9,
            "continued beyond 4 pairs"
        );
    }

    #[test]
    fn a_larger_crowd_measured_faster_than_a_smaller_one_costs_as_much() {
        let p = profile_with_crowds(&[(2, 1.5), (4, 1.2)]);
        let b = 1 << 20;
        assert!((p.slowdown(2.0, b) - 1.5).abs() < 1e-9);
        assert!((p.slowdown(3.0, b) - 1.5).abs() < 1e-9);
        assert!((p.slowdown(4.0, b) - 1.5).abs() < 1e-9);
    }

    #[test]
    fn reductions_cost_what_arrays_of_the_calls_size_cost() {
        let mut p = profile();
        assert_eq!(p.gamma(1 << 30), 1e-4, "one size timed: that one");
        p.gamma = vec![(65536.0, 1e-4), (4194304.0, 1e-4), (67108864.0, 3e-4)];
        assert_eq!(p.gamma(4096), 1e-4);
        assert_eq!(p.gamma(1 << 20), 1e-4);
        assert!(
            (p.gamma(16 << 20) - 2e-4).abs() < 1e-12,
            "halfway in the log of the size"
        );
        assert_eq!(p.gamma(1 << 30), 3e-4);
        // A reduce-scatter of 64 MiB reduces at the slower, larger-array cost.
        let place = Placement::new(2, 1, false).unwrap();
        let slow = p.predict("reduce_scatter", &place, 64 << 20).unwrap().0;
        p.gamma.clear();
        let fast = p.predict("reduce_scatter", &place, 64 << 20).unwrap().0;
        assert!(
            slow > fast + 0.9 * 2e-4 * (32 << 20) as f64,
            "{slow} vs {fast}"
        );
    }

    #[test]
    fn a_barrier_across_hosts_meets_inside_them_on_the_stripes_and_inside_again() {
        let p = profile();
        let place = Placement::new(8, 2, false).unwrap();
        let (t, path) = p.predict("barrier", &place, 4).unwrap();
        assert_eq!(path, "hosts' engines, stripes between hosts");
        // Dissemination over 4 hosts: twice the one round over 2.
        let stripes = p.schedule(&Collective::Barrier, 4, 1, &place, 2).unwrap();
        let one = p.schedule(&Collective::Barrier, 2, 1, &place, 2).unwrap();
        assert!(
            one > 0.0 && (stripes - 2.0 * one).abs() < 1e-6,
            "{stripes} {one}"
        );
        assert!((t - 2.0 * p.host_barrier() - stripes).abs() < 1e-9, "{t}");
    }

    #[test]
    fn only_one_machine_makes_every_host_compete() {
        let p = profile();
        let at = |one_machine| {
            let place = Placement {
                hosts: 8,
                per_host: 1,
                one_machine,
            };
            p.predict("allgather", &place, 8 << 20).unwrap().0
        };
        // A ring allgather: each host sends one message a round, 8 in all on one machine.
        let (apart, together) = (at(false), at(true));
        assert!(together > 2.5 * apart, "{together} vs {apart}");
    }

    #[test]
    fn on_one_machine_shared_memory_copies_crowd_the_round_too() {
        let p = profile();
        let gather = Collective::AllGather {
            counts: vec![1 << 18; 4],
        };
        let at = |one_machine| {
            let place = Placement {
                hosts: 2,
                per_host: 2,
                one_machine,
            };
            p.schedule(&gather, 4, 2, &place, 1).unwrap()
        };
        // Over 2 x 2 ranks a round inside the hosts moves four messages through shared memory:
        // apart they cost what one exchange costs; together they crowd like network messages.
        let (apart, together) = (at(false), at(true));
        assert!(together > 1.8 * apart, "{together} vs {apart}");
    }

    #[test]
    fn reduce_scatter_allgather_and_alltoall_take_the_stripes_below_their_limits() {
        let p = profile();
        let place = Placement::new(8, 2, true).unwrap();
        for op in ["reduce_scatter", "allgather", "alltoall"] {
            let (small, path) = p.predict(op, &place, 64 << 10).unwrap();
            assert_eq!(path, "hosts' engines, stripes between hosts", "{op}");
            let (_, path) = p.predict(op, &place, 4 << 20).unwrap();
            assert_eq!(path, "schedule over TCP and shared-memory rings", "{op}");
            // The stripes carry a host's share of the buffer between 4 hosts: three of its
            // blocks' rounds, not the whole 8-rank schedule's.
            let flat = p.schedule(
                &crate::bench::collective_of(op, 8, 16 << 10).unwrap(),
                8,
                2,
                &place,
                1,
            );
            assert!(small < flat.unwrap(), "{op}: {small}");
        }
    }

    #[test]
    fn the_limits_compare_the_whole_blocks_a_call_moves() {
        // Over 3 x 2 ranks a call asked for at a limit moves a few bytes less (whole blocks of
        // six ranks), so the library takes the stripes there, and so must the price.
        let p = profile();
        let place = Placement::new(6, 2, true).unwrap();
        let limit = accord::config::get().hier_blocks_bytes;
        for op in ["allgather", "reduce_scatter"] {
            assert_ne!(limit % 24, 0, "{op}: the limit must not be whole blocks");
            let (_, path) = p.predict(op, &place, limit).unwrap();
            assert_eq!(path, "hosts' engines, stripes between hosts", "{op}");
        }
    }

    #[test]
    fn an_all_to_all_takes_the_stripes_by_its_blocks() {
        // The library compares one block (what a rank sends each rank) with the limit, not
        // the buffer: a block of one element less takes the stripes, a block of the limit one
        // schedule over every rank, over 3 x 2 ranks (where the old limit, 256 KiB of buffer,
        // put both on the stripes) as over 4 x 2.
        let p = profile();
        let limit = accord::config::get().hier_alltoall_block_bytes;
        assert!(limit >= 8, "a limit of {limit} B leaves no block below it");
        for ranks in [6, 8] {
            let place = Placement::new(ranks, 2, true).unwrap();
            let (_, below) = p.predict("alltoall", &place, ranks * (limit - 4)).unwrap();
            assert_eq!(
                below, "hosts' engines, stripes between hosts",
                "{ranks} ranks"
            );
            let (_, at) = p.predict("alltoall", &place, ranks * limit).unwrap();
            assert_eq!(
                at, "schedule over TCP and shared-memory rings",
                "{ranks} ranks"
            );
        }
    }
}
