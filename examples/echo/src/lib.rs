//! `echo`: completes each dispatch with its payload as output.
//!
//! When the metadata `reply-to` is `"<agent>:<thread>"`, it also enqueues that output to
//! `<agent>` on `<thread>` with the metadata `reply-for` set to this dispatch's id; this is
//! how `delegate` gets its parts back. The reply carries a dedupe key (this dispatch's id), so
//! a retried echo does not send a second live reply.

use homing_guest::{Claim, Enqueue, Error, Handler};

/// The handler.
struct Echo;

impl Handler for Echo {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let output = claim.payload().to_vec();
        if let Some(reply_to) = claim.metadata("reply-to") {
            let Some((agent, thread)) = reply_to.split_once(':') else {
                // Retrying cannot fix the submitter's metadata: give up at once.
                let why = format!("metadata reply-to {reply_to:?} is not \"<agent>:<thread>\"");
                claim.dead_letter(&why)?;
                return Err(why);
            };
            let reply = Enqueue::to(agent)
                .thread(thread)
                .payload(output.clone())
                .metadata("reply-for", claim.id())
                .dedupe_key(claim.id());
            match claim.enqueue(reply) {
                Ok(_) | Err(Error::Duplicate(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(output)
    }
}

homing_guest::export_handler!(Echo);
