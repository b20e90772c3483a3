//! The waitpoints of the NATS backend (the contract, docs/contract.md, section 10).
//!
//! Placeholder while the NATS layout of waitpoints (`<p>.th.<thread>.w.<id>`) is built: every
//! operation answers `Unavailable` naming what is missing.

use async_trait::async_trait;

use super::NatsStore;
use crate::store::model::{Dispatch, Fence};
use crate::store::waitpoints::{
    Created, NewWaitpoint, Settlement, Waitpoint, WaitpointFilter, Waitpoints,
};
use crate::store::{StoreError, StoreResult};

fn missing<T>() -> StoreResult<T> {
    Err(StoreError::Unavailable(
        "waitpoints are not available on the NATS store yet".into(),
    ))
}

#[async_trait]
impl Waitpoints for NatsStore {
    async fn create_waitpoint(&self, _fence: &Fence, _new: NewWaitpoint) -> StoreResult<Created> {
        missing()
    }

    async fn add_token(&self, _fence: &Fence, _id: &str, _digest: &str) -> StoreResult<bool> {
        missing()
    }

    async fn suspend(&self, _id: &str, _token: &str, _max_resumes: u32) -> StoreResult<Dispatch> {
        missing()
    }

    async fn complete_waitpoint(
        &self,
        _id: &str,
        _result: Vec<u8>,
        _settled_by: &str,
    ) -> StoreResult<Settlement> {
        missing()
    }

    async fn cancel_waitpoint(&self, _id: &str, _settled_by: &str) -> StoreResult<Settlement> {
        missing()
    }

    async fn time_out_waitpoints(&self, _now: u64, _limit: usize) -> StoreResult<Vec<Waitpoint>> {
        Ok(Vec::new())
    }

    async fn waitpoint(&self, _id: &str) -> StoreResult<Option<Waitpoint>> {
        Ok(None)
    }

    async fn waitpoints_of(&self, _dispatch: &str) -> StoreResult<Vec<Waitpoint>> {
        Ok(Vec::new())
    }

    async fn list_waitpoints(&self, _filter: &WaitpointFilter) -> StoreResult<Vec<Waitpoint>> {
        Ok(Vec::new())
    }

    fn max_result(&self) -> u64 {
        crate::store::Mailbox::max_value(self)
    }
}
