//! The `accord` binary: see the library for the commands.

fn main() {
    let exe = std::env::current_exe().expect("path of the running accord binary");
    let code = accord_cli::main_with(
        std::env::args().collect(),
        vec![exe.to_string_lossy().into_owned()],
    );
    std::process::exit(code);
}
