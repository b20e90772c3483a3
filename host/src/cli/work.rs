//! The commands on the work in a store: `homing enqueue`, `homing dispatch ...`,
//! `homing thread ...` and `homing waitpoint ...`, and how they print dispatches, log entries
//! and waitpoints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::exit::{Exit, coded};
use crate::config::{Config, parse_duration};
use crate::input::read_capped;
use crate::live::follow::{Event as LiveEvent, Follower};
use crate::live::{Hub, LiveSettings};
use crate::store::deltas::Cursor;
use crate::store::model::{Debounce, Gather, check_name};
use crate::store::{
    Dispatch, JournalData, ListCursor, ListFilter, LogEntry, LogRange, MessageFilter, MessageKind,
    MessageState, NewDispatch, NewMessage, OnBusy, Status, Store, StoreError, Waitpoint,
    WaitpointFilter, WaitpointState,
};
use crate::work::journal::{self, EntryView, StepView};
use crate::work::messages::{self, SendError};
use crate::work::waitpoints::{self, WaitpointError, parse_cursor};
use crate::work::{self, Attempts, OpError, Request};

/// `homing enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The agent (plugin) to route to.
    #[arg(long)]
    pub agent: String,
    /// The thread.
    #[arg(long)]
    pub thread: String,
    /// The payload text (else `--payload-file`, else standard input).
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// A file holding the payload.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// 0 most urgent, 255 least.
    #[arg(long, default_value_t = crate::store::DEFAULT_PRIORITY)]
    pub priority: u8,
    /// Delay before it may be claimed ("30s", "5m").
    #[arg(long)]
    pub delay: Option<String>,
    /// At most one live dispatch per (thread, key).
    #[arg(long)]
    pub dedupe_key: Option<String>,
    /// The key its runs are limited by (the plugin's `key_concurrency`, `key_rate`); default:
    /// what the plugin's `concurrency_key` takes from the metadata.
    #[arg(long)]
    pub concurrency_key: Option<String>,
    /// Failed attempts before it dead-letters (default: the plugin's `max_attempts`).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// The dispatch id (default: a new UUID v7).
    #[arg(long)]
    pub id: Option<String>,
    /// Debounce: join the open window of (thread, KEY) instead of adding work, or open one
    /// (needs `--quiet` and `--max-wait`; default: the agent's `[plugins.x.debounce]`). The
    /// window's id is printed; `--json` shows how many it holds (`window.count`).
    #[arg(long, value_name = "KEY", requires_all = ["quiet", "max_wait"])]
    pub debounce: Option<String>,
    /// With `--debounce`: the window is due this long after its latest enqueue ("2s").
    #[arg(long, requires = "debounce")]
    pub quiet: Option<String>,
    /// With `--debounce`: ... and no later than this after its first (at most 7 days).
    #[arg(long, requires = "debounce")]
    pub max_wait: Option<String>,
    /// With `--debounce`: what the run gets, `last` (default), `first` or `collect` (every
    /// enqueue, as the claim's items).
    #[arg(long = "debounce-payload", value_name = "MODE", requires = "debounce")]
    pub debounce_payload: Option<String>,
    /// With `--debounce`: the window is sealed and due at once at this many enqueues
    /// (default 100).
    #[arg(long, requires = "debounce")]
    pub max_items: Option<u32>,
    /// Metadata entries as key=value.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Print the stored record as JSON.
    #[arg(long)]
    pub json: bool,
    /// Wait until the dispatch finishes and print its result (exit 5 if it dead-letters, is
    /// cancelled or superseded; 6 if `--timeout` passes first).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits ("60s", "5m").
    #[arg(long, default_value = "60s", requires = "wait")]
    pub timeout: String,
    /// With `--wait`: print what the run streams as it comes, then the result.
    #[arg(long, requires = "wait")]
    pub stream: bool,
}

