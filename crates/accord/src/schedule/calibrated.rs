//! Cost models measured on the machine, for the tuner.
//!
//! `accord bench --calibrate PROFILE` times messages over TCP and through shared memory, and
//! the reduction, and writes them to a JSON profile (`accord_profile: 1`). With
//! `ACCORD_TUNER_PROFILE=PROFILE` (the same profile on every rank, compared when the world
//! forms) the tuner prices algorithms with the profile's costs instead of its built-in ones
//! ([`CostModel::tcp`]: 25 us and 1.25 GB/s, a 10 Gb Ethernet; [`CostModel::shm`]), so that its
//! choices follow the network it runs on. A link's `alpha` is its smallest ping-pong message's
//! time, `beta` the least-squares slope of its ping-pong times from 256 KiB; `gamma` is the
//! profile's reduction cost per byte (of the arrays beyond the caches). The direct all-to-all's
//! share of `beta` ([`CostModel::concurrent_share`]) is scaled so that direct posting still
//! pays from the block size where it was measured to (see `concurrent_share`).

use super::tuner::CostModel;
use crate::transport::LinkKind;
use serde_json::Value;

/// The tuner's cost models fitted to a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibrated {
    /// Between hosts (any world with a TCP link).
    pub tcp: CostModel,
    /// Between the processes of one host.
    pub shm: CostModel,
}

impl Calibrated {
    /// The models of the profile at `path`.
    pub fn load(path: &str) -> Result<Calibrated, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        Self::from_json(&v, path)
    }

    /// The models of the profile `v`; `path` names it in errors.
    pub fn from_json(v: &Value, path: &str) -> Result<Calibrated, String> {
        if v["accord_profile"].as_u64() != Some(1) {
            return Err(format!(
                "{path} is not an Accord profile (make one with `accord bench --calibrate {path}`)"
            ));
        }
        let gamma = v["gamma_us_per_byte"]
            .as_f64()
            .filter(|g| g.is_finite() && *g > 0.0)
            .ok_or(format!("{path}: no gamma_us_per_byte"))?;
        let link = |k: &str, built_in: CostModel| -> Result<CostModel, String> {
            let (alpha_us, beta_us_per_byte) = fit(&points(&v[k]["pingpong"])).ok_or(format!(
                "{path}: no usable {k} ping-pong times (each positive)"
            ))?;
            Ok(CostModel {
                alpha_us,
                beta_us_per_byte,
                gamma_us_per_byte: gamma,
                concurrent_share: concurrent_share(built_in, alpha_us, beta_us_per_byte),
            })
        };
        Ok(Calibrated {
            tcp: link("tcp", CostModel::tcp())?,
            shm: link("shm", CostModel::shm())?,
        })
    }

    /// The model for a world whose slowest link is `link` (threads in one process keep the
    /// built-in one: the profile does not time them).
    pub fn for_link(&self, link: LinkKind) -> CostModel {
        match link {
            LinkKind::InProcess => CostModel::inproc(),
            LinkKind::SharedMemory => self.shm,
            LinkKind::Tcp => self.tcp,
        }
    }

    /// Every number the tuner's choices depend on, exactly (ranks compare it).
    pub fn describe(&self) -> String {
        let m = |c: &CostModel| format!("{:?} us + {:?} us/B", c.alpha_us, c.beta_us_per_byte);
        format!(
            "tcp {}, shm {}, reduce {:?} us/B",
            m(&self.tcp),
            m(&self.shm),
            self.tcp.gamma_us_per_byte
        )
    }
}

/// The share of `beta` a direct all-to-all's bytes cost on a link of `alpha` and `beta`, where
/// the built-in model's share stands for what was measured: direct posting pays its extra
/// message from about the same block size on the machines it was measured on
/// ([`super::tuner::DIRECT_ALLTOALL_MAX_RANKS`]), which the built-in costs and share put at
/// `alpha / ((1 - share) (p - 1) beta)`. Kept at that block size with the profile's `alpha`
/// and `beta` (a profile's faster bytes would otherwise make the overlap look worthless and
/// the tuner take pairwise exchange, measured 1.04-1.22x slower at 256 KiB), as far as a share
/// within 0 and 1 allows: a profile whose `alpha / beta` is more than 5 times the built-in
/// one's gets 0, and direct then pays from `alpha / ((p - 1) beta)`.
fn concurrent_share(built_in: CostModel, alpha: f64, beta: f64) -> f64 {
    let saved = (1.0 - built_in.concurrent_share) * (alpha / beta)
        / (built_in.alpha_us / built_in.beta_us_per_byte);
    (1.0 - saved).clamp(0.0, 1.0)
}

/// `[[bytes, us], ...]` as pairs sorted by size (entries that are not pairs of numbers are
/// skipped).
pub fn points(v: &Value) -> Vec<(f64, f64)> {
    v.as_array()
        .map(|a| {
            let mut pp: Vec<(f64, f64)> = a
                .iter()
                .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?)))
                .collect();
            pp.sort_by(|x, y| x.0.total_cmp(&y.0));
            pp
        })
        .unwrap_or_default()
}

