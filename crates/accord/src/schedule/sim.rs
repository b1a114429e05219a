//! Timing simulation of real schedules: what a collective would take on `world` ranks under a
//! [`CostModel`], computed from the steps every rank would actually execute.
//!
//! The tuner predicts in closed form; this module checks those formulas against the schedules
//! themselves and answers "how does this scale to 1,024 ranks?" without 1,024 processes
//! (`accord sim`). Because schedules are data, the simulation is exact with respect to the plan:
//! every message, every dependency, every reduction.
//!
//! ## Model
//! Each rank has a clock. In each round its sends leave at the round's start, one after another
//! through the rank's link, each occupying it for `alpha + beta x bytes` (the tuner's per-message
//! cost, so `k` messages cost `k` alphas, as in its formulas) and arriving when done. A receive
//! completes when its message has arrived and the rank is free, then reduction costs `gamma` per
//! byte and a local copy half that; a schedule's finishing step costs nothing (it divides only
//! for an average, and the simulation prices sums and the other operators). Messages between a
//! pair are matched in order, exactly as the executor does. The result is the time the slowest
//! rank finishes.
//!
//! [`simulate_on`] prices each [`Message`] with a function of the caller's (a measured table,
//! ranks of one host talking through shared memory) and tells it how crowded the message's
//! round is: how many ranks send in the same round in its *contention domain* (a host's
//! network link, or one machine whose CPUs and loopback every rank shares), so a price can grow
//! with the traffic that competes for the same resource.

use super::tuner::CostModel;
use super::{algorithms, pieces, Algorithm, Collective, Schedule, Step};
use crate::error::Result;
use std::collections::{HashMap, VecDeque};

/// Outcome of one simulated call.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// When the slowest rank finishes, in microseconds.
    pub time_us: f64,
    /// Messages sent by all ranks together.
    pub messages: usize,
    /// Bytes sent by all ranks together.
    pub bytes: usize,
}

/// One message as [`simulate_on`]'s price function sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Sending rank.
    pub src: usize,
    /// Receiving rank.
    pub dst: usize,
    /// Payload bytes.
    pub bytes: usize,
    /// `src` receives at least half as many bytes in the same round (from every peer together:
    /// `dst`, or others as in a ring), so its sending and receiving share its CPUs and link, as
    /// in an exchange (a zero-byte token does not count).
    pub exchange: bool,
    /// Ranks sending in the same round in this message's contention domain, its sender
    /// included; 1 where it has none.
    pub crowd: usize,
}

/// Simulate `algo` for `coll` on `world` ranks with elements of `elem_size` bytes.
pub fn simulate(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    algo: Algorithm,
    model: &CostModel,
) -> Result<Simulation> {
    let message = |m: &Message| model.alpha_us + m.bytes as f64 * model.beta_us_per_byte;
    simulate_on(
        coll,
        world,
        elem_size,
        algo,
        &message,
        &|_, _| None,
        model.gamma_us_per_byte,
    )
}

/// [`simulate`] with any price of a message, in microseconds (ranks on one host share memory,
/// others talk over the network; a measured table instead of a formula), `domain(src, dst)`:
/// what a message from `src` to `dst` competes for with the other messages of its round
/// (`None`: nothing), and `gamma` microseconds per byte reduced.
pub fn simulate_on(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    algo: Algorithm,
    message: &dyn Fn(&Message) -> f64,
    domain: &dyn Fn(usize, usize) -> Option<usize>,
    gamma: f64,
) -> Result<Simulation> {
    // Large calls in pieces as the library runs them (`ACCORD_PIECE_BYTES`); what the pieces
    // gain in the caches is not modelled, only their rounds.
    let piece_bytes = crate::config::get().piece_bytes;
    let scheds = (0..world)
        .map(|r| pieces::build(coll, world, r, algo, elem_size, piece_bytes))
        .collect::<Result<Vec<_>>>()?;
    Ok(run(&scheds, elem_size, message, domain, gamma))
}

