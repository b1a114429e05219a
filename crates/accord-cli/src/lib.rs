//! The `accord` command: launcher, benchmark and standalone rendezvous store.
//!
//! Also a library, so that other front ends (the Python package's `python -m accord`) can run
//! the same command line in-process with [`main_with`].

mod analyze;
mod bench;
mod calibrate;
mod doctor;
/// The operations `accord bench` knows.
pub use bench::OPS;
mod bench_fft;
mod bench_gpu;
mod bench_put;
mod launch;
mod plot;
mod progress;
mod selftest;
mod sim;
mod sim_profile;

use accord::DataType;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "accord",
    version,
    about = "Collective communication for distributed CPUs and GPUs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct BenchArgs {
    /// Operation: allreduce, broadcast, reduce, allgather, gather, scatter, reduce_scatter,
    /// alltoall, sendrecv, barrier; or copy (no communication: every rank copies its buffer
    /// at once, as large collective outputs are filled; busbw is the bytes all ranks read and
    /// wrote per second, the memory bandwidth that bounds large collectives); or put (with
    /// --device cuda, 2 ranks: memory channels between two GPUs, put and LL-packet tables);
    /// or fft / redistribute (--shape: a distributed 3-D FFT in slabs, forward and backward;
    /// X slabs to Y slabs beside an alltoallv of the same bytes).
    #[arg(default_value = "allreduce")]
    op: String,
    /// Size range in bytes, MIN:MAX (suffixes K, M, G).
    #[arg(long, default_value = "4:4M")]
    sizes: String,
    /// Multiply the size by this between rows.
    #[arg(long, default_value_t = 2)]
    factor: usize,
    /// Element type (f32, f64, i32, i64; fft and redistribute: f32/c64 single precision,
    /// f64/c128 double, complex either way).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// fft and redistribute: the global array's shape, comma-separated.
    #[arg(long, default_value = "128,128,128")]
    shape: String,
    /// Print the tuner's cost table for each size.
    #[arg(long)]
    explain: bool,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    json: Option<String>,
    /// Draw time and bus bandwidth per size to this SVG file.
    #[arg(long, value_name = "SVG")]
    plot: Option<String>,
    /// With --plot: also draw an earlier run's --json file (repeatable).
    #[arg(long, value_name = "JSON", requires = "plot")]
    overlay: Vec<String>,
    /// Timed iterations per size (default: automatic by size).
    #[arg(long, default_value_t = 0)]
    iters: usize,
    /// Force an algorithm for this operation (sets ACCORD_ALGO_<OP>).
    #[arg(long)]
    algo: Option<String>,
    /// Where the buffers live: `cpu`, or `cuda` (one GPU per rank through NCCL; LOCAL_RANK
    /// picks the device).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// With --device cuda: who runs the collectives, `auto` (Accord's kernels or NCCL by size),
    /// `accord` (Accord's kernels wherever they apply) or `nccl` (sets ACCORD_GPU_ENGINE).
    #[arg(long)]
    engine: Option<String>,
    /// With --device cuda: place the buffers in the symmetric heap (`alloc_symmetric`), which
    /// Accord's kernels take zero-copy.
    #[arg(long)]
    symmetric: bool,
    /// Instead of benchmarking OP: measure this machine's costs (TCP and shared-memory message
    /// times, reduction speed, the shared-memory collectives) and write them to PROFILE as
    /// JSON, for `accord sim --profile`.
    #[arg(long, value_name = "PROFILE")]
    calibrate: Option<String>,
    /// With --calibrate: also time 2, 4, ... up to N / 2 pairs of ranks exchanging over TCP at
    /// once (a job of N ranks; at least 4): how much crowded rounds slow messages down.
    #[arg(long, value_name = "N", requires = "calibrate")]
    crowd: Option<usize>,
    /// With --calibrate: take the TCP measurements (and, with --crowd, the crowded ones) from
    /// `tcp.part` and `crowd.part` in DIR, made between other hosts (`bench/multihost.sh
    /// calibrate` makes them between network namespaces), instead of between local ranks.
    #[arg(long, value_name = "DIR", requires = "calibrate")]
    network_from: Option<String>,
    /// The calibration phase a rank runs (set by `--calibrate`).
    #[arg(long, hide = true)]
    calibrate_phase: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Simulate an operation's algorithms on a world of any size with the cost model.
    Sim {
        /// Operation: allreduce, broadcast, reduce, allgather, gather, scatter, reduce_scatter,
        /// alltoall, barrier.
        op: String,
        /// Number of ranks (e.g. 1024).
        #[arg(short = 'n', long = "np", default_value_t = 1024)]
        n: usize,
        /// Size range in bytes, MIN:MAX (suffixes K, M, G).
        #[arg(long, default_value = "8:64M")]
        sizes: String,
        /// Multiply the size by this between tables.
        #[arg(long, default_value_t = 64)]
        factor: usize,
        /// Cost model: tcp, shm or inproc.
        #[arg(long, default_value = "tcp")]
        model: String,
        /// Price calls with this machine's profile (`accord bench --calibrate PROFILE`) and
        /// print, per size, the time of the path Accord takes on the placement.
        #[arg(long, value_name = "PROFILE")]
        profile: Option<String>,
        /// With --profile: ranks per host (-n must be a multiple); hosts are -n / this.
        #[arg(long, default_value_t = 1)]
        per_host: usize,
        /// With --profile: the hosts are parts of one machine (network namespaces, or ranks
        /// over loopback, as the calibration ran), so every network message competes with the
        /// others of its round, not only those of its host.
        #[arg(long)]
        one_machine: bool,
        /// With --profile: also write the rows as JSON here.
        #[arg(long)]
        json: Option<String>,
    },
    /// Launch N ranks of PROGRAM on this host with a fresh store and token.
    Run {
        /// Number of ranks.
        #[arg(short = 'n', long = "np")]
        n: usize,
        /// Do not prefix output lines with `[rank] `.
        #[arg(long)]
        no_prefix: bool,
        /// CPU binding: `auto` binds each rank to one CPU only when the ranks fill or outnumber the
        /// CPUs (as mpirun binds to cores).
        #[arg(long, value_enum, default_value = "auto")]
        bind_to: launch::Binding,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<String>,
    },
    /// Benchmark an operation on N local ranks and check every result.
    Bench {
        /// Number of ranks.
        #[arg(short = 'n', long = "np", default_value_t = 2)]
        n: usize,
        /// CPU binding of the ranks, as for `accord run`.
        #[arg(long, value_enum, default_value = "auto")]
        bind_to: launch::Binding,
        #[command(flatten)]
        args: BenchArgs,
    },
    /// Check this job end to end: every operation, type and reduce operator on awkward counts,
    /// each result compared with a sequential reference. One process per rank, bootstrapped
    /// from the environment: `accord run -n 4 accord selftest`, or started on every host.
    Selftest,
    /// Check this host before a run: transports, limits, token, GPUs, and short self-test runs.
    Doctor(doctor::DoctorArgs),
    /// Draw `accord bench --json` files to one SVG: time and bus bandwidth per size.
    Plot(plot::PlotArgs),
    /// Run a standalone rendezvous store until interrupted.
    Store {
        /// Port to listen on.
        #[arg(long, default_value_t = 29400)]
        port: u16,
        /// Address to bind.
        #[arg(long, default_value = "0.0.0.0")]
        host: String,
    },
    /// Explain a failed or hung job from its ranks' flight records: which rank is behind, on
    /// which operation, where ranks disagree, who waited for whom.
    Analyze {
        /// The directory the records are in (`ACCORD_FLIGHT_DIR`; by default `accord-flight`
        /// in the temporary directory).
        dir: Option<String>,
        /// The job to analyze (default: the one dumped last).
        #[arg(long)]
        job: Option<String>,
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Timelines written with `ACCORD_TRACE`.
    Trace {
        #[command(subcommand)]
        cmd: TraceCmd,
    },
    /// One benchmark rank (started by `accord bench`).
    #[command(hide = true)]
    BenchRank {
        #[command(flatten)]
        args: BenchArgs,
    },
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Join the ranks' trace files (or every `*.json` file of a directory) into one
    /// Chrome-trace file, one process per rank.
    Merge {
        /// Trace files or directories.
        #[arg(required = true)]
        inputs: Vec<String>,
        /// Where to write the merged trace.
        #[arg(short, long)]
        output: String,
    },
}

