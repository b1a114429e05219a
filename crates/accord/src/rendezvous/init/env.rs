//! What the environment says about this process: the launcher families' rank and size variables,
//! the store address, the token and the join settings, parsed at every init.

use crate::auth::Token;
use crate::error::{Error, Result};
use crate::rendezvous::token;
use std::time::Duration;

/// One launcher's naming of rank, world size, local rank and local world size.
struct Family {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

/// In order of precedence; the first family whose rank variable is set supplies all four.
const FAMILIES: [Family; 5] = [
    Family {
        name: "Accord",
        rank: "ACCORD_RANK",
        size: "ACCORD_WORLD_SIZE",
        local_rank: "ACCORD_LOCAL_RANK",
        local_size: Some("ACCORD_LOCAL_WORLD_SIZE"),
    },
    Family {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Family {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Family {
        name: "PMI",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Family {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
];

pub(super) fn all_rank_vars() -> String {
    FAMILIES
        .iter()
        .map(|f| f.rank)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the environment says about this process. Built by [`EnvConfig::from_vars`]; fields are
/// `None` where no variable gave them.
#[derive(Debug, Clone, Default)]
pub struct EnvConfig {
    /// This process's rank.
    pub rank: Option<usize>,
    /// Number of processes.
    pub world_size: Option<usize>,
    /// Rank among the processes on this host.
    pub local_rank: Option<usize>,
    /// Number of processes on this host.
    pub local_world_size: Option<usize>,
    /// Launcher family that supplied the rank (`"Accord"`, `"torchrun"`, `"Open MPI"`, `"PMI"`,
    /// `"Slurm"`).
    pub source: Option<&'static str>,
    /// The world-size variable of that family, when it was not set.
    pub missing_world_var: Option<&'static str>,
    /// Store address `host:port`, from `ACCORD_STORE` or `MASTER_ADDR`:`MASTER_PORT`.
    pub store: Option<String>,
    /// The store-address variables that are missing, when `store` is `None`.
    pub missing_store_vars: Vec<&'static str>,
    /// `ACCORD_TOKEN`, else the contents of the file named by `ACCORD_TOKEN_FILE` (empty when
    /// neither is set).
    pub token: Token,
    /// `ACCORD_STORE_EXTERNAL=1`: a store already runs (e.g. our launcher's); rank 0 must not
    /// host one.
    pub store_external: bool,
    /// `ACCORD_TIMEOUT` in seconds.
    pub timeout: Option<Duration>,
    /// `ACCORD_JOIN_TIMEOUT` in seconds.
    pub join_timeout: Option<Duration>,
    /// `ACCORD_STORE_HOST`: the host name or IP that `file://` writes for others to connect to.
    pub store_host: Option<String>,
    /// `ACCORD_STORE_PREFIX`: namespace of the world's keys (default: the rendezvous's under
    /// [`INIT_PREFIX`](super::INIT_PREFIX), the rest at the store's root).
    pub prefix: Option<String>,
}

fn parse_seconds(var: &str, v: &str) -> Result<Duration> {
    let secs: f64 = v
        .trim()
        .parse()
        .map_err(|_| Error::invalid(format!("{var}={v:?} is not a number of seconds")))?;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(Error::invalid(format!(
            "{var}={v:?} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_usize(var: &str, v: &str) -> Result<usize> {
    v.trim().parse().map_err(|_| {
        Error::invalid(format!(
            "environment variable {var}={v:?} is not a non-negative integer"
        ))
    })
}

impl EnvConfig {
    /// Read the configuration through `get` (e.g. `|k| std::env::var(k).ok()`), so tests and
    /// embedders can supply variables without touching the process environment. Fails only on
    /// values that are set but unparsable, and on a token file that cannot be read or that
    /// others may read; missing values are reported by [`init()`](super::init()).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<EnvConfig> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut cfg = EnvConfig::default();
        if let Some(fam) = FAMILIES.iter().find(|f| get(f.rank).is_some()) {
            cfg.source = Some(fam.name);
            cfg.rank = Some(parse_usize(fam.rank, &get(fam.rank).unwrap_or_default())?);
            match get(fam.size) {
                Some(v) => cfg.world_size = Some(parse_usize(fam.size, &v)?),
                None => cfg.missing_world_var = Some(fam.size),
            }
            if let Some(v) = get(fam.local_rank) {
                cfg.local_rank = Some(parse_usize(fam.local_rank, &v)?);
            }
            if let Some(var) = fam.local_size {
                if let Some(v) = get(var) {
                    cfg.local_world_size = Some(parse_usize(var, &v)?);
                }
            }
        }
        if let Some(s) = get("ACCORD_STORE") {
            cfg.store = Some(s.trim().to_string());
        } else {
            match (get("MASTER_ADDR"), get("MASTER_PORT")) {
                (Some(a), Some(p)) => {
                    let port: u16 = p.trim().parse().map_err(|_| {
                        Error::invalid(format!(
                            "environment variable MASTER_PORT={p:?} is not a port"
                        ))
                    })?;
                    let a = a.trim();
                    cfg.store = Some(if a.contains(':') && !a.starts_with('[') {
                        format!("[{a}]:{port}")
                    } else {
                        format!("{a}:{port}")
                    });
                }
                (Some(_), None) => cfg.missing_store_vars = vec!["MASTER_PORT"],
                (None, Some(_)) => cfg.missing_store_vars = vec!["MASTER_ADDR"],
                (None, None) => {
                    cfg.missing_store_vars = vec!["ACCORD_STORE", "MASTER_ADDR", "MASTER_PORT"]
                }
            }
        }
        cfg.token = token::from_vars(get)?;
        cfg.store_external = get("ACCORD_STORE_EXTERNAL").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        });
        if let Some(v) = get("ACCORD_TIMEOUT") {
            cfg.timeout = Some(parse_seconds("ACCORD_TIMEOUT", &v)?);
        }
        if let Some(v) = get("ACCORD_JOIN_TIMEOUT") {
            cfg.join_timeout = Some(parse_seconds("ACCORD_JOIN_TIMEOUT", &v)?);
        }
        cfg.store_host = get("ACCORD_STORE_HOST").map(|s| s.trim().to_string());
        cfg.prefix = get("ACCORD_STORE_PREFIX").map(|s| s.trim().to_string());
        Ok(cfg)
    }

    /// Read the process environment.
    pub fn from_env() -> Result<EnvConfig> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::init::tests::vars;

    #[test]
    fn env_accord_family_and_defaults() {
        let c = EnvConfig::from_vars(vars(&[
            ("ACCORD_RANK", "3"),
            ("ACCORD_WORLD_SIZE", "8"),
            ("ACCORD_LOCAL_RANK", "1"),
            ("ACCORD_STORE", "node0:1234"),
            ("ACCORD_TOKEN", "t"),
            ("ACCORD_STORE_EXTERNAL", "1"),
            ("ACCORD_TIMEOUT", "2.5"),
            // Lower-precedence families are ignored.
            ("RANK", "5"),
            ("MASTER_ADDR", "other"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.source),
            (Some(3), Some(8), Some(1), Some("Accord"))
        );
        assert_eq!(c.store.as_deref(), Some("node0:1234"));
        assert_eq!(c.token, Token::new("t"));
        assert!(c.store_external);
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));

        let c = EnvConfig::from_vars(vars(&[])).unwrap();
        assert_eq!((c.rank, c.world_size, c.store), (None, None, None));
        assert_eq!(c.token, Token::default());
        assert!(!c.store_external);
    }

    #[test]
    fn env_torchrun_family() {
        let c = EnvConfig::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.local_world_size),
            (Some(1), Some(4), Some(1), Some(2))
        );
        assert_eq!(c.source, Some("torchrun"));
        assert_eq!(c.store.as_deref(), Some("10.1.2.3:29500"));
        let c =
            EnvConfig::from_vars(vars(&[("MASTER_ADDR", "::1"), ("MASTER_PORT", "9")])).unwrap();
        assert_eq!(c.store.as_deref(), Some("[::1]:9"));
    }

    #[test]
    fn env_openmpi_pmi_slurm_families() {
        let c = EnvConfig::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("SLURM_PROCID", "9"),
        ]))
        .unwrap();
        assert_eq!(
            (
                c.rank,
                c.world_size,
                c.local_rank,
                c.local_world_size,
                c.source
            ),
            (Some(2), Some(6), Some(0), Some(3), Some("Open MPI"))
        );
        let c = EnvConfig::from_vars(vars(&[("PMI_RANK", "4"), ("PMI_SIZE", "5")])).unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.source),
            (Some(4), Some(5), Some("PMI"))
        );
        let c = EnvConfig::from_vars(vars(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "3"),
        ]))
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.local_rank, c.source),
            (Some(7), Some(16), Some(3), Some("Slurm"))
        );
    }

    #[test]
    fn join_timeout_variable() {
        let c = EnvConfig::from_vars(vars(&[("ACCORD_JOIN_TIMEOUT", "1.5")])).unwrap();
        assert_eq!(c.join_timeout, Some(Duration::from_millis(1500)));
        for bad in ["0", "-1", "soon"] {
            let e = EnvConfig::from_vars(vars(&[("ACCORD_JOIN_TIMEOUT", bad)])).unwrap_err();
            assert!(e.to_string().contains("ACCORD_JOIN_TIMEOUT"), "{e}");
        }
    }
}