/// `alpha + beta x bytes` through ping-pong points sorted by size: alpha is the smallest
/// message's time, beta the least-squares slope of the points from 256 KiB (at least 1e-9 us
/// per byte). `None` without points or with a time that is not a positive number.
pub fn fit(pp: &[(f64, f64)]) -> Option<(f64, f64)> {
    let alpha = pp.first()?.1;
    if pp.iter().any(|p| !(p.1.is_finite() && p.1 > 0.0)) {
        return None;
    }
    let big: Vec<_> = pp.iter().filter(|p| p.0 >= 262_144.0).collect();
    let n = big.len() as f64;
    if n < 2.0 {
        return Some((alpha, 1e-9));
    }
    let (mb, mt) = (
        big.iter().map(|p| p.0).sum::<f64>() / n,
        big.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let cov: f64 = big.iter().map(|p| (p.0 - mb) * (p.1 - mt)).sum();
    let var: f64 = big.iter().map(|p| (p.0 - mb).powi(2)).sum();
    Some((alpha, (cov / var).max(1e-9)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{tuner, Algorithm, Collective};

    fn profile(tcp_alpha: f64, tcp_bytes_per_us: f64) -> Value {
        let pp = |alpha: f64, rate: f64| -> Vec<[f64; 2]> {
            [8.0, 4096.0, 262_144.0, 1_048_576.0, 4_194_304.0]
                .iter()
                .map(|&b| [b, alpha + b / rate])
                .collect()
        };
        serde_json::json!({
            "accord_profile": 1,
            "gamma_us_per_byte": 1e-4,
            "tcp": {"pingpong": pp(tcp_alpha, tcp_bytes_per_us)},
            "shm": {"pingpong": pp(1.5, 8000.0)},
        })
    }

    /// alpha is the smallest message's time, beta the slope of the large ones.
    #[test]
    fn a_profile_gives_its_links_alpha_and_beta() {
        let c = Calibrated::from_json(&profile(8.0, 10_000.0), "p").unwrap();
        assert!((c.tcp.alpha_us - (8.0 + 8.0 / 10_000.0)).abs() < 1e-9);
        assert!((c.tcp.beta_us_per_byte - 1e-4).abs() < 1e-12);
        assert!((c.shm.beta_us_per_byte - 1.0 / 8000.0).abs() < 1e-12);
        assert_eq!(c.tcp.gamma_us_per_byte, 1e-4);
        // A link with the built-in ratio of alpha to beta keeps the built-in share.
        let same = concurrent_share(CostModel::tcp(), 50.0, 2.0 / 1250.0);
        assert!((same - CostModel::tcp().concurrent_share).abs() < 1e-9);
        assert_eq!(
            c.shm.concurrent_share, 1.0,
            "no overlap gain through shared memory"
        );
        assert_eq!(c.for_link(LinkKind::Tcp), c.tcp);
        assert_eq!(c.for_link(LinkKind::InProcess), CostModel::inproc());
    }

    #[test]
    fn what_is_not_a_profile_is_refused_naming_it() {
        let e = Calibrated::from_json(&serde_json::json!({"x": 1}), "p.json").unwrap_err();
        assert!(e.contains("p.json is not an Accord profile"), "{e}");
        let mut v = profile(8.0, 1e4);
        v["tcp"]["pingpong"] = serde_json::json!([]);
        let e = Calibrated::from_json(&v, "p.json").unwrap_err();
        assert!(e.contains("no usable tcp ping-pong"), "{e}");
        v["tcp"]["pingpong"] = serde_json::json!([[8, -1.0]]);
        assert!(Calibrated::from_json(&v, "p.json").is_err());
        let e = Calibrated::load("/nonexistent/profile.json").unwrap_err();
        assert!(e.starts_with("/nonexistent/profile.json: "), "{e}");
    }

    /// A calibrated network moves the direct all-to-all's crossover no further than the
    /// built-in model puts it: 256 KiB over 4 and 8 ranks (64 and 32 KiB blocks) stays direct,
    /// as measured faster there, and 4 KiB calls (1 KiB and 512 B blocks) stay with pairwise or
    /// Bruck.
    #[test]
    fn a_calibrated_network_keeps_the_direct_all_to_all_where_it_was_measured_faster() {
        let c = Calibrated::from_json(&profile(8.5, 9_900.0), "p").unwrap();
        assert!(c.tcp.concurrent_share < CostModel::tcp().concurrent_share);
        let a2a = |bytes: usize, p| Collective::AllToAll {
            send_counts: vec![bytes / 4 / p; p],
            recv_counts: vec![bytes / 4 / p; p],
        };
        for p in [4, 8] {
            assert_eq!(
                tuner::select(&a2a(256 << 10, p), p, 4, &c.tcp),
                Algorithm::Direct
            );
            assert_ne!(
                tuner::select(&a2a(4 << 10, p), p, 4, &c.tcp),
                Algorithm::Direct
            );
        }
    }

    /// Over many ranks a network faster per message than the built-in 10 Gb Ethernet makes
    /// the tuner keep the binomial tree for a 1 MiB broadcast, where the built-in model's 25 us
    /// messages make the scatter-allgather's `p` rounds look cheap.
    #[test]
    fn a_calibrated_network_changes_the_tuners_choice() {
        let c = Calibrated::from_json(&profile(8.0, 10_000.0), "p").unwrap();
        let coll = Collective::Broadcast {
            count: 1 << 18,
            root: 0,
        };
        assert_eq!(
            tuner::select(&coll, 128, 4, &CostModel::tcp()),
            Algorithm::ScatterAllgather
        );
        assert_eq!(
            tuner::select(&coll, 128, 4, &c.tcp),
            Algorithm::BinomialTree
        );
    }
}
