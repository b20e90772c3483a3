//! Empty: a build script lets this crate's `[build-dependencies]` take part in the build (see
//! Cargo.toml for why the crate exists).

fn main() {}
