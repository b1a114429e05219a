//! The doctor's findings: checks grouped in sections, printed as text or as JSON.

use serde_json::{Map, Value};

/// Version of the `--json` document; bumped when a field changes meaning or goes away.
pub const SCHEMA: u32 = 1;

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Present and working.
    Ok,
    /// Worth knowing; not a problem.
    Info,
    /// Runs work, but worse than they could or only in some setups.
    Warn,
    /// A run as asked needs this and will not work without it.
    Fail,
    /// Not checked, and the summary says why.
    Skipped,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skipped => "skip",
        }
    }
}

/// One finding.
pub struct Check {
    /// Stable key in the JSON document.
    pub id: &'static str,
    /// What the text report calls it.
    pub name: &'static str,
    pub status: Status,
    /// One line.
    pub summary: String,
    /// Further lines of the text report.
    pub notes: Vec<String>,
    /// Machine-readable values, merged into the check's JSON object.
    pub facts: Map<String, Value>,
}

impl Check {
    pub fn new(id: &'static str, name: &'static str, status: Status, summary: String) -> Check {
        Check {
            id,
            name,
            status,
            summary,
            notes: Vec::new(),
            facts: Map::new(),
        }
    }

    pub fn note(mut self, line: impl Into<String>) -> Check {
        self.notes.push(line.into());
        self
    }

    pub fn fact(mut self, key: &str, value: impl Into<Value>) -> Check {
        self.facts.insert(key.to_string(), value.into());
        self
    }
}

/// Checks about one subject.
pub struct Section {
    /// Stable key in the JSON document.
    pub id: &'static str,
    pub title: &'static str,
    pub checks: Vec<Check>,
}

/// The whole report.
pub struct Report {
    /// The world size the limits were checked for.
    pub np: usize,
    /// `--gpu`: a missing GPU is a failure.
    pub gpu_required: bool,
    pub sections: Vec<Section>,
}

impl Report {
    /// `name: summary` of every failed check.
    pub fn failures(&self) -> Vec<String> {
        self.checks()
            .filter(|c| c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.name, c.summary))
            .collect()
    }

    fn checks(&self) -> impl Iterator<Item = &Check> {
        self.sections.iter().flat_map(|s| &s.checks)
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "accord doctor: this host for a run of {} ranks{}\n",
            self.np,
            if self.gpu_required { " on GPUs" } else { "" }
        );
        let width = self.checks().map(|c| c.name.len()).max().unwrap_or(0);
        for s in &self.sections {
            out.push_str(&format!("\n{}\n", s.title));
            for c in &s.checks {
                out.push_str(&format!(
                    "  {:<4}  {:<width$}  {}\n",
                    c.status.word(),
                    c.name,
                    c.summary
                ));
                for n in &c.notes {
                    for line in n.lines() {
                        out.push_str(&format!("        {:<width$}  {line}\n", ""));
                    }
                }
            }
        }
        let failures = self.failures();
        let warnings = self.checks().filter(|c| c.status == Status::Warn).count();
        out.push('\n');
        if failures.is_empty() {
            out.push_str(&format!(
                "Ready for {} runs of {} ranks{}.\n",
                if self.gpu_required { "GPU" } else { "CPU" },
                self.np,
                match warnings {
                    0 => String::new(),
                    n => format!(" ({n} warning(s) above)"),
                }
            ));
        } else {
            out.push_str(&format!(
                "Not ready: {} problem(s), marked FAIL above.\n",
                failures.len()
            ));
        }
        out
    }

    pub fn json(&self) -> Value {
        let mut sections = Map::new();
        for s in &self.sections {
            let mut checks = Map::new();
            for c in &s.checks {
                let mut o = Map::new();
                o.insert("status".into(), c.status.word().to_lowercase().into());
                o.insert("summary".into(), c.summary.clone().into());
                o.extend(c.facts.clone());
                checks.insert(c.id.into(), Value::Object(o));
            }
            sections.insert(s.id.into(), Value::Object(checks));
        }
        serde_json::json!({
            "schema": SCHEMA,
            "command": "doctor",
            "ok": self.failures().is_empty(),
            "np": self.np,
            "gpu_required": self.gpu_required,
            "failures": self.failures(),
            "sections": sections,
        })
    }
}

/// `1536` -> `1.5 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(status: Status) -> Report {
        Report {
            np: 4,
            gpu_required: false,
            sections: vec![Section {
                id: "files",
                title: "Files",
                checks: vec![
                    Check::new("open_files", "open files", status, "limit 64".into())
                        .note("raise it")
                        .fact("soft", 64),
                ],
            }],
        }
    }

    #[test]
    fn a_failed_check_is_named_in_text_json_and_failures() {
        let r = report(Status::Fail);
        assert_eq!(r.failures(), vec!["open files: limit 64".to_string()]);
        let text = r.text();
        assert!(text.contains("FAIL  open files  limit 64"), "{text}");
        assert!(
            text.contains("raise it") && text.contains("Not ready"),
            "{text}"
        );
        let j = r.json();
        assert_eq!(j["ok"], false);
        assert_eq!(j["schema"], SCHEMA);
        assert_eq!(j["sections"]["files"]["open_files"]["status"], "fail");
        assert_eq!(j["sections"]["files"]["open_files"]["soft"], 64);
    }

    #[test]
    fn warnings_leave_the_host_ready() {
        let r = report(Status::Warn);
        assert!(r.failures().is_empty());
        assert!(r
            .text()
            .contains("Ready for CPU runs of 4 ranks (1 warning(s) above)."));
        assert_eq!(r.json()["ok"], true);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(24 << 30), "24.0 GiB");
    }
}
