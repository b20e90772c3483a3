//! `homing schedule ...`: list, show, create, pause, resume, trigger, backfill and delete
//! schedules (docs/contract.md section 16). A schedule created here is kept until deleted; one
//! of the config's `[schedules]` is made by `homing run` and follows the file.

use std::path::PathBuf;

use clap::Subcommand;

use super::exit::{Exit, coded};
use crate::config::Config;
use crate::config::schedules::ScheduleConfig;
use crate::store::Store;
use crate::store::model::schedules::{Overlap, Source};
use crate::store::rules::WALK_PAGE_BYTES;
use crate::store::rules::schedules::fire_label;
use crate::work::schedules::{self as sched, ScheduleError, ScheduleView};

/// `homing schedule ...`.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Lists the schedules, their next fire and whether each is paused.
    List {
        /// JSON output (one array).
        #[arg(long)]
        json: bool,
    },
    /// Shows a schedule: its times, its next five fires (UTC and its zone), what waits in
    /// its buffer, and its last outcomes (fired and skipped slots, with the reason).
    Show {
        /// The schedule.
        name: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Creates a schedule, kept until deleted. Takes the keys of a `[schedules.NAME]` table
    /// as a TOML file (`--from`), or the common ones as flags.
    Create {
        /// The schedule's name (letters, digits, `-`, `_`, `.`).
        name: String,
        /// A TOML file holding the keys of one `[schedules.NAME]` table (without the header).
        #[arg(long, conflicts_with_all = ["agent", "cron", "every", "at"])]
        from: Option<PathBuf>,
        /// The agent (a plugin of the config).
        #[arg(long)]
        agent: Option<String>,
        /// A cron expression (5 or 6 fields, or `@daily`...).
        #[arg(long)]
        cron: Option<String>,
        /// An interval (`15m`).
        #[arg(long)]
        every: Option<String>,
        /// One fire at this RFC 3339 time.
        #[arg(long)]
        at: Option<String>,
        /// The IANA zone the cron is read in.
        #[arg(long)]
        timezone: Option<String>,
        /// The payload, as text.
        #[arg(long)]
        payload: Option<String>,
        /// The thread (default: the schedule's name), or `per-fire`.
        #[arg(long)]
        thread: Option<String>,
        /// `skip`, `buffer_one`, `buffer_all`, `cancel_other` or `allow`.
        #[arg(long)]
        overlap: Option<String>,
        /// A delay of each fire in `[0, jitter)`.
        #[arg(long)]
        jitter: Option<String>,
    },
    /// Pauses a schedule: no slot fires until it is resumed.
    Pause {
        /// The schedule.
        name: String,
        /// Why (shown with the pause; at most 1 KiB).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Resumes a paused schedule from now (the slots it missed are recorded as skipped).
    Resume {
        /// The schedule.
        name: String,
        /// Let the catch-up policy fire the slots missed while paused.
        #[arg(long)]
        catch_up: bool,
    },
    /// Fires a schedule now, whatever its times; prints the dispatch's id.
    Trigger {
        /// The schedule.
        name: String,
        /// The overlap policy for this fire (default: the schedule's): `skip`, `buffer_one`,
        /// `buffer_all`, `cancel_other` or `allow`.
        #[arg(long)]
        overlap: Option<String>,
    },
    /// Places the slots of a span, oldest first, under the overlap policy (a slot that fired
    /// keeps its dispatch); prints each slot's outcome.
    Backfill {
        /// The schedule.
        name: String,
        /// The overlap policy for these slots (default: the schedule's); `allow` fires them
        /// all.
        #[arg(long)]
        overlap: Option<String>,
        /// From this RFC 3339 time.
        #[arg(long)]
        from: String,
        /// Through this RFC 3339 time.
        #[arg(long)]
        to: String,
    },
    /// Deletes a schedule; its dispatches stay.
    Delete {
        /// The schedule.
        name: String,
    },
}

/// A refused operation with its exit code: 3 for an unknown schedule, 2 for bad input.
fn refused(e: ScheduleError) -> anyhow::Error {
    match e {
        ScheduleError::NotFound(_) => coded(Exit::NotFound, e.to_string()),
        ScheduleError::Invalid(_) | ScheduleError::Exists(_) => coded(Exit::Invalid, e.to_string()),
        ScheduleError::Store(e) => e.into(),
    }
}

fn text(s: &str) -> std::borrow::Cow<'_, str> {
    crate::runtime::host::escape_log_text(s)
}