/// Ranks sending per (round, contention domain) over every rank's schedule. A rank's own
/// messages of a round leave one after another through its link (priced in turn), so they
/// count once: otherwise a rank posting all its messages at once would pay for the crowd twice.
fn crowds(
    scheds: &[Schedule],
    domain: &dyn Fn(usize, usize) -> Option<usize>,
) -> HashMap<(usize, usize), usize> {
    let mut senders = std::collections::HashSet::new();
    for (me, sched) in scheds.iter().enumerate() {
        for (round, steps) in sched.rounds.iter().enumerate() {
            for step in steps {
                if let Step::Send { peer, .. } = *step {
                    if let Some(d) = domain(me, peer) {
                        senders.insert((round, d, me));
                    }
                }
            }
        }
    }
    let mut n = HashMap::new();
    for (round, d, _) in senders {
        *n.entry((round, d)).or_insert(0) += 1;
    }
    n
}

struct Rank<'a> {
    sched: &'a Schedule,
    round: usize,
    /// Index of the next non-send step within the round (sends are issued on entering it).
    step: usize,
    entered: bool,
    clock: f64,
    link_free: f64,
}

fn run(
    scheds: &[Schedule],
    esz: usize,
    message: &dyn Fn(&Message) -> f64,
    domain: &dyn Fn(usize, usize) -> Option<usize>,
    gamma: f64,
) -> Simulation {
    let crowd = crowds(scheds, domain);
    // Elements `r` receives in `round`, from any peer (a zero-length token carries none).
    let received = |r: usize, round: usize| -> usize {
        scheds[r].rounds.get(round).map_or(0, |steps| {
            steps
                .iter()
                .map(|s| match *s {
                    Step::Recv { dst, .. } | Step::RecvReduce { dst, .. } => dst.len,
                    _ => 0,
                })
                .sum()
        })
    };
    let mut ranks: Vec<Rank<'_>> = scheds
        .iter()
        .map(|sched| Rank {
            sched,
            round: 0,
            step: 0,
            entered: false,
            clock: 0.0,
            link_free: 0.0,
        })
        .collect();
    // In-flight messages per (src, dst): arrival times in send order.
    let mut wires: HashMap<(usize, usize), VecDeque<f64>> = HashMap::new();
    let (mut messages, mut bytes) = (0usize, 0usize);
    loop {
        let mut progressed = false;
        let mut done = 0;
        for (me, r) in ranks.iter_mut().enumerate() {
            loop {
                let Some(round) = r.sched.rounds.get(r.round) else {
                    done += 1;
                    break;
                };
                if !r.entered {
                    r.entered = true;
                    let incoming = received(me, r.round);
                    for step in round {
                        if let Step::Send { peer, src } = *step {
                            let b = src.len * esz;
                            let m = Message {
                                src: me,
                                dst: peer,
                                bytes: b,
                                // Data coming in at the same time shares the sender's CPUs and
                                // link, from the same peer or another (a ring's round); a
                                // token does not.
                                exchange: 2 * incoming >= src.len.max(1),
                                crowd: domain(me, peer)
                                    .and_then(|d| crowd.get(&(r.round, d)).copied())
                                    .unwrap_or(1),
                            };
                            r.link_free = r.link_free.max(r.clock) + message(&m);
                            wires.entry((me, peer)).or_default().push_back(r.link_free);
                            messages += 1;
                            bytes += b;
                        }
                    }
                    progressed = true;
                }
                let others: Vec<&Step> = round
                    .iter()
                    .filter(|s| !matches!(s, Step::Send { .. }))
                    .collect();
                let mut blocked = false;
                while let Some(step) = others.get(r.step) {
                    match **step {
                        Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } => {
                            let Some(arrival) =
                                wires.get_mut(&(peer, me)).and_then(VecDeque::pop_front)
                            else {
                                blocked = true;
                                break;
                            };
                            r.clock = r.clock.max(arrival);
                            if matches!(step, Step::RecvReduce { .. }) {
                                r.clock += (dst.len * esz) as f64 * gamma;
                            }
                        }
                        Step::Copy { dst, .. } => r.clock += (dst.len * esz) as f64 * gamma / 2.0,
                        Step::Reduce { dst, .. } => r.clock += (dst.len * esz) as f64 * gamma,
                        // Only an average's finishing division reads the data; the simulation
                        // prices the other operators, whose finish does nothing.
                        Step::Finalize { .. } => {}
                        Step::Send { .. } => unreachable!("filtered out"),
                    }
                    r.step += 1;
                    progressed = true;
                }
                if blocked {
                    break;
                }
                r.round += 1;
                r.step = 0;
                r.entered = false;
            }
        }
        if done == ranks.len() || !progressed {
            // Not progressing with ranks unfinished would be a deadlock, which the checker rules
            // out for every algorithm; report the time reached.
            break;
        }
    }
    let time_us = ranks
        .iter()
        .map(|r| r.clock.max(r.link_free))
        .fold(0.0, f64::max);
    Simulation {
        time_us,
        messages,
        bytes,
    }
}

