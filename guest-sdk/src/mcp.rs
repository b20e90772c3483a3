//! Tools of MCP servers, called through the host (`homing:agent@0.2.1`).
//!
//! The plugin's `[plugins.x.mcp.NAME]` names a server, what the plugin may call there
//! (`tools`), and which calls wait for a person first (`approval`). The host holds the
//! server's URL and credentials; the guest names the server and the tool:
//!
//! ```no_run
//! use homing_guest::{Claim, Handler, McpOutcome};
//!
//! struct Ops;
//!
//! impl Handler for Ops {
//!     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
//!         match claim.mcp_call_or_suspend("records", "delete_record", r#"{"id": "42"}"#)? {
//!             // Waiting for an operator's approval: the run is over; the handler runs again
//!             // from its start once the approval settles, and makes the same call.
//!             None => Ok(Vec::new()),
//!             Some(McpOutcome::Done(result)) => Ok(result.content.into_bytes()),
//!             Some(McpOutcome::Rejected(why)) => Ok(format!("not deleted: {why}").into_bytes()),
//!             Some(other) => Ok(format!("{other:?}").into_bytes()),
//!         }
//!     }
//! }
//! # homing_guest::export_handler!(Ops);
//! ```
//!
//! **Approval.** A call the plugin's rules hold for a person answers
//! [`McpOutcome::NeedsApproval`] with the waitpoint the host made (an operator completes it
//! with `{"approved": true}`, or `{"approved": false, "reason": ".."}`: the dashboard's
//! Approve and Reject buttons do). Suspend then, and make the same call when the run resumes:
//! [`Claim::mcp_call_or_suspend`] does both.
//!
//! **Retries.** Under `journal = "run"`, a retried or resumed run making the same calls is
//! answered from the journal (a call is found by its server, tool and arguments, and which such
//! call of the run it is): no tool runs twice. A call that an earlier run
//! sent and never saw answered (the host died meanwhile) is sent again only when the tool says
//! it is idempotent; otherwise the run gets [`McpOutcome::Unknown`].

use crate::claim::Claim;
use crate::error::Error;

pub use crate::__bindings::types::{McpOutcome, McpResult, McpTool};

impl Claim<'_> {
    /// The tools of MCP server `server` the plugin may call, sorted by name.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a server the plugin does not configure; [`Error::Denied`] when
    /// the tool list no longer matches its `pin`; [`Error::Unavailable`] when the server
    /// cannot be listed.
    pub fn mcp_tools(&self, server: &str) -> Result<Vec<McpTool>, Error> {
        Ok(self.raw().mcp_tools(server)?)
    }

    /// Calls tool `tool` of MCP server `server` with `arguments`, a JSON object as text.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an unknown server or tool, or arguments that are not a JSON
    /// object or fail the tool's schema; [`Error::Denied`] for a tool outside the allow-list,
    /// a changed tool list under a pin, or an answer over `max_result`;
    /// [`Error::Unavailable`] when the server did not answer.
    pub fn mcp_call(&self, server: &str, tool: &str, arguments: &str) -> Result<McpOutcome, Error> {
        Ok(self.raw().mcp_call(server, tool, arguments)?)
    }

    /// [`Claim::mcp_call`], suspending the run while the call waits for approval: `None` then
    /// (return from the handler at once; it runs again when the approval settles).
    ///
    /// # Errors
    ///
    /// As [`Claim::mcp_call`] and [`Claim::suspend`].
    pub fn mcp_call_or_suspend(
        &self,
        server: &str,
        tool: &str,
        arguments: &str,
    ) -> Result<Option<McpOutcome>, Error> {
        match self.mcp_call(server, tool, arguments)? {
            McpOutcome::NeedsApproval(_) => {
                self.suspend()?;
                Ok(None)
            }
            outcome => Ok(Some(outcome)),
        }
    }

    /// [`Claim::mcp_call`] with `arguments` serialized to JSON.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when `arguments` do not serialize to JSON; as [`Claim::mcp_call`].
    #[cfg(feature = "json")]
    pub fn mcp_call_json<T: serde::Serialize>(
        &self,
        server: &str,
        tool: &str,
        arguments: &T,
    ) -> Result<McpOutcome, Error> {
        let text = serde_json::to_string(arguments)
            .map_err(|e| Error::Invalid(format!("arguments: {e}")))?;
        self.mcp_call(server, tool, &text)
    }
}

#[cfg(feature = "json")]
impl McpResult {
    /// The text of its `text` content blocks, joined with newlines.
    pub fn text(&self) -> String {
        let blocks: Vec<serde_json::Value> = serde_json::from_str(&self.content).unwrap_or_default();
        blocks
            .iter()
            .filter(|b| b.get("type").and_then(|t| t.as_str()) == Some("text"))
            .filter_map(|b| b.get("text").and_then(|t| t.as_str()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
