// The shared library's soname, so programs linked with -laccord find it as libaccord.so.0
// (what install.sh installs) rather than by the build's file name.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libaccord.so.0");
}
