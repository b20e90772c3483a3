//! The `homing` binary; everything lives in the library (see `homing::cli`).

fn main() -> std::process::ExitCode {
    homing::cli::main()
}
