//! `accord analyze DIR`: merge the ranks' flight records (see `accord::observe`) and say which
//! rank is behind, on which operation, where ranks disagree, and who waited for whom.
//!
//! Ranks are compared per communicator and per ordered lane (host collectives by sequence
//! number, device collectives by their count): the rank whose last call is furthest behind the
//! others' is the one they wait for; two ranks whose calls of the same number differ
//! desynchronised there. The verdict is the first of: ranks with no record at all, a
//! disagreement, a rank behind.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One rank's file.
#[derive(Debug, Clone)]
pub struct RankDump {
    pub job: String,
    pub world_rank: usize,
    pub world_size: usize,
    pub reasons: Vec<String>,
    pub dumped_at_us: f64,
    pub comms: Vec<CommDump>,
}

/// One communicator in one rank's file.
#[derive(Debug, Clone)]
pub struct CommDump {
    pub name: String,
    pub id: u64,
    pub world_ranks: Vec<usize>,
    pub error: Option<String>,
    /// (sequence number, world ranks) of calls blocked at dump time.
    pub waiting: Vec<(u64, Vec<usize>)>,
    pub records: Vec<Call>,
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Call {
    pub lane: String,
    pub seq: u64,
    pub what: String,
    pub counts_hash: u64,
    pub state: String,
}

fn parse(v: &Value) -> Option<RankDump> {
    if v.get("format")?.as_str()? != accord::observe::DUMP_FORMAT {
        return None;
    }
    let comms = v
        .get("communicators")?
        .as_array()?
        .iter()
        .filter_map(|c| {
            Some(CommDump {
                name: c.get("name")?.as_str()?.to_string(),
                id: c.get("id")?.as_u64()?,
                world_ranks: c
                    .get("world_ranks")?
                    .as_array()?
                    .iter()
                    .filter_map(|r| r.as_u64().map(|r| r as usize))
                    .collect(),
                error: c.get("error").and_then(|e| e.as_str()).map(str::to_string),
                waiting: c
                    .get("waiting")
                    .and_then(|w| w.as_array())
                    .map(|w| {
                        w.iter()
                            .filter_map(|b| {
                                let ranks = b.get("ranks")?.as_array()?;
                                Some((
                                    b.get("seq")?.as_u64()?,
                                    ranks
                                        .iter()
                                        .filter_map(|r| r.as_u64())
                                        .map(|r| r as usize)
                                        .collect(),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                records: c
                    .get("records")?
                    .as_array()?
                    .iter()
                    .filter_map(|r| {
                        Some(Call {
                            lane: r.get("lane")?.as_str()?.to_string(),
                            seq: r.get("seq")?.as_u64()?,
                            what: r.get("fingerprint")?.as_str()?.to_string(),
                            counts_hash: r.get("counts_hash").and_then(|h| h.as_u64()).unwrap_or(0),
                            state: r.get("state")?.as_str()?.to_string(),
                        })
                    })
                    .collect(),
            })
        })
        .collect();
    Some(RankDump {
        job: v.get("job")?.as_str()?.to_string(),
        world_rank: v.get("world_rank")?.as_u64()? as usize,
        world_size: v.get("world_size")?.as_u64()? as usize,
        reasons: v
            .get("reasons")
            .and_then(|r| r.as_array())
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        dumped_at_us: v
            .get("dumped_at_us")
            .and_then(|t| t.as_f64())
            .unwrap_or(0.0),
        comms,
    })
}

/// The dumps of one job in `dir`: `job`, else the job dumped last. Errors name what was wrong.
pub fn load(dir: &Path, job: Option<&str>) -> Result<Vec<RankDump>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut all = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("accord-flight-") || !name.ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(e.path())
            .map_err(|err| format!("cannot read {}: {err}", e.path().display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|err| format!("{} is not JSON: {err}", e.path().display()))?;
        match parse(&v) {
            Some(d) => all.push(d),
            None => {
                return Err(format!(
                    "{} is not an Accord flight record",
                    e.path().display()
                ))
            }
        }
    }
    if all.is_empty() {
        return Err(format!(
            "no flight records (accord-flight-*.json) in {}",
            dir.display()
        ));
    }
    let job = match job {
        Some(j) => j.to_string(),
        None => all
            .iter()
            .max_by(|a, b| a.dumped_at_us.total_cmp(&b.dumped_at_us))
            .map(|d| d.job.clone())
            .unwrap_or_default(),
    };
    let jobs: BTreeSet<String> = all.iter().map(|d| d.job.clone()).collect();
    all.retain(|d| d.job == job);
    if all.is_empty() {
        let known: Vec<String> = jobs.into_iter().collect();
        return Err(format!(
            "no records of job {job} in {}; jobs there: {}",
            dir.display(),
            known.join(", ")
        ));
    }
    all.sort_by_key(|d| d.world_rank);
    Ok(all)
}

/// What the records say, as lines for people and as JSON.
pub struct Findings {
    pub lines: Vec<String>,
    pub verdict: String,
    pub json: Value,
}

fn list(ranks: &[usize]) -> String {
    let s: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    match ranks.len() {
        1 => format!("rank {}", s[0]),
        _ => format!("ranks {}", s.join(", ")),
    }
}

/// Compare the ranks' records of one job.
pub fn analyze(dumps: &[RankDump]) -> Findings {
    let job = dumps.first().map(|d| d.job.clone()).unwrap_or_default();
    let size = dumps.iter().map(|d| d.world_size).max().unwrap_or(0);
    let present: BTreeSet<usize> = dumps.iter().map(|d| d.world_rank).collect();
    let missing: Vec<usize> = (0..size).filter(|r| !present.contains(r)).collect();
    let mut lines = vec![format!(
        "job {job}: records of {} of {size} ranks",
        present.len()
    )];
    let mut reasons: Vec<String> = dumps.iter().flat_map(|d| d.reasons.clone()).collect();
    reasons.sort();
    reasons.dedup();
    for r in reasons.iter().take(8) {
        lines.push(format!("  dumped because: {r}"));
    }
    let mut verdicts: Vec<(u8, String)> = Vec::new();
    if !missing.is_empty() {
        let v = format!(
            "{} left no record: {} process ended before it could write one (killed, crashed) or never started",
            list(&missing),
            if missing.len() == 1 { "its" } else { "their" }
        );
        lines.push(format!("  {v}"));
        verdicts.push((0, v));
    }
    // (communicator name, id) -> world rank -> its view.
    let mut comms: BTreeMap<(String, u64), BTreeMap<usize, &CommDump>> = BTreeMap::new();
    for d in dumps {
        for c in &d.comms {
            comms
                .entry((c.name.clone(), c.id))
                .or_default()
                .insert(d.world_rank, c);
        }
    }
    let mut json_comms = Vec::new();
    for ((name, _), views) in &comms {
        let members: Vec<usize> = views
            .values()
            .next()
            .map(|c| c.world_ranks.clone())
            .unwrap_or_default();
        lines.push(format!("communicator {name} ({} ranks):", members.len()));
        let mut jc = json!({"name": name, "members": members});
        for (w, c) in views {
            if let Some(e) = &c.error {
                lines.push(format!(
                    "  rank {w} failed: {}",
                    e.lines().next().unwrap_or("")
                ));
            }
        }
        for lane in ["host", "device"] {
            if let Some((found, jl)) = compare_lane(name, lane, views, &members, &present) {
                for (rank, v) in found {
                    lines.push(format!("  {v}"));
                    verdicts.push((rank, v));
                }
                jc[lane] = jl;
            }
        }
        for (w, c) in views {
            for (seq, ranks) in &c.waiting {
                lines.push(format!(
                    "  rank {w} was blocked in call #{seq}, waiting for {}",
                    list(ranks)
                ));
            }
        }
        json_comms.push(jc);
    }
    verdicts.sort_by_key(|v| v.0);
    let verdict = verdicts
        .first()
        .map(|v| v.1.clone())
        .unwrap_or_else(|| "every rank recorded the same calls; no rank is behind".into());
    Findings {
        json: json!({
            "job": job,
            "world_size": size,
            "ranks_with_records": present,
            "missing": missing,
            "reasons": reasons,
            "communicators": json_comms,
            "verdict": verdict,
        }),
        lines,
        verdict,
    }
}

/// Findings on one lane of one communicator, each with its precedence (1: disagreement,
/// 2: a rank behind), and the lane's JSON; `None` when no rank recorded a call there.
fn compare_lane(
    name: &str,
    lane: &str,
    views: &BTreeMap<usize, &CommDump>,
    members: &[usize],
    present: &BTreeSet<usize>,
) -> Option<(Vec<(u8, String)>, Value)> {
    // World rank -> seq -> call.
    let mut calls: BTreeMap<usize, BTreeMap<u64, &Call>> = BTreeMap::new();
    for (w, c) in views {
        let mine = calls.entry(*w).or_default();
        for r in c.records.iter().filter(|r| r.lane == lane) {
            mine.insert(r.seq, r);
        }
    }
    if calls.values().all(|c| c.is_empty()) {
        return None;
    }
    let mut found = Vec::new();
    // The first call number where ranks disagree.
    let seqs: BTreeSet<u64> = calls.values().flat_map(|c| c.keys().copied()).collect();
    let mut desync = Value::Null;
    for s in &seqs {
        let mut by_what: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
        for (w, c) in &calls {
            if let Some(call) = c.get(s) {
                by_what
                    .entry((call.what.clone(), call.counts_hash))
                    .or_default()
                    .push(*w);
            }
        }
        if by_what.len() > 1 {
            let parts: Vec<String> = by_what
                .iter()
                .map(|((what, _), ranks)| format!("{} called {what}", list(ranks)))
                .collect();
            found.push((
                1,
                format!(
                    "ranks disagree on {lane} call #{s} of {name}: {}",
                    parts.join("; ")
                ),
            ));
            desync = json!({"seq": s, "calls": by_what.iter().map(|((w, _), r)| json!({"call": w, "ranks": r})).collect::<Vec<_>>()});
            break;
        }
    }
    // How far each member got: its last call's number (0: none recorded).
    let last = |w: usize| {
        calls
            .get(&w)
            .and_then(|c| c.iter().next_back())
            .map(|(s, c)| (*s, *c))
    };
    let top = members
        .iter()
        .filter_map(|&w| last(w).map(|l| l.0))
        .max()
        .unwrap_or(0);
    let behind: Vec<usize> = members
        .iter()
        .copied()
        .filter(|w| present.contains(w) && last(*w).map_or(0, |l| l.0) < top)
        .collect();
    let ahead: Vec<usize> = members
        .iter()
        .copied()
        .filter(|w| last(*w).is_some_and(|l| l.0 == top))
        .collect();
    let top_call = ahead
        .first()
        .and_then(|&w| last(w))
        .map(|l| l.1.what.clone())
        .unwrap_or_default();
    let waited: Vec<usize> = ahead
        .iter()
        .copied()
        .filter(|&w| last(w).is_some_and(|l| l.1.state != "completed"))
        .collect();
    for &b in &behind {
        let mine = match last(b) {
            Some((s, c)) => format!("its last {lane} call is #{s} {} ({})", c.what, c.state),
            None => format!("it recorded no {lane} call"),
        };
        let wait = match waited.is_empty() {
            true => String::new(),
            false => " and waited for it".to_string(),
        };
        found.push((
            2,
            format!(
                "rank {b} is behind on {name}: {mine}; {} entered #{top} {top_call}{wait}",
                list(&ahead)
            ),
        ));
    }
    let json = json!({
        "last": members.iter().map(|&w| json!({"rank": w, "seq": last(w).map(|l| l.0), "call": last(w).map(|l| l.1.what.clone()), "state": last(w).map(|l| l.1.state.clone())})).collect::<Vec<_>>(),
        "behind": behind,
        "waited": waited,
        "desync": desync,
    });
    Some((found, json))
}

/// The command: print the findings (or their JSON); exit code 0 when records were read.
pub fn main(dir: &str, job: Option<&str>, as_json: bool) -> i32 {
    let dumps = match load(Path::new(dir), job) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("accord analyze: {e}");
            return 2;
        }
    };
    let f = analyze(&dumps);
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&f.json).unwrap_or_default()
        );
    } else {
        for l in &f.lines {
            println!("{l}");
        }
        println!("verdict: {}", f.verdict);
    }
    0
}
