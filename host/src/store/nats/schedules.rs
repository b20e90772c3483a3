//! The schedules' records in the NATS backend: one subject per schedule, `<p>.sc.<name>`,
//! outside every thread's tree (no host's view holds them; a tick reads its schedule when it
//! runs, one direct get). A write publishes the whole record expecting the subject's last
//! sequence, which is the record's revision; a deletion publishes an empty record (a
//! tombstone), which a later create expects in place of nothing.

use std::collections::BTreeSet;

use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;

use super::NatsStore;
use super::jetstream::{CommitError, stored_seq, unavailable};
use super::keys::Key;
use crate::store::rules;
use crate::store::rules::ByteBudget;
use crate::store::schedules::{Schedule, Schedules, Stored};
use crate::store::{StoreError, StoreResult};

/// The record of `name` from its last message, `None` for a tombstone.
fn decode(name: &str, seq: u64, payload: &[u8]) -> StoreResult<Option<Stored>> {
    if payload.is_empty() {
        return Ok(None);
    }
    let schedule: Schedule = serde_json::from_slice(payload).map_err(|e| StoreError::Corrupt {
        key: format!("schedules/{name}"),
        reason: e.to_string(),
    })?;
    if schedule.def.name != name {
        return Err(StoreError::Corrupt {
            key: format!("schedules/{name}"),
            reason: format!("the record holds schedule `{}`", schedule.def.name),
        });
    }
    Ok(Some(Stored {
        schedule,
        revision: seq,
    }))
}

fn moved(name: &str, expect: u64) -> StoreError {
    StoreError::Contention(format!(
        "schedule `{name}` is no longer at revision {expect}: read it again"
    ))
}

impl NatsStore {
    /// The last message of `name`'s subject: its sequence and payload.
    async fn schedule_message(&self, name: &str) -> StoreResult<Option<(u64, Bytes)>> {
        let subject = Key::Schedule(name.to_owned()).subject(self.prefix());
        self.get_last(&subject).await
    }

    /// The names of the schedules' subjects after `after`, in order, from the stream's count of
    /// messages by subject: a name and a count each, whatever the records' sizes. A deleted
    /// schedule's name stays (its tombstone) until the name is created again.
    async fn schedule_names(&self, after: Option<&str>) -> StoreResult<BTreeSet<String>> {
        let prefix = self.prefix().to_owned();
        let stream = self
            .inner
            .js
            .get_stream_no_info(&prefix)
            .await
            .map_err(|e| unavailable("stream lookup", e))?;
        let mut subjects = stream
            .info_with_subjects(Key::schedules(&prefix))
            .await
            .map_err(|e| unavailable("stream subjects", e))?;
        let mut names = BTreeSet::new();
        while let Some(subject) = subjects.next().await {
            let (subject, _) = subject.map_err(|e| unavailable("stream subjects", e))?;
            if let Some(Key::Schedule(name)) = Key::parse(&prefix, &subject)
                && after.is_none_or(|a| name.as_str() > a)
            {
                names.insert(name);
            }
        }
        Ok(names)
    }

    /// Publishes `payload` as `name`'s record, expecting its subject to end at `seq` (0: to
    /// have no message). The new sequence, or `None` when another write came first.
    async fn publish_schedule(
        &self,
        name: &str,
        payload: Bytes,
        seq: u64,
    ) -> StoreResult<Option<u64>> {
        let subject = Key::Schedule(name.to_owned()).subject(self.prefix());
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
        let reply = self.request(subject, payload, headers).await?;
        match stored_seq(&reply) {
            Ok(seq) => Ok(Some(seq)),
            Err(CommitError::Conflict) => Ok(None),
            Err(CommitError::Store(e)) => Err(e),
        }
    }
}

#[async_trait]
impl Schedules for NatsStore {
    async fn schedule(&self, name: &str) -> StoreResult<Option<Stored>> {
        match self.schedule_message(name).await? {
            Some((seq, payload)) => decode(name, seq, &payload),
            None => Ok(None),
        }
    }

    async fn schedules(
        &self,
        after: Option<&str>,
        limit: usize,
        max_bytes: Option<usize>,
    ) -> StoreResult<Vec<Stored>> {
        let limit = rules::page(limit);
        // The names from the stream's subjects (no record is read for them), then the page's
        // records one at a time, within the byte budget. A deleted schedule's tombstone is
        // read and passed over.
        let mut budget = ByteBudget::new(max_bytes);
        let mut page = Vec::new();
        for name in self.schedule_names(after).await? {
            if page.len() >= limit || !budget.open() {
                break;
            }
            let Some((seq, payload)) = self.schedule_message(&name).await? else {
                continue;
            };
            if let Some(stored) = decode(&name, seq, &payload)? {
                budget.take(payload.len());
                page.push(stored);
            }
        }
        Ok(page)
    }

    async fn put_schedule(&self, schedule: &Schedule, expect: u64) -> StoreResult<u64> {
        let name = schedule.def.name.as_str();
        let payload = serde_json::to_vec(schedule)
            .map_err(|e| StoreError::Invalid(format!("schedule `{name}`: cannot encode: {e}")))?;
        // A create expects nothing, or the tombstone of a deleted schedule of the name.
        let seq = if expect == 0 {
            match self.schedule_message(name).await? {
                Some((seq, payload)) if payload.is_empty() => seq,
                Some(_) => return Err(moved(name, expect)),
                None => 0,
            }
        } else {
            expect
        };
        self.publish_schedule(name, Bytes::from(payload), seq)
            .await?
            .ok_or_else(|| moved(name, expect))
    }

    async fn delete_schedule(&self, name: &str, expect: Option<u64>) -> StoreResult<bool> {
        let Some((seq, payload)) = self.schedule_message(name).await? else {
            return Ok(false);
        };
        if payload.is_empty() {
            return Ok(false);
        }
        if let Some(expect) = expect
            && expect != seq
        {
            return Err(moved(name, expect));
        }
        match self.publish_schedule(name, Bytes::new(), seq).await? {
            Some(_) => Ok(true),
            None => Err(moved(name, seq)),
        }
    }
}
