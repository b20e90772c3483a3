//! The inbox of the NATS backend (the contract, docs/contract.md, section 9). Not served yet:
//! every operation answers `Unavailable` until the NATS layout of section 8 lands.

use async_trait::async_trait;

use super::NatsStore;
use crate::store::inbox::{
    Inbox, InboxMarks, Message, MessageFilter, NOTE_ROOM, NewMessage, Sent, ThreadWatch,
};
use crate::store::{Fence, StoreError, StoreResult};

fn not_yet() -> StoreError {
    StoreError::Unavailable("the NATS backend does not serve thread inboxes yet".into())
}

#[async_trait]
impl Inbox for NatsStore {
    async fn send(&self, _thread: &str, _new: NewMessage, _max_pending: u64) -> StoreResult<Sent> {
        Err(not_yet())
    }

    async fn ack_message(&self, _thread: &str, _seq: u64, _fence: &Fence) -> StoreResult<u64> {
        Err(not_yet())
    }

    async fn discard_messages(&self, _thread: &str, _through: u64) -> StoreResult<usize> {
        Err(not_yet())
    }

    async fn message(&self, _thread: &str, _seq: u64) -> StoreResult<Option<Message>> {
        Err(not_yet())
    }

    async fn messages(&self, _thread: &str, _filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        Err(not_yet())
    }

    async fn inbox(&self, _thread: &str) -> StoreResult<InboxMarks> {
        Err(not_yet())
    }

    async fn purge_messages(&self, _older_than: u64) -> StoreResult<usize> {
        Ok(0)
    }

    async fn pending_total(&self) -> StoreResult<u64> {
        Ok(0)
    }

    fn watch(&self, _thread: &str) -> ThreadWatch {
        ThreadWatch::never()
    }

    fn max_message(&self) -> u64 {
        self.room().entry.saturating_sub(NOTE_ROOM)
    }
}
