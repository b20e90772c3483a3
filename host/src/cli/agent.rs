//! `homing agent ...`: pause and resume an agent's claims, and show how its flow control
//! stands (its pauses, each limit's use, its parked runs).

use clap::Subcommand;

use super::exit::{Exit, coded};
use crate::config::Config;
use crate::store::Store;
use crate::store::model::check_name;
use crate::work::flow::{self, AgentFlow, FlowError};

/// `homing agent ...`.
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Pauses an agent's claims (or one concurrency key's) on every host: queued work stays
    /// queued until it is resumed; running dispatches finish.
    Pause {
        /// The agent (plugin).
        agent: String,
        /// Only its dispatches with this concurrency key.
        #[arg(long)]
        key: Option<String>,
        /// Why (shown with the pause; at most 1 KiB).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lifts a pause of an agent (or of one concurrency key).
    Resume {
        /// The agent (plugin).
        agent: String,
        /// Only the pause of this concurrency key.
        #[arg(long)]
        key: Option<String>,
    },
    /// Shows whether an agent is paused, each of its limits with its use now, and how many of
    /// its queued dispatches are parked.
    Status {
        /// The agent (plugin).
        agent: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// A refused pause or resume with its exit code: 3 for an unknown agent, 2 for bad input.
fn refused(e: FlowError, flag: &str) -> anyhow::Error {
    match e {
        FlowError::UnknownAgent { .. } => coded(Exit::NotFound, e.to_string()),
        FlowError::Invalid { field, message } => coded(
            Exit::Invalid,
            if field == "key" {
                message.replacen("key", "--key", 1)
            } else {
                message.replacen(field, flag, 1)
            },
        ),
        FlowError::ReasonTooLong { .. } => {
            coded(Exit::Invalid, e.to_string().replacen("reason", flag, 1))
        }
        FlowError::Store(e) => e.into(),
    }
}

fn text(s: &str) -> std::borrow::Cow<'_, str> {
    crate::runtime::host::escape_log_text(s)
}

pub(super) async fn run(
    config: &Config,
    store: &Store,
    command: AgentCommand,
) -> anyhow::Result<()> {
    match command {
        AgentCommand::Pause { agent, key, reason } => {
            check_name("agent", &agent).map_err(|e| coded(Exit::Invalid, e))?;
            let pause = flow::pause(config, store, &agent, key.as_deref(), &reason)
                .await
                .map_err(|e| refused(e, "--reason"))?;
            match &pause.key {
                Some(key) => println!(
                    "paused agent {} for concurrency key {}",
                    text(&pause.agent),
                    text(key)
                ),
                None => println!("paused agent {}", text(&pause.agent)),
            }
        }
        AgentCommand::Resume { agent, key } => {
            check_name("agent", &agent).map_err(|e| coded(Exit::Invalid, e))?;
            let lifted = flow::resume(config, store, &agent, key.as_deref())
                .await
                .map_err(|e| refused(e, "--key"))?;
            let what = match &key {
                Some(key) => format!("agent {} for concurrency key {}", text(&agent), text(key)),
                None => format!("agent {}", text(&agent)),
            };
            if lifted {
                println!("resumed {what}");
            } else {
                println!("{what} was not paused");
            }
        }
        AgentCommand::Status { agent, json } => {
            check_name("agent", &agent).map_err(|e| coded(Exit::Invalid, e))?;
            flow::known_agent(config, &agent).map_err(|e| refused(e, ""))?;
            let pauses = store.limits.pauses().await?;
            let state = flow::flow(config, store, &agent, &pauses).await?;
            let (parked, more) = flow::parked(store, &agent).await?;
            if json {
                let mut shown = serde_json::to_value(&state)?;
                if let Some(map) = shown.as_object_mut() {
                    map.insert("parked".into(), parked.into());
                    map.insert("parked_counted_all".into(), (!more).into());
                }
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                print_status(&state, parked, more);
            }
        }
    }
    Ok(())
}

fn print_status(state: &AgentFlow, parked: u64, more: bool) {
    println!("agent:        {}", text(&state.agent));
    if state.paused {
        let reason = state.pause_reason.as_deref().unwrap_or_default();
        if reason.is_empty() {
            println!("paused:       yes");
        } else {
            println!("paused:       yes: {}", text(reason));
        }
    } else {
        println!("paused:       no");
    }
    for key in &state.paused_keys {
        if key.reason.is_empty() {
            println!("paused key:   {}", text(&key.key));
        } else {
            println!("paused key:   {}: {}", text(&key.key), text(&key.reason));
        }
    }
    if let Some(source) = &state.concurrency_key {
        println!("key from:     {}", text(source));
    }
    if let Some(n) = state.key_concurrency {
        println!("per key:      at most {n} running");
    }
    if let Some(rate) = &state.key_rate {
        println!("per key rate: {rate}");
    }
    if state.limits.is_empty() {
        println!("limits:       none");
    }
    for scope in &state.limits {
        let mut parts = Vec::new();
        if let Some(cap) = scope.concurrency {
            parts.push(format!("running {}/{cap}", scope.running));
        }
        if let Some(rate) = &scope.rate {
            let tokens = scope
                .tokens
                .map_or(String::new(), |t| format!(", {t:.1} tokens left"));
            parts.push(format!("rate {rate}{tokens}"));
        }
        if !scope.origins.is_empty() {
            parts.push(format!("requests to {}", scope.origins.join(", ")));
        }
        println!("limit:        {} ({})", text(&scope.name), parts.join("; "));
    }
    println!("parked:       {parked}{}", if more { "+" } else { "" });
}