/// `homing dispatch ...`.
#[derive(Debug, Subcommand)]
pub enum DispatchCommand {
    /// Lists dispatches by priority, then age.
    List {
        /// Only this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only this thread.
        #[arg(long)]
        thread: Option<String>,
        /// Only this status (queued, claimed, waiting, acked, cancelled, superseded,
        /// dead_letter).
        #[arg(long)]
        status: Option<Status>,
        /// Page size.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this cursor (printed under a full page as `next page: --after ...`).
        #[arg(long, value_name = "CURSOR")]
        after: Option<ListCursor>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// How many dispatches each agent has in each status.
    Counts {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Shows one dispatch.
    Show {
        /// The id.
        id: String,
        /// Also the journal: what its runs recorded (one line per call entry), and its steps.
        #[arg(long)]
        journal: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Prints what a dispatch's run streams as it comes (a line on each restart of the
    /// run), then its result.
    Watch {
        /// The id.
        id: String,
        /// Resume after this position (`claim:seq`, as the API's event ids).
        #[arg(long, value_name = "CLAIM:SEQ")]
        after: Option<Cursor>,
        /// How long to watch ("60s", "5m"; exit 6 if it has not finished by then).
        #[arg(long, default_value = "10m")]
        timeout: String,
    },
    /// Cancels a queued or waiting dispatch.
    Cancel {
        /// The id.
        id: String,
    },
    /// Re-enqueues a dead-lettered (or cancelled) dispatch as a new one.
    Retry {
        /// The id.
        id: String,
    },
}

/// `homing thread ...`.
#[derive(Debug, Subcommand)]
pub enum ThreadCommand {
    /// Interrupts a thread: supersedes its queued work and stops its running dispatch.
    Interrupt {
        /// The thread.
        thread: String,
        /// Why (recorded on superseded dispatches).
        #[arg(long, default_value = "interrupted by operator")]
        reason: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Prints a thread's log.
    Log {
        /// The thread.
        thread: String,
        /// Only entries after this sequence.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Most entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Keep following: print new entries as they are appended, until interrupted (with
        /// `--json`, one JSON object per line). Entries a later rollback masks are printed as
        /// they come; its mark says which.
        #[arg(long)]
        follow: bool,
        /// Also the entries a `rollback` message masked (hidden by default; the log keeps
        /// them), each marked `masked`.
        #[arg(long)]
        all: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Sends a message into a thread's inbox and prints its sequence: the live run reads it;
    /// with no live run, a follow-up message starts a dispatch to answer it.
    Send(SendArgs),
    /// Lists a thread's inbox messages, oldest first.
    Messages {
        /// The thread.
        thread: String,
        /// Only messages in this state: pending, acked or discarded.
        #[arg(long)]
        state: Option<String>,
        /// Only messages after this sequence.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Most messages.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Discards a thread's pending messages up to a sequence (no run will read them).
    Discard {
        /// The thread.
        thread: String,
        /// The last sequence to discard.
        #[arg(long)]
        through: u64,
    },
}

/// `homing waitpoint ...`. The CLI acts with an operator's authority (whoever can read the
/// config can open its store): it completes and cancels any waitpoint, recorded as `cli`.
#[derive(Debug, Subcommand)]
pub enum WaitpointCommand {
    /// Lists waitpoints, oldest first.
    List {
        /// Only this thread.
        #[arg(long)]
        thread: Option<String>,
        /// Only this dispatch.
        #[arg(long)]
        dispatch: Option<String>,
        /// Only this state: pending, completed, timed_out or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this cursor (printed under a full page as `next page: --after ...`).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Shows one waitpoint (never its token).
    Show {
        /// The id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Completes a pending waitpoint with a result; its waiting dispatch resumes. Exit 1,
    /// naming its state, when it is not pending.
    Complete {
        /// The id.
        id: String,
        /// The result text (else `--payload-file`, else standard input).
        #[arg(long, conflicts_with = "payload_file")]
        payload: Option<String>,
        /// A file holding the result.
        #[arg(long)]
        payload_file: Option<PathBuf>,
    },
    /// Cancels a pending waitpoint; its waiting dispatch resumes and reads `cancelled`. Exit 1,
    /// naming its state, when it is not pending.
    Cancel {
        /// The id.
        id: String,
    },
}

/// `homing thread send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The thread.
    pub thread: String,
    /// The agent that answers the message when no run is live (default: the agent that last
    /// ran the thread).
    #[arg(long)]
    pub agent: Option<String>,
    /// `follow-up` (a next turn: answered by a new dispatch when no run is live) or `steer`
    /// (for the live run; waits for the next run when none is).
    #[arg(long, default_value = "follow-up")]
    pub kind: String,
    /// When a run holds the thread: `enqueue` (wait for the next turn), `steer` (to the live
    /// run), `reject` (refused, exit 7, nothing stored), `interrupt` (the run is stopped, its
    /// turn's end marked in the log, and a follow-up answers the message), `rollback` (as
    /// `interrupt`, and what the stopped run wrote to the log is masked) or `merge` (as
    /// `rollback`, and the messages the stopped run had taken are handed to the next turn
    /// first). On an idle thread
    /// every policy starts a turn. Default: the agent's `[plugins.x.inbox] on_busy`, else
    /// `--kind`.
    #[arg(long, conflicts_with = "kind")]
    pub on_busy: Option<String>,
    /// The message text (else `--payload-file`, else standard input).
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// A file holding the message.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Metadata entries as key=value.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Wait until a run acknowledges the message and print the log sequence it was appended at
    /// (exit 6 if `--timeout` passes first).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits ("60s", "5m").
    #[arg(long, default_value = "60s", requires = "wait")]
    pub timeout: String,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// The dispatch `homing enqueue` submits, checked against the config before the store is
/// opened: a payload over `[host] max_payload` is refused after reading one byte past it,
/// however much a file or pipe holds.
pub(super) fn prepare(config: &Config, args: &EnqueueArgs) -> anyhow::Result<NewDispatch> {
    name("--agent", &args.agent)?;
    name("--thread", &args.thread)?;
    if let Some(id) = &args.id {
        name("--id", id)?;
    }
    if !config.plugins.contains_key(&args.agent) {
        return Err(coded(
            Exit::NotFound,
            format!(
                "--agent `{}` is not a plugin in {} (configured: {})",
                args.agent,
                config.source,
                config
                    .plugins
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let cap = config.host.max_payload;
    let limit = "[host] max_payload";
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => read_capped(text.as_bytes(), cap, "the payload", limit)?,
        (None, Some(file)) => {
            let source = std::fs::File::open(file)
                .with_context(|| format!("--payload-file {}", file.display()))?;
            read_capped(source, cap, "the payload", limit)?
        }
        (None, None) => read_capped(std::io::stdin().lock(), cap, "the payload", limit)?,
    };
    let mut request = Request {
        id: args.id.clone(),
        priority: Some(args.priority),
        dedupe_key: args.dedupe_key.clone(),
        max_attempts: args.max_attempts,
        concurrency_key: args.concurrency_key.clone(),
        ..Request::new(&args.agent, &args.thread, payload)
    };
    if let Some(delay) = &args.delay {
        request.delay =
            parse_duration(delay).map_err(|e| coded(Exit::Invalid, format!("--delay: {e}")))?;
    }
    request.debounce = match &args.debounce {
        Some(key) => Some(debounce_of(key, args)?),
        None => work::configured_debounce(config, &args.agent),
    };
    for entry in &args.metadata {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(coded(
                Exit::Invalid,
                format!("--meta `{entry}`: expected KEY=VALUE"),
            ));
        };
        request.metadata.insert(key.to_owned(), value.to_owned());
    }
    // The same rules the store applies, named by flag: `--dedupe-key`, `--meta` (a key),
    // `--concurrency-key`.
    request
        .into_dispatch(
            Attempts::configured(config, &args.agent),
            config.key_source(&args.agent),
        )
        .map_err(|e| {
            let e = e
                .replace("dedupe_key", "--dedupe-key")
                .replace("concurrency_key", "--concurrency-key")
                .replace("metadata", "--meta")
                .replace("debounce:", "--debounce:");
            coded(Exit::Invalid, e)
        })
}

/// The debounce `--debounce KEY` and its flags ask for.
fn debounce_of(key: &str, args: &EnqueueArgs) -> anyhow::Result<Debounce> {
    let duration = |flag: &str, value: &Option<String>| -> anyhow::Result<u64> {
        let text = value
            .as_deref()
            .ok_or_else(|| coded(Exit::Invalid, format!("{flag}: needed with --debounce")))?;
        parse_duration(text)
            .map(crate::store::millis)
            .map_err(|e| coded(Exit::Invalid, format!("{flag}: {e}")))
    };
    let payload = match args.debounce_payload.as_deref() {
        None => Gather::Last,
        Some(text) => text
            .parse()
            .map_err(|e: String| coded(Exit::Invalid, format!("--debounce-payload: {e}")))?,
    };
    let d = Debounce {
        key: key.to_owned(),
        quiet_ms: duration("--quiet", &args.quiet)?,
        max_wait_ms: duration("--max-wait", &args.max_wait)?,
        payload,
        max_items: args.max_items.unwrap_or(100),
    };
    // The store's rules, named by flag.
    d.validate().map_err(|e| {
        let e = e
            .replace("debounce.key", "--debounce")
            .replace("debounce.max_wait", "--max-wait")
            .replace("debounce.max_items", "--max-items")
            .replace("debounce.quiet", "--quiet");
        coded(Exit::Invalid, e)
    })?;
    Ok(d)
}

/// Checks an id or a thread name given as `flag`, as the store and the API check it: exit 2
/// naming the flag when it is blank, too long or not printable.
fn name(flag: &str, value: &str) -> anyhow::Result<()> {
    check_name(flag, value).map_err(|e| coded(Exit::Invalid, e))
}

/// Submits what [`prepare`] made and prints its id (or the record, with `--json`); with
/// `--wait`, waits for it to finish and prints its result instead.
pub(super) async fn enqueue(
    config: &Config,
    store: &Store,
    new: NewDispatch,
    args: &EnqueueArgs,
) -> anyhow::Result<()> {
    let timeout = parse_duration(&args.timeout)
        .map_err(|e| coded(Exit::Invalid, format!("--timeout: {e}")))?;
    let dispatch = store.mailbox.enqueue(new).await?;
    if args.stream {
        let d = watch(config, store, &dispatch.id, None, timeout).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&d)?);
        } else if let Some(result) = d.result.as_ref().filter(|_| d.status == Status::Acked) {
            println!("{}", printable(&result.output));
        }
        return outcome(&d, timeout);
    }
    if !args.wait {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&dispatch)?);
        } else {
            println!("{}", text(&dispatch.id));
        }
        return Ok(());
    }
    let d = work::until_terminal(store, &dispatch.id, timeout, None).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else if let Some(result) = d.result.as_ref().filter(|_| d.status == Status::Acked) {
        println!("{}", printable(&result.output));
    }
    outcome(&d, timeout)
}

/// The exit of a wait for `d` that lasted up to `timeout`: 0 when it was acked, 6 when it is
/// still live, 5 when it ended otherwise.
fn outcome(d: &Dispatch, timeout: Duration) -> anyhow::Result<()> {
    match d.status {
        Status::Acked => Ok(()),
        Status::Queued | Status::Claimed | Status::Waiting => Err(coded(
            Exit::TimedOut,
            format!(
                "dispatch {} is still {} after {timeout:?} (--timeout)",
                text(&d.id),
                d.status
            ),
        )),
        status => Err(coded(
            Exit::DispatchFailed,
            format!(
                "dispatch {} ended {status}: {}",
                text(&d.id),
                text(d.last_error.as_deref().unwrap_or("no error recorded"))
            ),
        )),
    }
}

/// Follows dispatch `id`'s stream after `after` for up to `timeout`, writing its deltas to
/// standard output as they come (bytes that are not UTF-8 escaped) and a line on each restart,
/// and returns the dispatch as it ended (or as it is when the time is up).
async fn watch(
    config: &Config,
    store: &Store,
    id: &str,
    after: Option<Cursor>,
    timeout: Duration,
) -> anyhow::Result<Dispatch> {
    use std::io::Write;
    let hub = Hub::new(store, LiveSettings::of(config));
    let Some(mut follower) = Follower::open(&hub, id, after).await? else {
        return Err(OpError::NotFound(id.to_owned()).into());
    };
    let until = tokio::time::Instant::now() + timeout;
    let mut out = std::io::stdout().lock();
    let mut wrote = false;
    loop {
        let next = tokio::select! {
            next = follower.next() => next?,
            () = tokio::time::sleep_until(until) => None,
        };
        match next {
            Some(LiveEvent::Delta { chunk, .. }) => {
                out.write_all(streamed(&chunk).as_bytes())?;
                out.flush()?;
                wrote = true;
            }
            Some(LiveEvent::Reset { claim }) => {
                writeln!(
                    out,
                    "\n--- the run started again (claim {claim}); what it streamed before is void ---"
                )?;
                wrote = false;
            }
            Some(LiveEvent::Dropped { last }) => {
                // Only a reader in this process's hub falls behind; go on from where it was.
                if wrote {
                    writeln!(out)?;
                }
                return Box::pin(watch(
                    config,
                    store,
                    id,
                    Some(last),
                    until - tokio::time::Instant::now(),
                ))
                .await;
            }
            Some(LiveEvent::Status(_)) => {}
            Some(LiveEvent::Result(d)) => {
                if wrote {
                    writeln!(out)?;
                }
                return Ok(d);
            }
            None => break,
        }
    }
    if wrote {
        writeln!(out)?;
    }
    store
        .mailbox
        .load(id)
        .await?
        .ok_or_else(|| OpError::NotFound(id.to_owned()).into())
}

/// How often `--follow` reads the store again, at most.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

pub(super) async fn dispatch(
    config: &Config,
    store: &Store,
    command: DispatchCommand,
) -> anyhow::Result<()> {
    match command {
        DispatchCommand::List {
            agent,
            thread,
            status,
            limit,
            after,
            json,
        } => {
            for (flag, value) in [("--agent", &agent), ("--thread", &thread)] {
                if let Some(value) = value {
                    name(flag, value)?;
                }
            }
            let filter = ListFilter {
                thread,
                agent,
                statuses: status.into_iter().collect(),
                limit,
                after,
            };
            let rows = store.mailbox.list(&filter).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print_table(&rows);
                if limit > 0
                    && rows.len() == limit
                    && let Some(last) = rows.last()
                {
                    println!(
                        "next page: --after {}",
                        text(&ListCursor::of(last).to_string())
                    );
                }
            }
        }
        DispatchCommand::Counts { json } => {
            let counts = store.mailbox.counts().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&counts)?);
            } else {
                println!("{:<20}  {:<11}  {:>10}", "AGENT", "STATUS", "COUNT");
                for row in counts {
                    println!(
                        "{:<20}  {:<11}  {:>10}",
                        text(&row.agent),
                        row.status,
                        row.count
                    );
                }
            }
        }
        DispatchCommand::Watch { id, after, timeout } => {
            name("id", &id)?;
            let timeout = parse_duration(&timeout)
                .map_err(|e| coded(Exit::Invalid, format!("--timeout: {e}")))?;
            let d = watch(config, store, &id, after, timeout).await?;
            if let Some(result) = d.result.as_ref().filter(|_| d.status == Status::Acked) {
                println!("{}", printable(&result.output));
            }
            outcome(&d, timeout)?;
        }
        DispatchCommand::Show { id, journal, json } => {
            name("id", &id)?;
            let Some(d) = store.mailbox.load(&id).await? else {
                return Err(OpError::NotFound(id).into());
            };
            let waiting_on = store.waitpoints.waitpoints_of(&id).await?;
            let journal = if journal {
                Some(store.journal.load_journal(&id).await?)
            } else {
                None
            };
            if json {
                let mut shown = serde_json::to_value(&d)?;
                if let Some(map) = shown.as_object_mut() {
                    map.insert(
                        "waitpoints".into(),
                        waiting_on.iter().map(waitpoints::view).collect(),
                    );
                    if let Some(data) = &journal {
                        let entries: Vec<EntryView> =
                            data.calls.iter().map(EntryView::of).collect();
                        let steps: Vec<StepView> = data.steps.iter().map(StepView::of).collect();
                        map.insert(
                            "journal".into(),
                            serde_json::json!({
                                "entries": entries,
                                "steps": steps,
                                "bytes": data.bytes(),
                            }),
                        );
                    }
                }
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                print_dispatch(&d);
                for w in &waiting_on {
                    println!(
                        "waitpoint:    {} {} ({})",
                        text(&w.name),
                        w.state,
                        text(&w.id)
                    );
                }
                if let Some(data) = &journal {
                    print_journal(data);
                }
            }
        }
        DispatchCommand::Cancel { id } => {
            name("id", &id)?;
            let d = work::cancel(store, &id).await?;
            println!("{} cancelled", text(&d.id));
        }
        DispatchCommand::Retry { id } => {
            name("id", &id)?;
            let retried = work::retry(config, store, &id).await?;
            println!("{}", text(&retried.id));
        }
    }
    Ok(())
}