/// The table of `homing schedule create`'s flags, as `[schedules.NAME]` would hold it.
#[allow(clippy::too_many_arguments)]
fn table_of_flags(
    agent: Option<String>,
    cron: Option<String>,
    every: Option<String>,
    at: Option<String>,
    timezone: Option<String>,
    payload: Option<String>,
    thread: Option<String>,
    overlap: Option<String>,
    jitter: Option<String>,
) -> toml::Table {
    let mut t = toml::Table::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            t.insert(k.to_owned(), toml::Value::String(v));
        }
    };
    put("agent", agent);
    put("cron", cron);
    put("every", every);
    put("at", at);
    put("timezone", timezone);
    put("payload", payload);
    put("thread", thread);
    put("overlap", overlap);
    put("jitter", jitter);
    t
}

pub(super) async fn run(
    config: &Config,
    store: &Store,
    command: ScheduleCommand,
) -> anyhow::Result<()> {
    match command {
        ScheduleCommand::List { json } => {
            let mut all = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let page = store
                    .schedules
                    .schedules(after.as_deref(), 100, Some(WALK_PAGE_BYTES))
                    .await?;
                let Some(last) = page.last() else { break };
                after = Some(last.schedule.def.name.clone());
                let now = store.now();
                all.extend(page.into_iter().map(|s| sched::view(s, now)));
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if all.is_empty() {
                println!("no schedules");
            } else {
                println!(
                    "{:<24} {:<16} {:<8} {:<8} NEXT (UTC)",
                    "NAME", "AGENT", "SOURCE", "STATE"
                );
                for v in &all {
                    let s = &v.schedule;
                    println!(
                        "{:<24} {:<16} {:<8} {:<8} {}",
                        text(&s.def.name),
                        text(&s.def.agent),
                        s.source.as_str(),
                        if s.paused.is_some() {
                            "paused"
                        } else {
                            "active"
                        },
                        v.next.first().map_or("-", |n| n.utc.as_str())
                    );
                }
            }
        }
        ScheduleCommand::Show { name, json } => {
            let v = sched::show(store, &name).await.map_err(refused)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_view(&v);
            }
        }
        ScheduleCommand::Create {
            name,
            from,
            agent,
            cron,
            every,
            at,
            timezone,
            payload,
            thread,
            overlap,
            jitter,
        } => {
            let table = match &from {
                Some(path) => {
                    let bytes = crate::input::read_file_capped(
                        path,
                        crate::input::MAX_CONFIG_SIZE,
                        "the schedule file",
                        "the config size limit",
                    )?;
                    let text = String::from_utf8(bytes).map_err(|_| {
                        coded(Exit::Invalid, format!("{}: not UTF-8", path.display()))
                    })?;
                    toml::from_str::<toml::Table>(&text)
                        .map_err(|e| coded(Exit::Invalid, format!("{}: {e}", path.display())))?
                }
                None => table_of_flags(
                    agent, cron, every, at, timezone, payload, thread, overlap, jitter,
                ),
            };
            let c: ScheduleConfig = toml::Value::Table(table)
                .try_into()
                .map_err(|e| coded(Exit::Invalid, format!("schedule `{name}`: {e}")))?;
            let base = from
                .as_deref()
                .and_then(|p| p.parent())
                .map(std::path::Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            let def = check_table(config, &name, &c, &base)?;
            let v = sched::create(store, def, Source::Api)
                .await
                .map_err(refused)?;
            println!("created schedule {}", text(&v.schedule.def.name));
            let v = sched::view(v, store.now());
            if let Some(next) = v.next.first() {
                println!("next fire: {} ({})", next.utc, text(&next.local));
            }
        }
        ScheduleCommand::Pause { name, reason } => {
            sched::pause(store, &name, &reason).await.map_err(refused)?;
            println!("paused schedule {}", text(&name));
        }
        ScheduleCommand::Resume { name, catch_up } => {
            sched::resume(store, &name, catch_up)
                .await
                .map_err(refused)?;
            println!("resumed schedule {}", text(&name));
        }
        ScheduleCommand::Trigger { name, overlap } => {
            let overlap = overlap_arg(overlap.as_deref())?;
            let m = sched::trigger(store, &name, overlap)
                .await
                .map_err(refused)?;
            match (&m.id, &m.live) {
                (Some(id), _) => println!("{}", text(id)),
                (None, live) if m.outcome == "buffered" => eprintln!(
                    "buffered: fires when dispatch {} ends",
                    text(live.as_deref().unwrap_or("?"))
                ),
                (None, live) => {
                    return Err(coded(
                        Exit::Failure,
                        format!(
                            "not fired ({}): dispatch {} of the schedule is still live; --overlap allow fires anyway",
                            m.outcome,
                            text(live.as_deref().unwrap_or("?"))
                        ),
                    ));
                }
            }
        }
        ScheduleCommand::Backfill {
            name,
            overlap,
            from,
            to,
        } => {
            let overlap = overlap_arg(overlap.as_deref())?;
            let from = sched::parse_time(&from)
                .map_err(|e| coded(Exit::Invalid, format!("--from: {e}")))?;
            let to =
                sched::parse_time(&to).map_err(|e| coded(Exit::Invalid, format!("--to: {e}")))?;
            let slots = sched::backfill(store, &name, from, to, overlap)
                .await
                .map_err(refused)?;
            let fired = slots.iter().filter(|m| m.id.is_some()).count();
            for m in &slots {
                let what = m.id.as_deref().or(m.live.as_deref()).unwrap_or("");
                println!("{} {} {}", fire_label(m.fire), m.outcome, text(what));
            }
            eprintln!(
                "{fired} of {} slot(s) fired (a slot that had fired keeps its dispatch)",
                slots.len()
            );
        }
        ScheduleCommand::Delete { name } => {
            if sched::delete(store, &name).await.map_err(refused)? {
                println!("deleted schedule {}", text(&name));
            } else {
                return Err(coded(Exit::NotFound, format!("no schedule `{name}`")));
            }
        }
    }
    Ok(())
}

