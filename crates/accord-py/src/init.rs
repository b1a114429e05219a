//! Joining a job: the rendezvous store server, `init`, and the module's other functions.

use crate::communicator::Communicator;
use crate::errors::to_py as err;
use accord::rendezvous::{self, InitMethod, StoreServer as CoreServer};
use accord::DataType;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Mutex;
use std::time::Duration;

/// A rendezvous store server in this process: other processes reach it at `host:port` with the
/// same `token`. Pass it to `init(store=...)` on the rank that hosts it, which then keeps it
/// alive for the communicator's lifetime.
#[pyclass(module = "accord._native")]
pub(crate) struct StoreServer {
    server: Mutex<Option<CoreServer>>,
    port: u16,
    token: String,
}

#[pymethods]
impl StoreServer {
    /// Listen on `host:port` (port 0: a free port). A random token is made when none is given.
    #[new]
    #[pyo3(signature = (host="0.0.0.0", port=0, token=None))]
    fn new(host: &str, port: u16, token: Option<String>) -> PyResult<Self> {
        let token = token.unwrap_or_else(|| accord::auth::Token::random().as_str());
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let server = CoreServer::bind(&addr, accord::auth::Token::new(&token)).map_err(err)?;
        Ok(StoreServer {
            port: server.addr().port(),
            server: Mutex::new(Some(server)),
            token,
        })
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The shared secret clients must know.
    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    /// Stop serving (unless a communicator has taken it over).
    fn close(&self) {
        if let Some(mut s) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() {
            s.shutdown();
        }
    }
}

/// Join a job and return the world communicator. See `accord.init` for the arguments; `token`
/// and `store_external` override `ACCORD_TOKEN` / `ACCORD_STORE_EXTERNAL`, and `store` is a
/// StoreServer of this process that the communicator takes over.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (method="env://", rank=None, world_size=None, timeout=None, token=None, store_external=false, store=None))]
pub(crate) fn init(
    py: Python<'_>,
    method: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Option<f64>,
    token: Option<String>,
    store_external: bool,
    store: Option<PyRef<'_, StoreServer>>,
) -> PyResult<Communicator> {
    let method = InitMethod::parse(method).map_err(err)?;
    let timeout = match timeout {
        Some(t) if t.is_finite() && t > 0.0 => Duration::from_secs_f64(t),
        Some(_) => {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ))
        }
        None => accord::comm::timeout_from_env(),
    };
    let external = store_external || store.is_some();
    let vars = move |k: &str| match k {
        "ACCORD_TOKEN" if token.is_some() => token.clone(),
        "ACCORD_STORE_EXTERNAL" if external => Some("1".into()),
        _ => std::env::var(k).ok(),
    };
    let mut rdv = py
        .allow_threads(|| {
            rendezvous::init_with_vars(&method, rank, world_size, Some(timeout), vars)
        })
        .map_err(err)?;
    if let Some(s) = store {
        rdv.server = s.server.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
    let inner = py
        .allow_threads(move || accord::from_rendezvous(rdv, timeout))
        .map_err(err)?;
    Ok(Communicator::wrap(inner))
}

/// Run the `accord` command line (`run`, `bench`, `store`) in this process; returns the exit
/// code. `self_cmd` is the command that starts it again (for `bench`'s ranks).
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, args: Vec<String>, self_cmd: Vec<String>) -> i32 {
    py.allow_threads(move || accord_cli::main_with(args, self_cmd))
}

/// The dtypes accord can communicate, by their usual names.
#[pyfunction]
pub(crate) fn dtypes() -> Vec<String> {
    DataType::ALL.iter().map(|d| d.to_string()).collect()
}