pub(super) async fn thread(
    config: &Config,
    store: &Store,
    command: ThreadCommand,
) -> anyhow::Result<()> {
    match command {
        ThreadCommand::Send(args) => return send(config, store, args).await,
        ThreadCommand::Messages {
            thread,
            state,
            after,
            limit,
            json,
        } => {
            name("thread", &thread)?;
            let state = match state {
                None => None,
                Some(s) => Some(
                    s.parse::<MessageState>()
                        .map_err(|e| coded(Exit::Invalid, format!("--state: {e}")))?,
                ),
            };
            let filter = MessageFilter {
                state,
                after,
                limit,
                max_bytes: None,
            };
            let found = store.inbox.messages(&thread, &filter).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else {
                for m in found {
                    let mut by = match (&m.acked_by, m.log_seq) {
                        (Some(by), Some(log)) => format!(" by {} as entry {log}", text(by)),
                        _ => String::new(),
                    };
                    if let Some(policy) = m.applied {
                        by.push_str(&format!(" ({} applied)", policy.as_str()));
                    }
                    println!(
                        "{:>6}  {:<9} {:<9}{by}  {}",
                        m.seq,
                        m.kind,
                        m.state,
                        printable(&m.payload)
                    );
                }
            }
        }
        ThreadCommand::Discard { thread, through } => {
            name("thread", &thread)?;
            let n = store.inbox.discard_messages(&thread, through).await?;
            println!("discarded {n} message(s)");
        }
        ThreadCommand::Interrupt {
            thread,
            reason,
            json,
        } => {
            name("thread", &thread)?;
            let interrupt = store.mailbox.interrupt(&thread, &reason).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&interrupt)?);
            } else {
                println!(
                    "thread {} is now at epoch {}",
                    text(&thread),
                    interrupt.epoch
                );
                println!(
                    "superseded {} queued dispatch(es)",
                    interrupt.superseded.len()
                );
                if let Some(active) = &interrupt.active {
                    println!(
                        "running dispatch {} is being stopped (its host checks every 250ms)",
                        text(&active.id)
                    );
                }
            }
        }
        ThreadCommand::Log {
            thread,
            after,
            limit,
            follow,
            all,
            json,
        } => {
            name("thread", &thread)?;
            if follow {
                return follow_log(store, &thread, after, json).await;
            }
            let entries = store.log.read(&thread, after, limit).await?;
            let masks = match entries.last() {
                Some(last) => masks_from(store, &thread, &entries, last.seq).await?,
                None => Vec::new(),
            };
            let masked = |e: &LogEntry| masks.iter().any(|m| m.contains(e.seq));
            let entries = entries.into_iter().filter(|e| all || !masked(e));
            if json {
                let entries: Vec<LogEntry> = entries.collect();
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                for entry in entries {
                    let line = entry_line(&entry);
                    if masked(&entry) {
                        println!("{line}  [masked]");
                    } else {
                        println!("{line}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// A refused completion or cancellation as the CLI reports it: exit 3 for an unknown id, 1
/// naming the state of a waitpoint that is not pending, 2 for a result over the limit.
fn waitpoint_error(e: WaitpointError) -> anyhow::Error {
    match e {
        WaitpointError::NotFound(id) => {
            coded(Exit::NotFound, format!("no waitpoint `{}`", text(&id)))
        }
        // The CLI checks no token; kept for completeness.
        e @ WaitpointError::Unauthorized => coded(Exit::Failure, e.to_string()),
        WaitpointError::Settled(w) => {
            let when = w
                .settled_at
                .map_or_else(String::new, |at| format!(" at {at}"));
            let by = w
                .settled_by
                .as_deref()
                .map_or_else(String::new, |by| format!(" by {}", text(by)));
            coded(
                Exit::Failure,
                format!(
                    "waitpoint {} is {}{when}{by}: it is no longer pending",
                    text(&w.id),
                    w.state
                ),
            )
        }
        e @ WaitpointError::TooLarge { .. } => coded(Exit::Invalid, e.to_string()),
        WaitpointError::Store(e) => e.into(),
    }
}

pub(super) async fn waitpoint(
    config: &Config,
    store: &Store,
    command: WaitpointCommand,
) -> anyhow::Result<()> {
    match command {
        WaitpointCommand::List {
            thread,
            dispatch,
            state,
            limit,
            after,
            json,
        } => {
            for (flag, value) in [("--thread", &thread), ("--dispatch", &dispatch)] {
                if let Some(value) = value {
                    name(flag, value)?;
                }
            }
            let state = state
                .map(|s| {
                    s.parse::<WaitpointState>()
                        .map_err(|e| coded(Exit::Invalid, format!("--state: {e}")))
                })
                .transpose()?;
            let after = after
                .map(|c| {
                    parse_cursor(&c).map_err(|e| coded(Exit::Invalid, format!("--after: {e}")))
                })
                .transpose()?;
            let filter = WaitpointFilter {
                thread,
                dispatch,
                state,
                after,
                limit,
            };
            let found = store.waitpoints.list_waitpoints(&filter).await?;
            if json {
                let shown: Vec<_> = found.iter().map(waitpoints::view).collect();
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                println!(
                    "{:<36}  {:<9}  {:<36}  {:<20}  NAME",
                    "ID", "STATE", "DISPATCH", "THREAD"
                );
                for w in &found {
                    println!(
                        "{:<36}  {:<9}  {:<36}  {:<20}  {}",
                        text(&w.id),
                        w.state,
                        text(&w.dispatch),
                        text(&w.thread),
                        text(&w.name)
                    );
                }
                if found.len() == filter.page()
                    && let Some(last) = found.last()
                {
                    println!("next page: --after {}", text(&waitpoints::cursor(last)));
                }
            }
        }
        WaitpointCommand::Show { id, json } => {
            name("id", &id)?;
            let Some(w) = store.waitpoints.waitpoint(&id).await? else {
                return Err(waitpoint_error(WaitpointError::NotFound(id)));
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&waitpoints::view(&w))?);
            } else {
                print_waitpoint(&w);
            }
        }
        WaitpointCommand::Complete {
            id,
            payload,
            payload_file,
        } => {
            name("id", &id)?;
            let cap = waitpoints::max_result(config, store);
            let limit = "[host] max_payload";
            let result = match (&payload, &payload_file) {
                (Some(text), _) => read_capped(text.as_bytes(), cap, "the result", limit)?,
                (None, Some(file)) => {
                    let source = std::fs::File::open(file)
                        .with_context(|| format!("--payload-file {}", file.display()))?;
                    read_capped(source, cap, "the result", limit)?
                }
                (None, None) => read_capped(std::io::stdin().lock(), cap, "the result", limit)?,
            };
            let w = waitpoints::complete(store, config, &id, result, waitpoints::BY_CLI)
                .await
                .map_err(waitpoint_error)?;
            println!("{} completed", text(&w.id));
        }
        WaitpointCommand::Cancel { id } => {
            name("id", &id)?;
            let w = waitpoints::cancel(store, &id, waitpoints::BY_CLI)
                .await
                .map_err(waitpoint_error)?;
            println!("{} cancelled", text(&w.id));
        }
    }
    Ok(())
}

/// `homing thread send`: checks the flags and the message against the config, stores it and
/// prints its sequence (and, with `--wait`, the log sequence its acknowledgement appended).
async fn send(config: &Config, store: &Store, args: SendArgs) -> anyhow::Result<()> {
    name("thread", &args.thread)?;
    if let Some(agent) = &args.agent {
        name("--agent", agent)?;
    }
    let kind: MessageKind = args
        .kind
        .parse()
        .map_err(|e| coded(Exit::Invalid, format!("--kind: {e}")))?;
    let on_busy = args
        .on_busy
        .as_deref()
        .map(str::parse::<OnBusy>)
        .transpose()
        .map_err(|e| coded(Exit::Invalid, format!("--on-busy: {e}")))?;
    let timeout = parse_duration(&args.timeout)
        .map_err(|e| coded(Exit::Invalid, format!("--timeout: {e}")))?;
    let cap = messages::max_message(config, store);
    let limit = "[host] max_message";
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => read_capped(text.as_bytes(), cap, "the message", limit)?,
        (None, Some(file)) => {
            let source = std::fs::File::open(file)
                .with_context(|| format!("--payload-file {}", file.display()))?;
            read_capped(source, cap, "the message", limit)?
        }
        (None, None) => read_capped(std::io::stdin().lock(), cap, "the message", limit)?,
    };
    let mut new = NewMessage::new(kind, payload, "cli");
    new.agent = args.agent.clone();
    new.on_busy = on_busy;
    for entry in &args.metadata {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(coded(
                Exit::Invalid,
                format!("--meta `{entry}`: expected KEY=VALUE"),
            ));
        };
        new.metadata.insert(key.to_owned(), value.to_owned());
    }
    let sent = match messages::send(store, config, &args.thread, new).await {
        Ok(sent) => sent,
        Err(SendError::UnknownAgent(agent)) => {
            return Err(coded(
                Exit::NotFound,
                format!(
                    "--agent `{}` is not a plugin in {}",
                    text(&agent),
                    config.source
                ),
            ));
        }
        Err(e @ SendError::TooLarge { .. }) => return Err(coded(Exit::Invalid, e.to_string())),
        Err(SendError::Store(e)) => {
            let message = e.to_string().replace("metadata", "--meta");
            return Err(match e {
                StoreError::Invalid(_) | StoreError::Limit(_) => coded(Exit::Invalid, message),
                StoreError::Busy { .. } => coded(Exit::Busy, message),
                other => other.into(),
            });
        }
    };
    let seq = sent.message.seq;
    if !args.wait {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "seq": seq,
                    "kind": sent.message.kind,
                    "busy": sent.busy,
                    "applied": sent.applied,
                    "interrupted": messages::interrupted_json(&sent),
                    "reopened": sent.reopened,
                    "follow_ups": sent.follow_ups,
                })
            );
        } else {
            println!("{seq}");
        }
        return Ok(());
    }
    match messages::until_settled(store, &args.thread, seq, timeout).await? {
        Some(m) if m.state == MessageState::Acked => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&m)?);
            } else {
                println!("{}", m.log_seq.unwrap_or_default());
            }
            Ok(())
        }
        Some(m) => Err(coded(
            Exit::DispatchFailed,
            format!("message {seq} was {} before a run acknowledged it", m.state),
        )),
        None => Err(coded(
            Exit::TimedOut,
            format!(
                "message {seq} of thread {} is still pending after {timeout:?} (--timeout)",
                text(&args.thread)
            ),
        )),
    }
}