fn trace_merge(inputs: &[String], output: &str) -> i32 {
    let mut files = Vec::new();
    for i in inputs {
        let p = std::path::PathBuf::from(i);
        if p.is_dir() {
            let mut found: Vec<_> = match std::fs::read_dir(&p) {
                Ok(d) => d
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|f| f.extension().is_some_and(|x| x == "json"))
                    .collect(),
                Err(e) => {
                    eprintln!("accord trace merge: cannot read {i}: {e}");
                    return 2;
                }
            };
            found.sort();
            files.extend(found);
        } else {
            files.push(p);
        }
    }
    if files.is_empty() {
        eprintln!("accord trace merge: no trace files in {}", inputs.join(" "));
        return 2;
    }
    let merged = match accord::observe::trace::merge(&files) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("accord trace merge: {e}");
            return 2;
        }
    };
    match std::fs::write(output, serde_json::to_vec(&merged).unwrap_or_default()) {
        Ok(()) => {
            eprintln!("accord trace merge: {} file(s) -> {output}", files.len());
            0
        }
        Err(e) => {
            eprintln!("accord trace merge: cannot write {output}: {e}");
            1
        }
    }
}

fn bench_opts(a: &BenchArgs) -> Result<bench::BenchOpts, String> {
    let dtype = DataType::parse(&a.dtype).map_err(|e| e.to_string())?;
    if !bench::OPS.contains(&a.op.as_str()) {
        return Err(format!(
            "unknown operation {:?}; choose one of {}",
            a.op,
            bench::OPS.join(", ")
        ));
    }
    let (min_bytes, max_bytes) = bench::parse_range(&a.sizes)?;
    for f in &a.overlay {
        plot::load(f)?; // before the run, not after it
    }
    let shape = a
        .shape
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("--shape {:?}: expected sizes like 256,256,256", a.shape))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(a.op.as_str(), "fft" | "redistribute") && a.device != "cpu" {
        return Err(format!(
            "{} measures host memory here; the GPU path is checked by test_gpu.sh",
            a.op
        ));
    }
    Ok(bench::BenchOpts {
        op: a.op.clone(),
        shape,
        min_bytes,
        max_bytes,
        factor: a.factor,
        dtype,
        explain: a.explain,
        json: a.json.clone(),
        plot: a.plot.clone(),
        overlay: a.overlay.clone(),
        iters: a.iters,
        engine: match (&a.engine, a.device.as_str()) {
            (None, _) => None,
            (Some(_), "cpu") => {
                return Err("--engine chooses who runs GPU collectives: use --device cuda".into())
            }
            (Some(e), _) => Some(
                accord::config::GpuEngine::parse(e)
                    .ok_or_else(|| format!("unknown engine {e:?}; choose auto, accord or nccl"))?,
            ),
        },
        symmetric: match (a.symmetric, a.device.as_str()) {
            (true, "cpu") => return Err("--symmetric places GPU buffers: use --device cuda".into()),
            (on, _) => on,
        },
        device: match a.device.as_str() {
            "cuda" if a.op == "copy" => {
                return Err("copy measures host memory; it has no --device cuda form".into())
            }
            "cpu" if a.op == "put" => {
                return Err("put measures channels between GPUs: use --device cuda".into())
            }
            "cpu" | "cuda" => a.device.clone(),
            d => return Err(format!("unknown device {d:?}; choose cpu or cuda")),
        },
    })
}

