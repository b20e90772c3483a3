//! A host's view of the NATS stream against a real `nats-server`, with the gap between a
//! commit's acknowledgement and its own apply to the view held open by the test
//! ([`NatsStore::hold_own_applies`]): the gap a descheduled task makes on a loaded machine.
//! While one host's own write waits there, its watcher and another host go on; once it is let
//! through, the view must still be the server's state of each thread (docs/contract.md, "What a
//! host's view holds"). Both tests failed before issue 49's fix: the first claimed a
//! dead-lettered dispatch again, the second stamped new work with an epoch an interrupt had
//! already moved past.

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{ManualClock, NewDispatch, SharedClock, Status, Store};

use crate::natsd::NatsServer;

const T0: u64 = 1_700_000_000_000;
const AGENT: &str = "agent";
const LEASE: u64 = 30_000;

/// Two hosts on one fresh stream: `a` (with its `NatsStore` handle for the hold) and `b`.
async fn two_hosts(server: &NatsServer, prefix: &str) -> (NatsStore, Store, Store) {
    let clock: SharedClock = ManualClock::new(T0);
    let config = NatsConfig {
        urls: vec![server.url()],
        prefix: prefix.into(),
        ..NatsConfig::default()
    };
    let a = NatsStore::connect(&config, clock.clone())
        .await
        .expect("open host a");
    let b = NatsStore::open(&config, clock).await.expect("open host b");
    (a.clone(), a.into_store(), b)
}

fn token(d: &homing::store::Dispatch) -> String {
    d.claim.as_ref().expect("claimed").token.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_own_write_does_not_bring_a_dead_lettered_dispatch_back() {
    let server = NatsServer::start();
    let (a_nats, a, b) = two_hosts(&server, "lateown").await;
    a.mailbox
        .enqueue(NewDispatch::new(AGENT, "t", b"work".to_vec()).with_id("d1"))
        .await
        .expect("enqueue");
    let mine = a
        .mailbox
        .claim(AGENT, "a", LEASE)
        .await
        .expect("claim")
        .expect("a claims d1");

    // a's nack is stored, but its own apply waits at the hold.
    a_nats.hold_own_applies();
    let nack = {
        let a = a.clone();
        let t = token(&mine);
        tokio::spawn(async move { a.mailbox.nack("d1", &t, T0, "try again").await })
    };
    a_nats.own_applies_held(1).await;

    // Meanwhile b claims the requeued dispatch and dead-letters it, and a's watcher applies
    // all of it.
    let theirs = b
        .mailbox
        .claim(AGENT, "b", LEASE)
        .await
        .expect("claim")
        .expect("b claims the nacked d1");
    assert_eq!(theirs.id, "d1");
    let dead = b
        .mailbox
        .dead_letter("d1", &token(&theirs), "give up")
        .await
        .expect("dead letter");
    assert_eq!(dead.status, Status::DeadLetter);
    a_nats.caught_up().await.expect("a's view catches up");

    a_nats.release_own_applies();
    let nacked = nack.await.expect("the nack task").expect("the nack");
    assert_eq!(nacked.status, Status::Queued);

    // The dead letter stands: a finds nothing to claim, and the record is unchanged.
    let again = a.mailbox.claim(AGENT, "a", LEASE).await.expect("claim");
    assert!(
        again.is_none(),
        "a settled dispatch was claimed again: {again:?}"
    );
    let stored = a.mailbox.load("d1").await.expect("load").expect("d1");
    assert_eq!(stored.status, Status::DeadLetter);
    assert_eq!(stored.claims, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_own_thread_record_does_not_take_an_interrupts_epoch_back() {
    let server = NatsServer::start();
    let (a_nats, a, b) = two_hosts(&server, "lateepoch").await;
    for i in 0..3 {
        a.log
            .append("t", format!("e{i}").as_bytes(), None)
            .await
            .expect("append");
    }

    // a's trim writes the thread record; its own apply waits at the hold.
    a_nats.hold_own_applies();
    let trim = {
        let a = a.clone();
        tokio::spawn(async move { a.log.trim("t", 2).await })
    };
    a_nats.own_applies_held(1).await;

    let interrupt = b.mailbox.interrupt("t", "stop").await.expect("interrupt");
    assert_eq!(interrupt.epoch, 1);
    a_nats.caught_up().await.expect("a's view catches up");
    a_nats.release_own_applies();
    trim.await.expect("the trim task").expect("the trim");

    assert_eq!(a.mailbox.thread_epoch("t").await.expect("epoch"), 1);
    let d = a
        .mailbox
        .enqueue(NewDispatch::new(AGENT, "t", b"after".to_vec()))
        .await
        .expect("enqueue");
    assert_eq!(d.epoch, 1, "new work is stamped with the interrupt's epoch");
    let claimed = b
        .mailbox
        .claim(AGENT, "b", LEASE)
        .await
        .expect("claim")
        .expect("the new dispatch runs");
    assert_eq!(claimed.id, d.id);
}
