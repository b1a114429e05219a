//! `accord doctor`: what a run on this host will find, checked before the run.
//!
//! Transports (Accord's shared memory, `/dev/shm`, TCP on loopback), resources (CPUs, memory,
//! open files, sized for `--np` ranks), the job token, GPUs, and a self-test of short real
//! runs. Prints a report (or `--json`); exits 1, naming each problem on stderr, when something
//! a CPU run needs is missing (with `--gpu`, also a GPU).

mod gpu;
mod report;
mod resources;
mod selftest;
mod token;
mod transports;

/// `accord doctor`'s options.
#[derive(clap::Args, Clone)]
pub struct DoctorArgs {
    /// The world size to check limits for (open files, shared memory, CPUs).
    #[arg(short = 'n', long = "np", default_value_t = 8)]
    np: usize,
    /// A GPU is needed: fail when no GPU is usable or the GPU self-test fails.
    #[arg(long)]
    gpu: bool,
    /// Print the report as JSON (docs/json_formats.md describes it).
    #[arg(long)]
    json: bool,
    /// Only inspect: skip the self-test runs.
    #[arg(long)]
    no_selftest: bool,
}

/// Run the checks and print the report; `self_cmd` starts the `accord` command line again
/// (for the self-test). Returns the exit code.
pub fn run(args: &DoctorArgs, self_cmd: &[String]) -> i32 {
    if args.np == 0 {
        eprintln!("accord doctor: --np must be at least 1");
        return 2;
    }
    let (gpu, gpus) = gpu::section(args.gpu);
    let report = report::Report {
        np: args.np,
        gpu_required: args.gpu,
        sections: vec![
            transports::section(args.np),
            resources::section(args.np),
            token::section(),
            gpu,
            selftest::section(self_cmd, gpus, args.gpu, args.no_selftest),
        ],
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).unwrap_or_default()
        );
    } else {
        print!("{}", report.text());
    }
    let failures = report.failures();
    for f in &failures {
        eprintln!("accord doctor: {f}");
    }
    i32::from(!failures.is_empty())
}
