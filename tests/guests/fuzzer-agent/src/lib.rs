//! `fuzzer-agent`: the agent-world variant of `fuzzer` (same core, `../fuzzer/src/fuzz.rs`).
//!
//! `run` claims with `claim-next` and random waits (0 up to `u32::MAX`, which the host caps),
//! holds several claims at once, interleaves random calls through them, and finishes them in
//! random order: settled by a random settling call (then a few calls after settling), dropped
//! unsettled (the host nacks), or, rarely, leaked with `mem::forget` (the host never sees a
//! drop: the lease runs out and the dispatch is reclaimed). Each claim's attempt logs its
//! `FUZZSUM` summary when it is finished; the run logs one `FUZZRUN` line with its
//! `claim-next` outcomes. A run ends when `claim-next` says `none` and nothing is held.

// Shared by `fuzzer` and `fuzzer-agent`; each uses part of it.
#[allow(dead_code)]
#[path = "../../fuzzer/src/fuzz.rs"]
mod fuzz;

use std::collections::BTreeMap;

use homing_guest::__bindings::log::{self, Level};
use homing_guest::__bindings::mailbox::Claim;
use homing_guest::__bindings::queue;
use homing_guest::__bindings::types::Error;

struct FuzzAgent;

impl homing_guest::__bindings::agent_world::Guest for FuzzAgent {
    fn run() -> Result<(), String> {
        run()
    }
}

homing_guest::__bindings::agent_world::__export_agent_world!(
    FuzzAgent with_types_in homing_guest::__bindings::agent_world
);

/// A bound on the loop, far above what the budgets allow.
const MAX_ITERATIONS: u32 = 100_000;

fn run() -> Result<(), String> {
    let mut held: Vec<(Claim, fuzz::Run)> = Vec::new();
    let mut rng = fuzz::Rng::new(0x5eed);
    let mut seeded = false;
    let mut exhausted = false;
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut violations: Vec<String> = Vec::new();
    for _ in 0..MAX_ITERATIONS {
        if held.is_empty() && exhausted {
            break;
        }
        let roll = rng.below(100);
        if (held.is_empty() || roll < 12) && !exhausted {
            let wait = if rng.chance(2) {
                u32::MAX
            } else {
                rng.pick(&[0, 0, 1, 10, 100, 300])
            };
            let key = match queue::claim_next(wait) {
                Ok(Some(claim)) => {
                    let run = fuzz::Run::start(&claim, "agent", "fuzzer-agent");
                    if !seeded {
                        rng = fuzz::Rng::new(run.seed() ^ 0x0A9E_17F0_22E2);
                        seeded = true;
                    }
                    held.push((claim, run));
                    "claim-next:some".to_owned()
                }
                Ok(None) => {
                    exhausted = true;
                    "claim-next:none".to_owned()
                }
                Err(e) => {
                    exhausted = true;
                    violations.push(format!("claim-next({wait}) failed: {e:?}"));
                    format!("claim-next:{}", error_class(&e))
                }
            };
            *outcomes.entry(key).or_default() += 1;
            continue;
        }
        if held.is_empty() {
            continue;
        }
        let i = rng.below(held.len() as u64) as usize;
        if roll < 90
            && let Some((claim, run)) = held.get_mut(i)
            && run.left > 0
        {
            run.step(claim);
            continue;
        }
        let (claim, run) = held.swap_remove(i);
        finish(claim, run, &mut rng);
    }
    // Only reached with claims still held when the bound ran out.
    while let Some((claim, run)) = held.pop() {
        finish(claim, run, &mut rng);
    }
    let outcomes: Vec<String> = outcomes
        .iter()
        .map(|(k, v)| format!("{}:{v}", fuzz::json_str(k)))
        .collect();
    let violations: Vec<String> = violations.iter().map(|v| fuzz::json_str(v)).collect();
    log::write(
        Level::Info,
        &format!(
            "FUZZRUN {{\"outcomes\":{{{}}},\"violations\":[{}]}}",
            outcomes.join(","),
            violations.join(",")
        ),
    );
    if rng.chance(10) {
        Err("the fuzz agent's run ends with an error on purpose".into())
    } else {
        Ok(())
    }
}

/// Finishes one claim: settles it (or not), maybe a few calls after settling, then reports
/// and drops it, or now and then leaks it.
fn finish(claim: Claim, mut run: fuzz::Run, rng: &mut fuzz::Rng) {
    let how = rng.below(100);
    if !run.is_settled() && how < 60 {
        run.settle_now(&claim);
    }
    for _ in 0..rng.below(4) {
        run.step(&claim);
    }
    let forget = how >= 97;
    let end = match run.settled_end() {
        Some(end) => end,
        None if forget => "forgot",
        None => "dropped",
    };
    run.report(end);
    if forget {
        std::mem::forget(claim);
    } else {
        drop(claim);
    }
}

fn error_class(e: &Error) -> &'static str {
    match e {
        Error::LostClaim(_) => "lost-claim",
        Error::Interrupted(_) => "interrupted",
        Error::Contention(_) => "contention",
        Error::Invalid(_) => "invalid",
        Error::Denied(_) => "denied",
        Error::Duplicate(_) => "duplicate",
        Error::Conflict(_) => "conflict",
        Error::Unavailable(_) => "unavailable",
        Error::Internal(_) => "internal",
    }
}
