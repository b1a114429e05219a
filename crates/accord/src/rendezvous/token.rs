//! The job's token from the environment, and the warning when a job has none.
//!
//! `ACCORD_TOKEN` holds the secret itself; `ACCORD_TOKEN_FILE` names a file holding it (surrounding
//! whitespace ignored), for launchers that pass the environment on in the clear or cannot make a
//! secret per job: a file on a shared home is readable by every rank of the user and nobody else.
//! Like ssh with a private key, a token file that its group or others may read or write is
//! refused. Without either, the token is empty: every connection still runs the handshake, but
//! anyone can compute the proof for an empty key, so nothing is authenticated, and
//! [`warn_unauthenticated`] says so once per process.

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