/// One table for `accord sim`: every applicable algorithm, simulated as the library runs it
/// (large calls in pieces) and predicted by the tuner's closed form for the whole call.
pub fn table(
    coll: &Collective,
    world: usize,
    elem_size: usize,
    model: &CostModel,
) -> Result<String> {
    use std::fmt::Write as _;
    let piece_bytes = crate::config::get().piece_bytes;
    let chosen = pieces::select(coll, world, elem_size, model, piece_bytes);
    let mut out = format!(
        "{} on {world} ranks, {} elements x {elem_size} B\n{:<22} {:>14} {:>14} {:>10} {:>14}\n",
        coll.kind(),
        coll.elements(),
        "algorithm",
        "simulated(us)",
        "predicted(us)",
        "messages",
        "bytes"
    );
    for &a in algorithms::applicable(coll) {
        let s = simulate(coll, world, elem_size, a, model)?;
        let p = super::tuner::predict(coll, world, elem_size, a, model);
        let mark = if a == chosen { '*' } else { ' ' };
        let _ = writeln!(
            out,
            "{mark} {:<20} {:>14.1} {:>14.1} {:>10} {:>14}",
            a.name(),
            s.time_us,
            p,
            s.messages,
            s.bytes
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_allreduce_matches_the_textbook_formula() {
        let m = CostModel {
            alpha_us: 10.0,
            beta_us_per_byte: 0.001,
            gamma_us_per_byte: 0.0,
            concurrent_share: 1.0,
        };
        let (p, n) = (8usize, 8 * 1024usize);
        let s = simulate(
            &Collective::AllReduce { count: n },
            p,
            4,
            Algorithm::Ring,
            &m,
        )
        .unwrap();
        // 2 (p - 1) steps of (alpha + n/p elements x beta).
        let want = 2.0 * (p - 1) as f64 * (m.alpha_us + (n / p * 4) as f64 * m.beta_us_per_byte);
        assert!((s.time_us - want).abs() < 1e-6, "{} vs {want}", s.time_us);
        assert_eq!(s.messages, 2 * p * (p - 1));
    }

    #[test]
    fn a_reduce_scatter_pays_its_reductions_and_not_its_finish() {
        // Ring on 4 ranks: 3 rounds, each a message of one block and its reduction; the
        // schedule's finishing step (work only for an average) adds nothing.
        let m = CostModel {
            alpha_us: 10.0,
            beta_us_per_byte: 0.001,
            gamma_us_per_byte: 0.01,
            concurrent_share: 1.0,
        };
        let coll = Collective::ReduceScatter {
            counts: vec![256; 4],
        };
        let sched = algorithms::build(&coll, 4, 0, Algorithm::Ring).unwrap();
        let finishes = sched.rounds.iter().flatten();
        assert!(
            finishes
                .filter(|s| matches!(s, Step::Finalize { .. }))
                .count()
                > 0
        );
        let s = simulate(&coll, 4, 4, Algorithm::Ring, &m).unwrap();
        let block = 256.0 * 4.0;
        let want = 3.0 * (m.alpha_us + block * m.beta_us_per_byte + block * m.gamma_us_per_byte);
        assert!((s.time_us - want).abs() < 1e-6, "{} vs {want}", s.time_us);
    }

    #[test]
    fn a_price_sees_how_many_messages_of_its_round_share_its_domain() {
        // Ring allgather on 6 ranks over 2 "hosts" of 3: every round each rank sends once; the
        // messages crossing hosts (2 per round) share the one domain, the others have none.
        let seen = std::sync::Mutex::new(Vec::new());
        let price = |m: &Message| {
            seen.lock().unwrap().push((m.src / 3 != m.dst / 3, m.crowd));
            1.0
        };
        let domain = |s: usize, d: usize| (s / 3 != d / 3).then_some(0);
        let coll = Collective::AllGather { counts: vec![2; 6] };
        simulate_on(&coll, 6, 4, Algorithm::Ring, &price, &domain, 0.0).unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 6 * 5);
        assert!(seen
            .iter()
            .all(|&(across, c)| c == if across { 2 } else { 1 }));
    }

    #[test]
    fn a_rank_posting_all_its_messages_at_once_counts_once_in_the_crowd() {
        // Direct all-to-all on 5 ranks of one domain: one round, 4 messages from each rank;
        // its own messages already queue on its link, so the crowd is the 5 senders.
        let seen = std::sync::Mutex::new(Vec::new());
        let price = |m: &Message| {
            seen.lock().unwrap().push(m.crowd);
            1.0
        };
        let coll = Collective::AllToAll {
            send_counts: vec![3; 5],
            recv_counts: vec![3; 5],
        };
        simulate_on(&coll, 5, 4, Algorithm::Direct, &price, &|_, _| Some(0), 0.0).unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 5 * 4);
        assert!(seen.iter().all(|&c| c == 5), "{seen:?}");
    }

    #[test]
    fn a_message_is_an_exchange_when_its_sender_receives_as_much_in_the_round() {
        // A ring's rank sends to one neighbour and receives from the other at once, as in an
        // exchange with one peer; a binomial broadcast's data meets only zero-byte tokens.
        let exchanges = |coll: &Collective, algo| {
            let seen = std::sync::Mutex::new(Vec::new());
            let price = |m: &Message| {
                seen.lock().unwrap().push((m.bytes, m.exchange));
                1.0
            };
            simulate_on(coll, 4, 4, algo, &price, &|_, _| Some(0), 0.0).unwrap();
            seen.into_inner().unwrap()
        };
        let ring = exchanges(
            &Collective::AllGather { counts: vec![8; 4] },
            Algorithm::Ring,
        );
        assert!(!ring.is_empty() && ring.iter().all(|&(_, x)| x), "{ring:?}");
        let bcast = Collective::Broadcast { count: 64, root: 0 };
        let tree = exchanges(&bcast, Algorithm::BinomialTree);
        assert!(tree.iter().any(|&(b, _)| b > 0), "{tree:?}");
        assert!(tree.iter().all(|&(b, x)| b == 0 || !x), "{tree:?}");
    }

    #[test]
    fn latency_and_bandwidth_algorithms_trade_places() {
        let m = CostModel::tcp();
        let small = Collective::AllReduce { count: 1 };
        let big = Collective::AllReduce { count: 1 << 22 };
        let t = |c: &Collective, a| simulate(c, 64, 4, a, &m).unwrap().time_us;
        assert!(t(&small, Algorithm::RecursiveDoubling) < t(&small, Algorithm::Ring));
        assert!(t(&big, Algorithm::Ring) < t(&big, Algorithm::RecursiveDoubling));
    }

    #[test]
    fn scales_to_a_thousand_ranks() {
        let coll = Collective::AllReduce { count: 1 << 20 };
        let s = simulate(&coll, 1024, 4, Algorithm::Rabenseifner, &CostModel::tcp()).unwrap();
        assert!(s.time_us > 0.0 && s.messages > 0);
        let t = table(
            &Collective::Broadcast {
                count: 1000,
                root: 3,
            },
            1000,
            8,
            &CostModel::shm(),
        )
        .unwrap();
        assert!(t.contains("binomial") && t.contains('*'), "{t}");
    }
}
