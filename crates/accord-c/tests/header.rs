//! `include/accord.h` is what cbindgen makes of the crate today (so the header C programs
//! compile against never drifts from the exported functions).
//! `ACCORD_REGEN_HEADER=1 cargo test -p accord-c --test header` rewrites it.

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = format!("{dir}/include/accord.h");
    if std::env::var_os("ACCORD_REGEN_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/accord.h");
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/accord.h is stale: run `ACCORD_REGEN_HEADER=1 cargo test -p accord-c --test header`"
    );
}
