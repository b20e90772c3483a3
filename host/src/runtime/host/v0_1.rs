//! `homing:agent@0.1.0` for components built before 0.2.0: every 0.1.0 import converts its
//! arguments, calls the 0.2.0 implementation and converts the answer back. Nothing here
//! decides anything, so a 0.1.0 guest gets every fix made to 0.2.0; the compiler checks that
//! every 0.1.0 function is delegated (each trait impl must be complete).
//!
//! What a 0.1.0 guest sees differently: `stop-requested` reports `upgrade` as `shutdown` (both
//! mean "finish soon"); `info` has no run counters or concurrency key; a log entry that records
//! an acknowledged inbox message reads as a plain entry whose data is the message's body.

use wasmtime::component::Resource;

use super::GuestState;
use crate::claim::ClaimHandle;
use crate::runtime::bindings::v0_1::agent::homing::agent::queue as queue01;
use crate::runtime::bindings::v0_1::handler::homing::agent::{
    log as log01, mailbox as mailbox01, types as types01,
};
use crate::runtime::bindings::v0_2::agent::homing::agent::queue as queue02;
use crate::runtime::bindings::{log as log02, mailbox as mailbox02, types as types02};

impl From<types02::Error> for types01::Error {
    fn from(e: types02::Error) -> Self {
        use types01::Error as Old;
        use types02::Error as New;
        match e {
            New::LostClaim(m) => Old::LostClaim(m),
            New::Interrupted(m) => Old::Interrupted(m),
            New::Contention(m) => Old::Contention(m),
            New::Invalid(m) => Old::Invalid(m),
            New::Denied(m) => Old::Denied(m),
            New::Duplicate(m) => Old::Duplicate(m),
            New::Conflict(latest) => Old::Conflict(latest),
            New::Unavailable(m) => Old::Unavailable(m),
            New::Internal(m) => Old::Internal(m),
        }
    }
}

impl From<types02::StopReason> for types01::StopReason {
    fn from(reason: types02::StopReason) -> Self {
        use types01::StopReason as Old;
        use types02::StopReason as New;
        match reason {
            New::Interrupted => Old::Interrupted,
            New::LeaseLost => Old::LeaseLost,
            New::Shutdown | New::Upgrade => Old::Shutdown,
            New::Deadline => Old::Deadline,
        }
    }
}

impl From<types02::DispatchInfo> for types01::DispatchInfo {
    fn from(d: types02::DispatchInfo) -> Self {
        types01::DispatchInfo {
            id: d.id,
            agent: d.agent,
            thread: d.thread,
            run_id: d.run_id,
            payload: d.payload,
            metadata: d.metadata,
            attempt: d.attempt,
            max_attempts: d.max_attempts,
            priority: d.priority,
        }
    }
}

impl From<types02::LogEntry> for types01::LogEntry {
    fn from(e: types02::LogEntry) -> Self {
        types01::LogEntry {
            seq: e.seq,
            data: e.data,
            appended_at: e.appended_at,
        }
    }
}

impl From<types01::EnqueueRequest> for types02::EnqueueRequest {
    fn from(r: types01::EnqueueRequest) -> Self {
        types02::EnqueueRequest {
            agent: r.agent,
            thread: r.thread,
            payload: r.payload,
            metadata: r.metadata,
            priority: r.priority,
            delay_ms: r.delay_ms,
            dedupe_key: r.dedupe_key,
            max_attempts: r.max_attempts,
            concurrency_key: None,
            debounce: None,
        }
    }
}

impl From<log01::Level> for log02::Level {
    fn from(level: log01::Level) -> Self {
        match level {
            log01::Level::Trace => log02::Level::Trace,
            log01::Level::Debug => log02::Level::Debug,
            log01::Level::Info => log02::Level::Info,
            log01::Level::Warn => log02::Level::Warn,
            log01::Level::Error => log02::Level::Error,
        }
    }
}

/// A 0.2.0 answer as 0.1.0 types.
fn old<T, U: From<T>>(
    out: wasmtime::Result<Result<T, types02::Error>>,
) -> wasmtime::Result<Result<U, types01::Error>> {
    out.map(|r| r.map(U::from).map_err(types01::Error::from))
}

