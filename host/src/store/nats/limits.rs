//! Flow control on the nats backend (the contract, docs/contract.md, section 13).

use async_trait::async_trait;

use super::NatsStore;
use crate::store::limits::{ClaimRequest, Gated, Limits, Pause, Rate, Usage};
use crate::store::{Mailbox, StoreError, StoreResult};

fn unsupported() -> StoreError {
    StoreError::Unavailable("flow control is not built on this backend yet".into())
}

impl NatsStore {
    /// `claim_gated`: the claim with its limits and pauses decided in the same step.
    pub(super) async fn claim_gated_inner(&self, req: &ClaimRequest<'_>) -> StoreResult<Gated> {
        if !req.limits.is_empty() {
            return Err(unsupported());
        }
        let d = if req.start {
            self.claim_started(req.agent, req.consumer, req.lease_ms)
                .await?
        } else {
            self.claim(req.agent, req.consumer, req.lease_ms).await?
        };
        Ok(Gated {
            dispatch: d,
            ..Gated::default()
        })
    }
}

#[async_trait]
impl Limits for NatsStore {
    async fn take_token(&self, _scope: &str, _rate: &Rate) -> StoreResult<Option<u64>> {
        Err(unsupported())
    }

    async fn acquire_slot(
        &self,
        _scope: &str,
        _cap: u32,
        _holder: &str,
        _until: u64,
    ) -> StoreResult<bool> {
        Err(unsupported())
    }

    async fn release_slot(&self, _scope: &str, _holder: &str) -> StoreResult<()> {
        Err(unsupported())
    }

    async fn pause(&self, _agent: &str, _key: Option<&str>, _reason: &str) -> StoreResult<Pause> {
        Err(unsupported())
    }

    async fn resume(&self, _agent: &str, _key: Option<&str>) -> StoreResult<bool> {
        Err(unsupported())
    }

    async fn pauses(&self) -> StoreResult<Vec<Pause>> {
        Ok(Vec::new())
    }

    async fn usage(&self, scope: &str, _rate: Option<&Rate>) -> StoreResult<Usage> {
        Ok(Usage {
            scope: scope.to_owned(),
            ..Usage::default()
        })
    }
}