/// The ranges the rollback marks of `thread` mask: those among `read` and those after it, up to
/// the log's end (a mark comes after what it masks, so a page of the log is not enough to know
/// what to hide in it).
async fn masks_from(
    store: &Store,
    thread: &str,
    read: &[LogEntry],
    mut after: u64,
) -> anyhow::Result<Vec<LogRange>> {
    let mark = |e: &LogEntry| e.turn.as_ref().and_then(|t| t.masked);
    let mut masks: Vec<LogRange> = read.iter().filter_map(mark).collect();
    loop {
        let page = store.log.read(thread, after, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(masks);
        };
        after = last.seq;
        masks.extend(page.iter().filter_map(mark));
    }
}

/// One log entry as `thread log` prints it: its sequence, then (for an acknowledged message)
/// which message it records, then its data; a turn's mark says what ended the turn (and, for a
/// rollback, which entries it masked).
fn entry_line(entry: &LogEntry) -> String {
    if let Some(turn) = &entry.turn {
        let masked = match turn.masked {
            Some(m) => format!("; masked entries {}-{}", m.first, m.last),
            None => String::new(),
        };
        return format!(
            "{:>6}  [turn {}: dispatch {} by message {}{masked}]",
            entry.seq,
            turn.event.as_str(),
            text(&turn.dispatch),
            turn.message
        );
    }
    match &entry.note {
        Some(note) => format!(
            "{:>6}  [{} {} from {}] {}",
            entry.seq,
            note.kind,
            note.seq,
            text(&note.sent_by),
            printable(&entry.data)
        ),
        None => format!("{:>6}  {}", entry.seq, printable(&entry.data)),
    }
}

