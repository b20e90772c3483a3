//! A plain WASI command: a valid component that is not a Homing agent (it exports
//! `wasi:cli/run`, neither `homing:agent/handle` nor `run`).

fn main() {
    println!("I am not an agent");
}
