//! Link the agent with packed relative relocations (`DT_RELR`, glibc 2.36 and binutils 2.38 or
//! later, as in Debian bookworm): the dynamic loader otherwise reads a table of relocations
//! at every start (its size: docs/benchmarks.md), and those pages stay resident for the
//! process's life.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