/// `homing thread log --follow`: every entry after `after`, then new ones as they come, until
/// SIGINT or SIGTERM.
async fn follow_log(store: &Store, thread: &str, mut after: u64, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut poll = Duration::from_millis(10);
    loop {
        let entries = store.log.read(thread, after, 1000).await?;
        if entries.is_empty() {
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(poll) => {}
            }
            poll = (poll * 2).min(FOLLOW_POLL);
            continue;
        }
        poll = Duration::from_millis(10);
        let mut out = std::io::stdout().lock();
        for entry in entries {
            after = entry.seq;
            if json {
                writeln!(out, "{}", serde_json::to_string(&entry)?)?;
            } else {
                writeln!(out, "{}", entry_line(&entry))?;
            }
        }
        out.flush()?;
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Bytes for a terminal: text with its control characters escaped (a stored value cannot move
/// the cursor or forge lines), anything else as its length and leading hex.
/// A delta as the terminal shows it: its text with line breaks and tabs kept and every other
/// control character escaped (a guest cannot drive the terminal), or its bytes as
/// [`printable`] shows them.
fn streamed(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text
            .chars()
            .map(|c| match c {
                '\n' | '\t' => c.to_string(),
                c if c.is_control() => c.escape_default().to_string(),
                c => c.to_string(),
            })
            .collect(),
        Err(_) => printable(bytes),
    }
}

fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => crate::runtime::host::escape_log_text(text).into_owned(),
        Err(_) => format!(
            "<{} bytes, hex {}>",
            bytes.len(),
            bytes
                .iter()
                .take(32)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
    }
}

