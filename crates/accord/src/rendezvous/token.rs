//! The job's token from the environment, and the warning when a job has none.
//!
//! `ACCORD_TOKEN` holds the secret itself; `ACCORD_TOKEN_FILE` names a file holding it (surrounding
//! whitespace ignored), for launchers that pass the environment on in the clear or cannot make a
//! secret per job: a file on a shared home is readable by every rank of the user and nobody else.
//! Like ssh with a private key, a token file that its group or others may read or write is
//! refused. Without either, the token is empty: every connection still runs the handshake, but
//! anyone can compute the proof for an empty key, so nothing is authenticated, and
//! `warn_unauthenticated` says so once per process.

use crate::auth::Token;
use crate::error::{Error, Result};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Once;

/// The token named by the variables read through `get` (values already trimmed, empty ones
/// unset): `ACCORD_TOKEN`, else the contents of `ACCORD_TOKEN_FILE`, else the empty token.
pub(crate) fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Token> {
    if let Some(t) = get("ACCORD_TOKEN") {
        return Ok(Token::new(t));
    }
    match get("ACCORD_TOKEN_FILE") {
        Some(path) => read_token_file(Path::new(path.trim())),
        None => Ok(Token::default()),
    }
}

/// The token stored in `path`, which only its owner may read or write.
pub fn read_token_file(path: &Path) -> Result<Token> {
    let what = format!("ACCORD_TOKEN_FILE={}", path.display());
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::io(format!("{what}: cannot open it"), e))?;
    // Checked on the open file, so the file read is the file checked.
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("{what}: cannot read its permissions"), e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!("{what} is not a regular file")));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::invalid(format!(
            "{what}: permissions {mode:04o} are too open: the job's token must be readable and \
             writable by its owner only (run `chmod 600 {}`)",
            path.display()
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("{what}: cannot read it"), e))?;
    let secret = bytes.trim_ascii();
    if secret.is_empty() {
        return Err(Error::invalid(format!(
            "{what} is empty: put the job's secret in it (e.g. `openssl rand -hex 32`)"
        )));
    }
    Ok(Token::new(secret))
}

/// Say on stderr, once per process, that the job runs without authentication and how to fix it.
pub(crate) fn warn_unauthenticated() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "accord: warning: no job token (ACCORD_TOKEN or ACCORD_TOKEN_FILE is unset), so the \
             store and the connections between ranks are unauthenticated: anyone who can reach \
             their ports can read and overwrite store keys or join the job. Give every rank the \
             same secret: ACCORD_TOKEN_FILE=<a file only you can read, e.g. on a shared home>, \
             ACCORD_TOKEN exported by the batch script, or accord.init(mpi_comm=...) under MPI; \
             `accord run` makes one itself."
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn file(name: &str, contents: &str, mode: u32) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "accord-token-{}-{:08x}",
            std::process::id(),
            u32::from_le_bytes(crate::auth::random_bytes::<4>())
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, contents).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn token_file_contents_without_surrounding_whitespace() {
        let p = file("tok", "  s3cret\n", 0o600);
        assert_eq!(read_token_file(&p).unwrap(), Token::new("s3cret"));
        let path = p.to_str().unwrap();
        assert_eq!(
            from_vars(vars(&[("ACCORD_TOKEN_FILE", path)])).unwrap(),
            Token::new("s3cret")
        );
        // The variable itself wins over the file.
        let both = [("ACCORD_TOKEN", "direct"), ("ACCORD_TOKEN_FILE", path)];
        assert_eq!(from_vars(vars(&both)).unwrap(), Token::new("direct"));
        assert_eq!(from_vars(vars(&[])).unwrap(), Token::default());
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn token_file_others_may_read_or_write_is_refused() {
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            let p = file("tok", "s3cret", mode);
            let e = read_token_file(&p).unwrap_err().to_string();
            assert!(
                e.contains(&format!("permissions {mode:04o} are too open"))
                    && e.contains(&format!("chmod 600 {}", p.display())),
                "{e}"
            );
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
        let p = file("tok", "s3cret", 0o400);
        assert_eq!(read_token_file(&p).unwrap(), Token::new("s3cret"));
        std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
    }

    #[test]
    fn token_file_missing_empty_or_not_a_file_is_an_error() {
        let p = file("tok", " \n", 0o600);
        let e = read_token_file(&p).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        let dir = p.parent().unwrap().to_path_buf();
        let e = read_token_file(&dir.join("absent"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ACCORD_TOKEN_FILE=") && e.contains("cannot open"),
            "{e}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = read_token_file(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
