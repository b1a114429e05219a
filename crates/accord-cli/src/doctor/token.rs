//! The job token ranks would authenticate with: which variable supplies it and whether its
//! file reads as the ranks will read it (`accord::rendezvous::token`). The token itself is
//! never shown.

use super::report::{Check, Section, Status};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

pub fn section() -> Section {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    Section {
        id: "token",
        title: "Job token",
        checks: vec![check(
            env("ACCORD_TOKEN").is_some(),
            env("ACCORD_TOKEN_FILE"),
        )],
    }
}

/// The finding for `ACCORD_TOKEN` being set (`token_set`) and `ACCORD_TOKEN_FILE` naming
/// `file`; the variable wins over the file, as at init.
fn check(token_set: bool, file: Option<String>) -> Check {
    const ID: &str = "token";
    const NAME: &str = "token";
    let base = |status, summary: String| {
        Check::new(ID, NAME, status, summary)
            .fact("token_set", token_set)
            .fact("token_file", file.as_deref().map(str::trim))
    };
    let Some(path) = file.as_deref().map(str::trim) else {
        return if token_set {
            base(
                Status::Ok,
                "ACCORD_TOKEN is set (its value is not shown)".into(),
            )
            .fact("source", "ACCORD_TOKEN")
        } else {
            base(
                Status::Info,
                "neither ACCORD_TOKEN nor ACCORD_TOKEN_FILE is set: `accord run` makes a token \
                 per job; ranks started any other way (torchrun, mpirun, by hand) would run \
                 unauthenticated"
                    .into(),
            )
            .fact("source", "none")
        };
    };
    let meta = std::fs::metadata(path).ok();
    let mode = meta
        .as_ref()
        .map(|m| format!("{:04o}", m.permissions().mode() & 0o777));
    // SAFETY: getuid cannot fail.
    let mine = meta.as_ref().map(|m| m.uid() == unsafe { libc::getuid() });
    let owner = match mine {
        Some(false) => ", owned by another user",
        _ => "",
    };
    let read = accord::rendezvous::token::read_token_file(Path::new(path));
    let c = match (&read, token_set) {
        (Ok(_), false) => base(
            Status::Ok,
            format!(
                "ACCORD_TOKEN_FILE={path}: readable, permissions {}{owner}",
                mode.as_deref().unwrap_or("unknown")
            ),
        )
        .fact("source", "ACCORD_TOKEN_FILE"),
        (Ok(_), true) => base(
            Status::Ok,
            "ACCORD_TOKEN is set (its value is not shown); it wins over ACCORD_TOKEN_FILE".into(),
        )
        .note(format!("ACCORD_TOKEN_FILE={path} is readable too"))
        .fact("source", "ACCORD_TOKEN"),
        (Err(e), false) => base(Status::Fail, format!("{e}"))
            .note("every rank reads this file at init and would stop with this error")
            .fact("source", "ACCORD_TOKEN_FILE"),
        (Err(e), true) => base(
            Status::Warn,
            format!("{e} (ignored: ACCORD_TOKEN is set and wins)"),
        )
        .fact("source", "ACCORD_TOKEN"),
    };
    c.fact("token_file_readable", read.is_ok())
        .fact("token_file_mode", mode)
        .fact("error", read.err().map(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(contents: &str, mode: u32) -> (std::path::PathBuf, String) {
        let dir = std::env::temp_dir().join(format!(
            "accord-doctor-token-{}-{mode:o}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tok");
        std::fs::write(&p, contents).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        let s = p.to_string_lossy().into_owned();
        (dir, s)
    }

    #[test]
    fn a_good_file_is_ok_and_its_secret_is_not_shown() {
        let (dir, path) = file("s3cret-value\n", 0o600);
        let c = check(false, Some(path.clone()));
        assert_eq!(c.status, Status::Ok, "{}", c.summary);
        assert!(c.summary.contains(&path) && c.summary.contains("0600"));
        let all = format!("{} {:?} {:?}", c.summary, c.notes, c.facts);
        assert!(!all.contains("s3cret"), "{all}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_open_file_fails_unless_the_variable_wins() {
        let (dir, path) = file("s3cret", 0o644);
        let c = check(false, Some(path.clone()));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.summary.contains("too open") && c.summary.contains(&path),
            "{}",
            c.summary
        );
        assert_eq!(check(true, Some(path)).status, Status::Warn);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_token_is_information() {
        let c = check(false, None);
        assert_eq!(c.status, Status::Info);
        assert_eq!(c.facts["source"], "none");
        assert_eq!(check(true, None).status, Status::Ok);
    }
}