/// A stored string for a terminal: [`printable`]'s escaping of control characters.
fn text(s: &str) -> std::borrow::Cow<'_, str> {
    crate::runtime::host::escape_log_text(s)
}

/// The journal's timeline: one line per call entry, then the steps.
fn print_journal(data: &JournalData) {
    println!(
        "journal:      {} entries, {} steps, {} bytes",
        data.calls.len(),
        data.steps.len(),
        data.bytes()
    );
    if !data.calls.is_empty() {
        println!(
            "  {:>5}  {:<19}  {:>5}  {:>7}  {:>9}  {:>8}  CALL",
            "POS", "KIND", "CLAIM", "ATTEMPT", "DURATION", "SIZE"
        );
    }
    for call in &data.calls {
        let v = EntryView::of(call);
        println!(
            "  {:>5}  {:<19}  {:>5}  {:>7}  {:>9}  {:>8}  {}",
            v.pos,
            v.kind,
            v.claim,
            v.attempt,
            journal::duration(v.duration_us),
            v.size,
            text(&v.describe())
        );
    }
    if !data.steps.is_empty() {
        println!("steps:");
        println!("  {:>5}  {:>7}  {:>8}  KEY", "CLAIM", "ATTEMPT", "SIZE");
    }
    for step in &data.steps {
        let state = StepView::of(step)
            .state
            .map_or_else(String::new, |s| format!(" ({})", text(&s)));
        println!(
            "  {:>5}  {:>7}  {:>8}  {}{state}",
            step.claim,
            step.attempt,
            step.size,
            text(&step.key)
        );
    }
}

