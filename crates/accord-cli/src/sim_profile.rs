//! `accord sim --profile`: what a call would take on hosts x ranks per host, priced with a
//! profile measured by `accord bench --calibrate`, following the path Accord takes there:
//!
//! - one host: the shared-memory engine's measured times (interpolated between sizes, log-log),
//!   or, for what the engine does not run, the schedule over the point-to-point rings;
//! - one rank per host: the schedule the tuner picks for TCP, simulated message by message with
//!   the calibrated alpha, beta and gamma;
//! - several ranks per host: allreduce and broadcast hierarchically (the engine inside each
//!   host, the leaders' schedule between hosts; from 1 MiB allreduce striped, one slice per
//!   local rank), everything else as one schedule over all ranks whose messages cost the
//!   shared-memory rings' price inside a host and TCP's between hosts (ranks placed host by host).
//!
//! The model knows nothing of CPU contention: placements with more ranks than CPUs are
//! predicted as if each rank had its own.

use crate::calibrate::{fit, points};
use accord::comm::STRIPE_MIN_BYTES;
use accord::schedule::tuner::{self, CostModel};
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
    /// The shared-memory engine's times per operation: (bytes, us), ascending.
    engine: HashMap<String, Vec<(f64, f64)>>,
    /// Ranks the engine was timed on.
    pub ranks: usize,
}

impl Profile {
    pub fn load(path: &str) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        if v["accord_profile"].as_u64() != Some(1) {
            return Err(format!(
                "{path} is not an Accord profile (make one with `accord bench --calibrate {path}`)"
            ));
        }
        let gamma = v["gamma_us_per_byte"]
            .as_f64()
            .ok_or(format!("{path}: no gamma_us_per_byte"))?;
        let link = |k: &str| -> Result<CostModel, String> {
            let pp = points(&v[k]["pingpong"]);
            if pp.is_empty() {
                return Err(format!("{path}: no {k} ping-pong"));
            }
            let (alpha_us, beta_us_per_byte) = fit(&pp);
            Ok(CostModel {
                alpha_us,
                beta_us_per_byte,
                gamma_us_per_byte: gamma,
            })
        };
        let engine = v["shm_engine"]
            .as_object()
            .map(|m| m.iter().map(|(k, t)| (k.clone(), points(t))).collect())
            .unwrap_or_default();
        Ok(Profile {
            tcp: link("tcp")?,
            shm: link("shm")?,
            tcp_msg: [points(&v["tcp"]["pingpong"]), points(&v["tcp"]["exchange"])],
            shm_msg: [points(&v["shm"]["pingpong"]), points(&v["shm"]["exchange"])],
            engine,
            ranks: v["ranks"].as_u64().unwrap_or(2) as usize,
        })
    }

    /// The shared-memory engine's time for `op` on `bytes`, if it runs `op`.
    fn engine(&self, op: &str, bytes: usize) -> Option<f64> {
        let t = self.engine.get(op).filter(|t| !t.is_empty())?;
        Some(interpolate(t, bytes))
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

    /// The TCP schedule Accord's tuner picks for `coll` on `world` ranks, simulated with the
    /// calibrated costs, where ranks `r / per_host` share a host.
    fn schedule(&self, coll: &Collective, world: usize, per_host: usize) -> Result<f64, String> {
        let algo = tuner::select(coll, world, 4, &CostModel::tcp());
        let message = |s: usize, d: usize, b: usize, x: bool| {
            self.message(s / per_host == d / per_host, b, x)
        };
        sim::simulate_on(coll, world, 4, algo, &message, self.tcp.gamma_us_per_byte)
            .map(|s| s.time_us)
            .map_err(|e| e.to_string())
    }

    /// Predicted time of `op` on `bytes` (f32, sizes as `accord bench` counts them) over
    /// `hosts` x `per_host` ranks, and the path it takes.
    pub fn predict(
        &self,
        op: &str,
        hosts: usize,
        per_host: usize,
        bytes: usize,
    ) -> Result<(f64, &'static str), String> {
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
                self.schedule(&coll, n, per_host)?,
                "schedule over shared-memory rings",
            ));
        }
        if per_host > 1 {
            let eng = |op: &str, b: usize| self.engine(op, b).unwrap_or(0.0);
            match op {
                "allreduce" if bytes >= STRIPE_MIN_BYTES && count >= per_host => {
                    let slice = count / per_host;
                    let net = self.schedule(&Collective::AllReduce { count: slice }, hosts, 1)?;
                    let spread = per_host as f64 * eng("broadcast", slice * 4);
                    return Ok((
                        eng("allreduce", bytes) + net + spread,
                        "hosts' engines, striped between hosts",
                    ));
                }
                "allreduce" => {
                    let net = self.schedule(&coll, hosts, 1)?;
                    return Ok((
                        eng("allreduce", bytes) + net + eng("broadcast", bytes),
                        "hosts' engines, leaders between hosts",
                    ));
                }
                "broadcast" => {
                    let net = self.schedule(&coll, hosts, 1)?;
                    return Ok((
                        2.0 * eng("broadcast", bytes) + net,
                        "hosts' engines, leaders between hosts",
                    ));
                }
                _ => {}
            }
        }
        let path = match per_host {
            1 => "schedule over TCP",
            _ => "schedule over TCP and shared-memory rings",
        };
        Ok((self.schedule(&coll, n, per_host)?, path))
    }
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
    n: usize,
    per_host: usize,
    sizes: (usize, usize),
    factor: usize,
    profile: &str,
    json: Option<&str>,
) -> Result<(), String> {
    if per_host == 0 || n == 0 || !n.is_multiple_of(per_host) {
        return Err(format!(
            "{n} ranks cannot be placed {per_host} per host (-n must be a multiple of --per-host)"
        ));
    }
    let p = Profile::load(profile)?;
    let hosts = n / per_host;
    println!(
        "# accord sim {op}: {hosts} host(s) x {per_host} rank(s), f32, priced with {profile} \
         (shared-memory engine timed on {} ranks)",
        p.ranks
    );
    println!("# {:>12} {:>14}  path", "size(B)", "predicted(us)");
    let mut rows = Vec::new();
    let mut bytes = sizes.0.max(4);
    let total = crate::progress::steps(bytes, sizes.1, factor);
    let progress = crate::progress::Progress::stderr(total, &format!("sim {op}"));
    for step in 0.. {
        progress.at(step, bytes);
        let (t, path) = p.predict(op, hosts, per_host, bytes)?;
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
