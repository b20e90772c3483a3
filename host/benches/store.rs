//! Criterion benchmarks of the embedded store's hot paths: enqueue, claim, complete, append and
//! read, from one task and from 8 concurrent tasks, on a real file in WAL mode.
//!
//! Run with `cargo bench -p homing --bench store`. Each iteration is one operation; criterion
//! reports time per operation (the reciprocal is ops/s). Concurrent variants run 8 tasks that
//! each perform `iters / 8` operations, so the reported time is wall time per operation with 8
//! callers contending.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use homing::store::embedded::EmbeddedStore;
use homing::store::{NewDispatch, RunResult, Store, SystemClock};
use tokio::runtime::Runtime;

const TASKS: u64 = 8;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("bench.db"), Arc::new(SystemClock)).unwrap();
    (dir, store.store())
}

/// Runs `op(store, task, i)` `iters` times, split over `tasks` concurrent tasks.
fn timed<F, Fut>(rt: &Runtime, store: &Store, iters: u64, tasks: u64, op: F) -> Duration
where
    F: Fn(Store, u64, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    rt.block_on(async {
        let per_task = iters.div_ceil(tasks);
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for task in 0..tasks {
            let (store, op) = (store.clone(), op.clone());
            set.spawn(async move {
                for i in 0..per_task {
                    op(store.clone(), task, i).await;
                }
            });
        }
        while set.join_next().await.is_some() {}
        start.elapsed()
    })
}

async fn fill(store: &Store, n: u64, threads: u64) {
    for i in 0..n {
        store
            .mailbox
            .enqueue(NewDispatch::new(
                "bench",
                format!("t{}", i % threads),
                "payload",
            ))
            .await
            .unwrap();
    }
}

fn bench_store(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("embedded");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));

    for tasks in [1, TASKS] {
        group.bench_function(format!("enqueue/{tasks}"), |b| {
            let (_dir, store) = open();
            b.iter_custom(|iters| {
                timed(&rt, &store, iters, tasks, |store, task, i| async move {
                    store
                        .mailbox
                        .enqueue(NewDispatch::new(
                            "bench",
                            format!("t{task}-{}", i % 50),
                            "payload",
                        ))
                        .await
                        .unwrap();
                })
            });
        });

        group.bench_function(format!("claim+complete/{tasks}"), |b| {
            let (_dir, store) = open();
            b.iter_custom(|iters| {
                rt.block_on(fill(&store, iters + tasks * 2, 1_000));
                timed(&rt, &store, iters, tasks, |store, _, _| async move {
                    if let Some(d) = store
                        .mailbox
                        .claim("bench", "bench-host", 30_000)
                        .await
                        .unwrap()
                    {
                        let token = d.token().unwrap().to_owned();
                        store
                            .mailbox
                            .complete(&d.id, &token, RunResult::success("ok"))
                            .await
                            .unwrap();
                    }
                })
            });
        });

        group.bench_function(format!("append/{tasks}"), |b| {
            let (_dir, store) = open();
            b.iter_custom(|iters| {
                timed(&rt, &store, iters, tasks, |store, task, _| async move {
                    store
                        .log
                        .append(&format!("log-{task}"), b"an entry of the thread log", None)
                        .await
                        .unwrap();
                })
            });
        });

        group.bench_function(format!("read/{tasks}"), |b| {
            let (_dir, store) = open();
            rt.block_on(async {
                for i in 0..1_000u64 {
                    store
                        .log
                        .append(
                            &format!("log-{}", i % TASKS),
                            b"an entry of the thread log",
                            None,
                        )
                        .await
                        .unwrap();
                }
            });
            b.iter_custom(|iters| {
                timed(&rt, &store, iters, tasks, |store, task, i| async move {
                    let entries = store
                        .log
                        .read(&format!("log-{task}"), i % 100, 10)
                        .await
                        .unwrap();
                    assert!(!entries.is_empty());
                })
            });
        });
    }
    group.finish();

    // Claim latency as the backlog grows: it must not grow with it (no scans on the claim
    // path). Each iteration claims and completes one dispatch and enqueues one, so the backlog
    // stays at its size.
    let mut group = c.benchmark_group("claim_backlog");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for backlog in [1_000u64, 100_000] {
        let (_dir, store) = open();
        timed(&rt, &store, backlog, TASKS, |store, task, i| async move {
            store
                .mailbox
                .enqueue(NewDispatch::new(
                    "bench",
                    format!("t{}", (task * 7919 + i) % 1_000),
                    "payload",
                ))
                .await
                .unwrap();
        });
        group.bench_function(format!("claim+complete/{backlog}"), |b| {
            b.iter_custom(|iters| {
                timed(&rt, &store, iters, 1, |store, _, i| async move {
                    let d = store
                        .mailbox
                        .claim("bench", "bench-host", 30_000)
                        .await
                        .unwrap()
                        .unwrap();
                    let token = d.token().unwrap().to_owned();
                    store
                        .mailbox
                        .complete(&d.id, &token, RunResult::success("ok"))
                        .await
                        .unwrap();
                    store
                        .mailbox
                        .enqueue(NewDispatch::new(
                            "bench",
                            format!("t{}", i % 1_000),
                            "payload",
                        ))
                        .await
                        .unwrap();
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_store);
criterion_main!(benches);