fn print_table(rows: &[Dispatch]) {
    println!(
        "{:<36}  {:<12}  {:<20}  {:<11}  {:>3}  {:>7}  RESULT",
        "ID", "AGENT", "THREAD", "STATUS", "PRI", "ATTEMPT"
    );
    for d in rows {
        let result = match (&d.result, &d.last_error) {
            (Some(r), _) if r.error.is_none() => printable(&r.output),
            (Some(r), _) => text(r.error.as_deref().unwrap_or_default()).into_owned(),
            (None, Some(e)) => text(e).into_owned(),
            (None, None) => String::new(),
        };
        let result: String = result.chars().take(60).collect();
        println!(
            "{:<36}  {:<12}  {:<20}  {:<11}  {:>3}  {:>3}/{:<3}  {}",
            text(&d.id),
            text(&d.agent),
            text(&d.thread),
            d.status,
            d.priority,
            d.attempt,
            d.max_attempts,
            result
        );
    }
}

fn print_waitpoint(w: &Waitpoint) {
    println!("id:           {}", text(&w.id));
    println!("name:         {}", text(&w.name));
    println!("state:        {}", w.state);
    println!("dispatch:     {}", text(&w.dispatch));
    println!("thread:       {}", text(&w.thread));
    println!("agent:        {}", text(&w.agent));
    for (k, v) in &w.metadata {
        println!("meta:         {}={}", text(k), text(v));
    }
    println!("created at:   {} (claim {})", w.created_at, w.created_claim);
    println!("times out at: {}", w.timeout_at);
    if let Some(at) = w.settled_at {
        let by = w.settled_by.as_deref().unwrap_or("-");
        println!("settled at:   {at} by {}", text(by));
    }
    if let Some(result) = &w.result {
        println!("result:       {}", printable(result));
    }
}