/// An `--overlap` flag.
fn overlap_arg(arg: Option<&str>) -> anyhow::Result<Option<Overlap>> {
    arg.map(str::parse::<Overlap>)
        .transpose()
        .map_err(|e| coded(Exit::Invalid, format!("--overlap: {e}")))
}

/// The declaration of a table given on the command line, checked as the config's are (the
/// agent a plugin of the config, the payload within `max_payload`); the rules check its times
/// when it is created.
fn check_table(
    config: &Config,
    name: &str,
    c: &ScheduleConfig,
    base: &std::path::Path,
) -> anyhow::Result<crate::store::model::schedules::ScheduleDef> {
    let bad =
        |key: &str, why: &str| coded(Exit::Invalid, format!("schedule `{name}`: {key}: {why}"));
    if !config.plugins.contains_key(&c.agent) {
        return Err(bad(
            "agent",
            &format!(
                "`{}` is not a plugin of {}",
                c.agent.escape_debug(),
                config.source
            ),
        ));
    }
    let payload = c
        .payload_bytes(base, config.host.max_payload)
        .map_err(|(key, why)| bad(&key, &why))?;
    sched::def_of(name, c, payload).map_err(|(key, why)| bad(&key, &why))
}

fn print_view(v: &ScheduleView) {
    use crate::store::model::schedules::Spec;
    use crate::store::rules::schedules::fire_label;
    let s = &v.schedule;
    println!("schedule:     {}", text(&s.def.name));
    println!("agent:        {}", text(&s.def.agent));
    println!("source:       {}", s.source.as_str());
    match &s.def.spec {
        Spec::Cron(c) => println!("cron:         {} ({})", text(c), text(&s.def.timezone)),
        Spec::Every {
            every_ms,
            anchor_ms,
        } => {
            println!(
                "every:        {every_ms} ms from {}",
                fire_label(*anchor_ms)
            );
        }
        Spec::At(at) => println!("at:           {}", fire_label(*at)),
    }
    match &s.paused {
        Some(p) if p.reason.is_empty() => println!("paused:       yes"),
        Some(p) => println!("paused:       yes: {}", text(&p.reason)),
        None => println!("paused:       no"),
    }
    println!("handled to:   {}", fire_label(s.watermark));
    for n in &v.next {
        println!("next:         {}  {}", n.utc, text(&n.local));
    }
    for b in &s.buffered {
        println!("buffered:     {}", fire_label(*b));
    }
    for o in s.outcomes.iter().rev() {
        let what = match (&o.dispatch, o.skipped) {
            (Some(d), _) => format!("fired {} ({})", text(d), o.kind.map_or("", |k| k.as_str())),
            (None, Some(r)) if o.slots > 1 => format!(
                "skipped {} slots through {}: {r}",
                o.slots,
                fire_label(o.through.unwrap_or(o.fire))
            ),
            (None, Some(r)) => format!("skipped: {r}"),
            (None, None) => String::new(),
        };
        println!("outcome:      {}  {what}", fire_label(o.fire));
    }
}
