//! `--only messages`: how long a message takes from its send to the guest that waits for it.
//!
//! A claim of one dispatch waits for its thread's next message the way a guest's
//! `next-message` does (`work::messages::wait_next`: the thread's watch, no polling), and acks
//! each one it is handed; a sender sends the next message once the previous one was acked. The
//! latency is from the start of the send call to the moment the waiter holds the message. On
//! the embedded store the sender is the same store instance (the API of the host that runs
//! the guest); on NATS it is a second instance with its own connection and watcher, standing
//! for another host.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::target::Target;
use super::{Figure, figure};
use crate::store::{Fence, MessageKind, NewDispatch, NewMessage};
use crate::work::messages::wait_next;

const THREAD: &str = "inbox-bench";

/// Send-to-delivery latency p50 and p99 over `n` messages.
pub(super) async fn messages(target: &Target, n: usize) -> anyhow::Result<Vec<Figure>> {
    let scratch = target.scratch().await?;
    let receiver = scratch.store.clone();
    let (sender, across) = match target.second(&scratch).await? {
        Some(other) => (other, "across hosts"),
        None => (receiver.clone(), "same host"),
    };
    receiver
        .mailbox
        .enqueue(NewDispatch::new("echo", THREAD, "listen"))
        .await?;
    let Some(claimed) = receiver.mailbox.claim("echo", "bench", 600_000).await? else {
        bail!("the listening dispatch was not claimable");
    };
    let fence = Fence::of(&claimed).context("a claimed dispatch has a fence")?;
    let (got_tx, mut got_rx) = tokio::sync::mpsc::channel::<Instant>(1);
    let listener = {
        let store = receiver.clone();
        tokio::spawn(async move {
            let mut after = 0;
            for _ in 0..n {
                let until = Instant::now() + Duration::from_secs(30);
                let Some(m) =
                    wait_next(&store, THREAD, after, until, std::future::pending()).await?
                else {
                    bail!("no message arrived within 30 s");
                };
                let at = Instant::now();
                store.inbox.ack_message(THREAD, m.seq, &fence).await?;
                after = m.seq;
                if got_tx.send(at).await.is_err() {
                    break;
                }
            }
            anyhow::Ok(())
        })
    };
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let sent = Instant::now();
        let message = NewMessage::new(MessageKind::Steer, format!("ping {i}"), "bench");
        sender.inbox.send(THREAD, message, u64::MAX).await?;
        let Some(got) = got_rx.recv().await else {
            break;
        };
        latencies.push(got.saturating_duration_since(sent).as_secs_f64() * 1e6);
    }
    listener.await.context("the listener stopped")??;
    drop(sender);
    target.drop_scratch(scratch).await;
    if latencies.len() < n {
        bail!("only {} of {n} messages were delivered", latencies.len());
    }
    Ok(percentiles(
        &format!("message send to delivery, {}, {across}", target.name()),
        latencies,
    ))
}

/// The p50 figure (with min and max) and the p99 of `samples` in microseconds.
fn percentiles(name: &str, mut samples: Vec<f64>) -> Vec<Figure> {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let p99 = samples
        .get((n * 99 / 100).min(n.saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mut p50 = figure(format!("{name} p50"), "µs", samples);
    p50.samples = n;
    let p99 = Figure {
        scenario: format!("{name} p99"),
        unit: "µs",
        median: p99,
        min: p99,
        max: p99,
        samples: n,
    };
    vec![p50, p99]
}