fn print_dispatch(d: &Dispatch) {
    println!("id:           {}", text(&d.id));
    println!("agent:        {}", text(&d.agent));
    println!("thread:       {}", text(&d.thread));
    println!("run id:       {}", text(&d.run_id));
    println!("status:       {}", d.status);
    println!("priority:     {}", d.priority);
    println!("attempt:      {}/{}", d.attempt, d.max_attempts);
    println!("claims:       {} (resumes {})", d.claims, d.resumes);
    if let Some(u) = &d.usage {
        println!(
            "tokens:       {} in ({} cached), {} out, {} model calls",
            u.input_tokens, u.cached_tokens, u.output_tokens, u.calls
        );
    }
    println!("epoch:        {}", d.epoch);
    println!("payload:      {}", printable(&d.payload));
    for (k, v) in &d.metadata {
        println!("meta:         {}={}", text(k), text(v));
    }
    if let Some(key) = &d.dedupe_key {
        println!("dedupe key:   {}", text(key));
    }
    if let Some(key) = &d.concurrency_key {
        println!("concurrency key: {}", text(key));
    }
    if let Some(w) = &d.window {
        let state = crate::store::rules::window::state(d);
        println!(
            "window:       {} ({state}, {}): {} of at most {}, quiet {} ms, max wait {} ms, first at {}, last at {}",
            text(&w.key),
            w.payload.as_str(),
            w.count,
            w.max_items,
            w.quiet_ms,
            w.max_wait_ms,
            w.first_at,
            w.last_at
        );
        for (n, item) in w.items.iter().enumerate() {
            println!("item {:<8} {}", n + 1, printable(&item.payload));
        }
    }
    for v in &d.versions {
        match &v.label {
            Some(label) => println!(
                "claim {:<7} ran version {} ({})",
                v.claim,
                v.version,
                text(label)
            ),
            None => println!("claim {:<7} ran version {}", v.claim, v.version),
        }
    }
    if let Some(claim) = &d.claim {
        println!(
            "claimed by:   {} (lease until {})",
            text(&claim.claimed_by),
            claim.lease_until
        );
    }
    if let Some(result) = &d.result {
        println!(
            "result:       {:?} {}",
            result.status,
            printable(&result.output)
        );
        if let Some(error) = &result.error {
            println!("result error: {}", text(error));
        }
    }
    if let Some(error) = &d.last_error {
        println!("last error:   {}", text(error));
    }
    println!("created at:   {}", d.created_at);
    if let Some(at) = d.completed_at {
        println!("completed at: {at}");
    }
}