impl types01::Host for GuestState {}

impl log01::Host for GuestState {
    async fn write(&mut self, level: log01::Level, message: String) -> wasmtime::Result<()> {
        <Self as log02::Host>::write(self, level.into(), message).await
    }
}

impl mailbox01::Host for GuestState {
    async fn enqueue(
        &mut self,
        request: types01::EnqueueRequest,
    ) -> wasmtime::Result<Result<String, types01::Error>> {
        old(<Self as mailbox02::Host>::enqueue(self, request.into()).await)
    }
}

impl queue01::Host for GuestState {
    async fn claim_next(
        &mut self,
        wait_ms: u32,
    ) -> wasmtime::Result<Result<Option<Resource<ClaimHandle>>, types01::Error>> {
        old(<Self as queue02::Host>::claim_next(self, wait_ms).await)
    }
}

impl mailbox01::HostClaim for GuestState {
    async fn info(&mut self, c: Resource<ClaimHandle>) -> wasmtime::Result<types01::DispatchInfo> {
        <Self as mailbox02::HostClaim>::info(self, c)
            .await
            .map(Into::into)
    }

    async fn record_start(
        &mut self,
        c: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::record_start(self, c).await)
    }

    async fn record_result(
        &mut self,
        c: Resource<ClaimHandle>,
        output: Vec<u8>,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::record_result(self, c, output).await)
    }

    async fn complete(
        &mut self,
        c: Resource<ClaimHandle>,
        output: Vec<u8>,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::complete(self, c, output).await)
    }

    async fn ack(
        &mut self,
        c: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::ack(self, c).await)
    }

    async fn nack(
        &mut self,
        c: Resource<ClaimHandle>,
        error: String,
        retry_after_ms: Option<u64>,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::nack(self, c, error, retry_after_ms).await)
    }

    async fn dead_letter(
        &mut self,
        c: Resource<ClaimHandle>,
        error: String,
    ) -> wasmtime::Result<Result<(), types01::Error>> {
        old(<Self as mailbox02::HostClaim>::dead_letter(self, c, error).await)
    }

    async fn append(
        &mut self,
        c: Resource<ClaimHandle>,
        entry: Vec<u8>,
    ) -> wasmtime::Result<Result<u64, types01::Error>> {
        old(<Self as mailbox02::HostClaim>::append(self, c, entry).await)
    }

    async fn append_expected(
        &mut self,
        c: Resource<ClaimHandle>,
        entry: Vec<u8>,
        expected_latest: u64,
    ) -> wasmtime::Result<Result<u64, types01::Error>> {
        old(<Self as mailbox02::HostClaim>::append_expected(self, c, entry, expected_latest).await)
    }

    async fn read_log(
        &mut self,
        c: Resource<ClaimHandle>,
        after: u64,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<types01::LogEntry>, types01::Error>> {
        let out = <Self as mailbox02::HostClaim>::read_log(self, c, after, limit).await;
        out.map(|r| {
            r.map(|entries| entries.into_iter().map(Into::into).collect())
                .map_err(Into::into)
        })
    }

    async fn log_latest(
        &mut self,
        c: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Result<u64, types01::Error>> {
        old(<Self as mailbox02::HostClaim>::log_latest(self, c).await)
    }

    async fn stop_requested(
        &mut self,
        c: Resource<ClaimHandle>,
    ) -> wasmtime::Result<Option<types01::StopReason>> {
        <Self as mailbox02::HostClaim>::stop_requested(self, c)
            .await
            .map(|reason| reason.map(Into::into))
    }

    async fn enqueue(
        &mut self,
        c: Resource<ClaimHandle>,
        request: types01::EnqueueRequest,
    ) -> wasmtime::Result<Result<String, types01::Error>> {
        old(<Self as mailbox02::HostClaim>::enqueue(self, c, request.into()).await)
    }

    async fn drop(&mut self, c: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        <Self as mailbox02::HostClaim>::drop(self, c).await
    }
}
