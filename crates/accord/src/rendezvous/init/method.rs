//! The init method: which of `env://`, `tcp://host:port` or `file:///path` a job uses to find its
//! store.

use crate::error::{Error, Result};
use std::path::PathBuf;

/// How the processes of a job find each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitMethod {
    /// `env://`: rank, world size and store address from environment variables.
    Env,
    /// `tcp://host:port`: the store is at `host:port`, hosted by rank 0.
    Tcp {
        /// Host name or IP address of rank 0's machine.
        host: String,
        /// Port of the store.
        port: u16,
    },
    /// `file:///path`: rank 0 hosts the store on a free port and writes its address to `path`,
    /// which every rank must be able to read (a shared filesystem).
    File(PathBuf),
}

impl InitMethod {
    /// Parse `env://`, `tcp://host:port` (IPv6 as `tcp://[::1]:port`) or `file:///path`.
    pub fn parse(url: &str) -> Result<InitMethod> {
        let url = url.trim();
        if url == "env://" || url == "env:" || url == "env" {
            return Ok(InitMethod::Env);
        }
        if let Some(rest) = url.strip_prefix("tcp://") {
            let rest = rest.trim_end_matches('/');
            let bad = || {
                Error::invalid(format!(
                    "init method {url:?}: expected tcp://host:port (e.g. tcp://10.0.0.1:29500)"
                ))
            };
            let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port: u16 = port.parse().map_err(|_| bad())?;
            if host.is_empty() {
                return Err(bad());
            }
            return Ok(InitMethod::Tcp {
                host: host.to_string(),
                port,
            });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(Error::invalid(format!(
                    "init method {url:?}: expected file:///path/to/shared/file"
                )));
            }
            return Ok(InitMethod::File(PathBuf::from(path)));
        }
        Err(Error::invalid(format!(
            "unknown init method {url:?}: use env://, tcp://host:port or file:///path"
        )))
    }
}

impl std::str::FromStr for InitMethod {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        InitMethod::parse(s)
    }
}

impl std::fmt::Display for InitMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitMethod::Env => f.write_str("env://"),
            InitMethod::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp://[{host}]:{port}")
            }
            InitMethod::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            InitMethod::File(p) => write!(f, "file://{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_urls() {
        assert_eq!(InitMethod::parse("env://").unwrap(), InitMethod::Env);
        assert_eq!(
            InitMethod::parse("tcp://10.0.0.1:29500").unwrap(),
            InitMethod::Tcp {
                host: "10.0.0.1".into(),
                port: 29500
            }
        );
        let v6 = InitMethod::parse("tcp://[::1]:7").unwrap();
        assert_eq!(
            v6,
            InitMethod::Tcp {
                host: "::1".into(),
                port: 7
            }
        );
        assert_eq!(v6.to_string(), "tcp://[::1]:7");
        assert_eq!(
            InitMethod::parse("file:///tmp/x").unwrap(),
            InitMethod::File("/tmp/x".into())
        );
        for bad in [
            "tcp://host",
            "tcp://:1",
            "tcp://h:99999",
            "file://",
            "udp://x:1",
            "",
        ] {
            assert!(
                matches!(InitMethod::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }
}
