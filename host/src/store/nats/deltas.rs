//! Delta batches on NATS (the contract, docs/contract.md, section 12). Placeholder: the
//! backend's batches and live bus are being built.

use async_trait::async_trait;

use super::NatsStore;
use crate::store::StoreResult;
use crate::store::deltas::{Cursor, DeltaBatch, DeltaRead, Deltas, LiveBus};

#[async_trait]
impl Deltas for NatsStore {
    async fn persist(&self, _batch: DeltaBatch) -> StoreResult<()> {
        Ok(())
    }

    async fn read_deltas(&self, _dispatch: &str, _after: Cursor) -> StoreResult<DeltaRead> {
        Ok(DeltaRead::default())
    }

    fn live_bus(&self) -> Option<std::sync::Arc<dyn LiveBus>> {
        None
    }
}