/// Run the `accord` command line `args` (`args[0]` is the program name) and return the exit code.
///
/// `self_cmd` is the command that starts this same command line again (the `accord` binary, or
/// `python -m accord`): `accord bench` launches its ranks with it.
pub fn main_with(args: Vec<String>, self_cmd: Vec<String>) -> i32 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ACCORD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let code = match cli.cmd {
        Cmd::Run {
            n,
            no_prefix,
            bind_to,
            program,
        } => launch::run(launch::Launch {
            n,
            program,
            env: vec![],
            prefix: !no_prefix,
            bind: bind_to,
        }),
        Cmd::Bench {
            n,
            bind_to,
            args: bargs,
        } if bargs.calibrate.is_some() => {
            let path = bargs.calibrate.as_deref().unwrap();
            let network = bargs.network_from.as_deref();
            calibrate::launch(n, bargs.crowd, network, bind_to, path, &self_cmd)
        }
        Cmd::BenchRank { args: bargs } if bargs.calibrate_phase.is_some() => calibrate::rank_main(
            bargs.calibrate_phase.as_deref().unwrap(),
            bargs.calibrate.as_deref().unwrap_or("profile.json"),
        ),
        Cmd::Bench {
            n,
            bind_to,
            args: bargs,
        } => match bench_opts(&bargs) {
            Err(e) => {
                eprintln!("accord bench: {e}");
                2
            }
            Ok(_) => {
                let mut program = self_cmd.clone();
                program.push("bench-rank".into());
                program.extend(args.iter().skip(2).filter(|a| !a.is_empty()).cloned());
                let mut env: Vec<_> = progress::tty_for_ranks().into_iter().collect();
                if let Ok(Some(engine)) = bench_opts(&bargs).map(|o| o.engine) {
                    env.push(("ACCORD_GPU_ENGINE".to_string(), engine.name().to_string()));
                }
                if let Some(algo) = &bargs.algo {
                    env.push((
                        format!("ACCORD_ALGO_{}", bargs.op.to_ascii_uppercase()),
                        algo.clone(),
                    ));
                }
                launch::run(launch::Launch {
                    n,
                    program: strip_launcher_args(program),
                    env,
                    prefix: false,
                    bind: bind_to,
                })
            }
        },
        Cmd::BenchRank { args: bargs } => match bench_opts(&bargs) {
            Ok(o) if o.op == "fft" || o.op == "redistribute" => bench_fft::rank_main(&o),
            Ok(o) if o.device == "cuda" && o.op == "put" => bench_put::rank_main(&o),
            Ok(o) if o.device == "cuda" => bench_gpu::rank_main(&o),
            Ok(o) => bench::rank_main(&o),
            Err(e) => {
                eprintln!("accord bench: {e}");
                2
            }
        },
        Cmd::Store { port, host } => store_main(&host, port),
        Cmd::Selftest => selftest::rank_main(),
        Cmd::Analyze { dir, job, json } => {
            let dir = dir.unwrap_or_else(|| accord::observe::flight_dir().display().to_string());
            analyze::main(&dir, job.as_deref(), json)
        }
        Cmd::Trace {
            cmd: TraceCmd::Merge { inputs, output },
        } => trace_merge(&inputs, &output),
        Cmd::Doctor(d) => doctor::run(&d, &self_cmd),
        Cmd::Plot(p) => plot::main(&p),
        Cmd::Sim {
            op,
            n,
            sizes,
            factor,
            model,
            profile,
            per_host,
            one_machine,
            json,
        } => {
            let run = match profile {
                Some(profile) => bench::parse_range(&sizes).and_then(|range| {
                    let place = sim_profile::Placement::new(n, per_host, one_machine)?;
                    sim_profile::run(&op, &place, range, factor, &profile, json.as_deref())
                }),
                None => sim::run(&op, n, &sizes, factor, &model),
            };
            match run {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("accord sim: {e}");
                    2
                }
            }
        }
    };
    code
}

