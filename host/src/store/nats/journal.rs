//! The journals of the NATS backend (the contract, docs/contract.md, section 11).
//!
//! Not built yet: every call answers `Unavailable`, so a plugin with `journal` set runs live.

use async_trait::async_trait;

use super::NatsStore;
use crate::store::journal::{CallEntry, Journal, JournalData, NewStep};
use crate::store::model::Fence;
use crate::store::{StoreError, StoreResult};

fn not_yet() -> StoreError {
    StoreError::Unavailable("the NATS store keeps no journal yet".into())
}

#[async_trait]
impl Journal for NatsStore {
    async fn load_journal(&self, _dispatch: &str) -> StoreResult<JournalData> {
        Ok(JournalData::default())
    }

    async fn record(&self, _fence: &Fence, _entry: CallEntry) -> StoreResult<()> {
        Err(not_yet())
    }

    async fn record_append(
        &self,
        _fence: &Fence,
        _entry: CallEntry,
        _data: &[u8],
        _expected: Option<u64>,
    ) -> StoreResult<u64> {
        Err(not_yet())
    }

    async fn drop_calls(&self, _fence: &Fence, _from: u32) -> StoreResult<()> {
        Err(not_yet())
    }

    async fn put_step(&self, _fence: &Fence, _step: NewStep) -> StoreResult<()> {
        Err(not_yet())
    }

    fn max_body(&self) -> u64 {
        0
    }
}
