//! `memory`: a conversation agent that remembers what it was told, in its thread log.
//!
//! The payload is one user message (UTF-8 text). The agent reads the whole thread log, appends
//! `user: <msg>`, replies from memory with
//! `#<n>: you said "<msg>"; earlier you said: "<earlier messages joined by " | ">"`
//! (`n` counts the user's messages including this one), appends `agent: <reply>` and returns the
//! reply as the output. The log is the only state: any instance can answer any message.
//!
//! The first append is conditional on the log being as read (`append_expected`), so a message
//! handled concurrently on the same thread makes this attempt fail and retry rather than reply
//! from stale memory. A retry that finds its own `user:` entry (and maybe its reply) at the end
//! of the log reuses them instead of writing them twice (a retry of a message sent twice in a
//! row cannot tell the two apart; it answers as the first did).

use homing_guest::{Claim, Error, Handler, LogEntry};

const USER: &str = "user: ";
const AGENT: &str = "agent: ";

/// The handler.
struct Memory;

impl Handler for Memory {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let message = claim.payload_str()?;
        let user_line = format!("{USER}{message}");
        let log = claim.read_log_all()?;
        let mut lines: Vec<&str> = log.iter().filter_map(LogEntry::text).collect();
        let latest = log.last().map_or(0, |entry| entry.seq);

        // A retry may find what an earlier attempt of this dispatch already wrote.
        if claim.attempt() > 0
            && let [.., user, agent] = lines.as_slice()
            && *user == user_line
            && let Some(reply) = agent.strip_prefix(AGENT)
        {
            return Ok(reply.as_bytes().to_vec());
        }
        let resumed = claim.attempt() > 0 && lines.last() == Some(&user_line.as_str());
        if resumed {
            lines.pop();
        }

        let earlier: Vec<&str> = lines
            .iter()
            .filter_map(|line| line.strip_prefix(USER))
            .collect();
        let n = earlier.len() + 1;
        let reply = format!(
            "#{n}: you said \"{message}\"; earlier you said: \"{}\"",
            earlier.join(" | ")
        );

        if !resumed {
            match claim.append_expected(&user_line, latest) {
                Ok(_) => {}
                Err(Error::Conflict(_)) => {
                    return Err("the thread log changed while replying; retrying".to_owned());
                }
                Err(error) => return Err(error.into()),
            }
        }
        claim.append(format!("{AGENT}{reply}"))?;
        Ok(reply.into_bytes())
    }
}

homing_guest::export_handler!(Memory);