/// Remove `-n N` / `--np N` / `-nN` from the forwarded benchmark arguments.
/// The bench command line without the launcher's own options (`-n`, `--bind-to`), which the
/// ranks do not take.
fn strip_launcher_args(args: Vec<String>) -> Vec<String> {
    const WITH_VALUE: [&str; 3] = ["-n", "--np", "--bind-to"];
    let mut out = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if WITH_VALUE.contains(&a.as_str()) {
            skip = true;
            continue;
        }
        if a.starts_with("--np=")
            || a.starts_with("--bind-to=")
            || (a.starts_with("-n") && a.len() > 2 && a[2..].chars().all(|c| c.is_ascii_digit()))
        {
            continue;
        }
        out.push(a);
    }
    out
}

fn store_main(host: &str, port: u16) -> i32 {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let token = match (env("ACCORD_TOKEN"), env("ACCORD_TOKEN_FILE")) {
        (Some(t), _) => accord::auth::Token::new(t),
        (None, Some(path)) => {
            match accord::rendezvous::token::read_token_file(std::path::Path::new(path.trim())) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("accord store: {e}");
                    return 2;
                }
            }
        }
        (None, None) => {
            let t = accord::auth::Token::random();
            eprintln!(
                "accord store: neither ACCORD_TOKEN nor ACCORD_TOKEN_FILE is set; generated a \
                 token. Give it to every rank:"
            );
            println!("ACCORD_TOKEN={}", t.as_str());
            t
        }
    };
    match accord::rendezvous::StoreServer::bind(&format!("{host}:{port}"), token) {
        Ok(s) => {
            eprintln!("accord store: listening on {}", s.addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("accord store: {e}");
            1
        }
    }
}
