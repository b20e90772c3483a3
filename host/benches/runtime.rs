//! Criterion benchmarks of the plugin runtime with the real `echo` example guest:
//!
//! - `fresh_instance`: a fresh store plus instantiation through `InstancePre` (what every
//!   dispatch pays with the default `reuse_instance = 1`);
//! - `end_to_end/echo`: 2,000 dispatches over 50 threads enqueued, then a host with 8 echo
//!   workers run until idle, on an embedded store file (the seed's measurement workload).
//!
//! Needs the example guests built (`cargo xtask guests`, which `cargo xtask test` and the demo
//! also do); fails loudly when `examples/wasm/echo.wasm` is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use homing::config::Config;
use homing::runtime::Runtime;
use homing::runtime::host::PluginContext;
use homing::store::embedded::EmbeddedStore;
use homing::store::{NewDispatch, SystemClock};
use homing::supervisor::Supervisor;

const DISPATCHES: u64 = 2_000;
const THREADS: u64 = 50;

fn echo_wasm() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/wasm/echo.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask guests` first",
        path.display()
    );
    path
}

fn config(dir: &std::path::Path, pooling: &str, workers: u32) -> Config {
    let text = format!(
        "[host]\npooling = \"{pooling}\"\nsweep_interval = \"1s\"\n[plugins.echo]\npath = {:?}\nconcurrency = {workers}\n",
        echo_wasm().display().to_string()
    );
    Config::parse(&text, "bench.toml", dir).unwrap()
}

fn bench_runtime(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    let mut group = c.benchmark_group("fresh_instance");
    for pooling in ["on", "off"] {
        let config = config(dir.path(), pooling, 8);
        let runtime = Runtime::new(&config).unwrap();
        let store = EmbeddedStore::open_in_memory(Arc::new(SystemClock))
            .unwrap()
            .store();
        let ctx = Arc::new(PluginContext::standalone(
            "echo",
            config.plugins["echo"].clone(),
            store,
            dir.path().to_path_buf(),
        ));
        let plugin = runtime.load_plugin(ctx, &echo_wasm()).unwrap();
        group.bench_function(format!("echo/pooling-{pooling}"), |b| {
            b.to_async(&rt)
                .iter(|| async { runtime.start_instance(&plugin).await.unwrap() });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("end_to_end");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(DISPATCHES));
    group.bench_function("echo/2000x50threads/8workers", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let run_dir = tempfile::tempdir().unwrap();
                let config = config(run_dir.path(), "auto", 8);
                let store =
                    EmbeddedStore::open(&run_dir.path().join("e2e.db"), Arc::new(SystemClock))
                        .unwrap()
                        .store();
                rt.block_on(async {
                    for i in 0..DISPATCHES {
                        store
                            .mailbox
                            .enqueue(NewDispatch::new(
                                "echo",
                                format!("thread-{}", i % THREADS),
                                "hello",
                            ))
                            .await
                            .unwrap();
                    }
                });
                let supervisor = Supervisor::new(config, store.clone()).unwrap();
                let start = Instant::now();
                rt.block_on(supervisor.run(true)).unwrap();
                total += start.elapsed();
                let left = rt.block_on(store.mailbox.has_live_work()).unwrap();
                assert!(!left, "the run must drain every dispatch");
            }
            total
        });
    });
    group.finish();
}

criterion_group!(benches, bench_runtime);
criterion_main!(benches);
