//! The rules of schedules (the contract, section 16), pure and shared by both backends and the
//! host: which fire times a schedule has (a cron read in its zone with its daylight-saving
//! policy, an interval of absolute time, one instant), what a declaration must be, the due time
//! of a fire (its jitter), the ids of its dispatches and ticks, and what a tick makes of the
//! slots since the watermark (catch-up) and of a live last dispatch (overlap).
//!
//! Cron expressions are parsed and matched here rather than by a cron crate: the policies for
//! wall times that do not exist or happen twice (`dst`) need each match as a civil time before
//! it becomes an instant, which the crates do not expose. The zones and their transitions are
//! `jiff`'s.

use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};
use sha2::{Digest, Sha256};

use crate::store::model::schedules::{
    CatchupPolicy, Dst, Fold, Gap, MAX_BUFFERED, Outcome, Overlap, ScheduleDef, SkipReason, Spec,
    ThreadChoice,
};
use crate::store::model::{check_metadata, check_name};

/// The longest a schedule's name may be.
pub const MAX_SCHEDULE_NAME: usize = 64;
/// The shortest interval of `every`.
pub const MIN_EVERY_MS: u64 = 1_000;
/// How far ahead a cron is searched for its next fire: past eight years, a cron has none (a
/// 29 February falls in every eight years but around a century's end).
const HORIZON_DAYS: u32 = 8 * 366 + 2;
/// The fires compared to check a jitter against the spacing of a cron.
const JITTER_SAMPLE: usize = 64;

/// One field of a cron: the values it matches, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    bits: u64,
    /// Written as `*` (or `?`): it matches every value, which matters for the days (a day
    /// matches the day of month *or* the day of week only when both are restricted).
    star: bool,
    /// Written as `*` or with a step: for the hour field, it matches every occurrence of a
    /// repeated wall time.
    every: bool,
}

impl Field {
    fn has(&self, v: u32) -> bool {
        v < 64 && self.bits & (1 << v) != 0
    }

    fn values(&self, lo: u32, hi: u32) -> impl Iterator<Item = u32> + '_ {
        (lo..=hi).filter(|v| self.has(*v))
    }
}

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    seconds: Field,
    minutes: Field,
    hours: Field,
    days: Field,
    months: Field,
    weekdays: Field,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Cron {
    /// Parses five fields (minute, hour, day of month, month, day of week), six (seconds
    /// first) or a shorthand: `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily`
    /// (`@midnight`), `@hourly`. Fields take `*`, values, ranges `a-b`, steps `*/n`, `a-b/n`
    /// and `a/n`, and lists; months and days of week take names (`JAN`, `MON`); Sunday is 0 or
    /// 7.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the field.
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let expanded = match expr.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(format!(
                    "unknown shorthand `{}` (expected @yearly, @annually, @monthly, @weekly, \
                     @daily, @midnight or @hourly)",
                    other.escape_debug()
                ));
            }
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(format!(
                    "{n} fields; a cron has 5 (minute hour day month weekday) or 6 (seconds first)"
                ));
            }
        };
        let weekdays = field("day of week", rest[4], 0, 7, &WEEKDAYS)?;
        // Sunday is 0 or 7.
        let weekdays = Field {
            bits: (weekdays.bits | (weekdays.bits >> 7)) & 0x7f,
            ..weekdays
        };
        Ok(Cron {
            seconds: field("second", seconds, 0, 59, &[])?,
            minutes: field("minute", rest[0], 0, 59, &[])?,
            hours: field("hour", rest[1], 0, 23, &[])?,
            days: field("day of month", rest[2], 1, 31, &[])?,
            months: field("month", rest[3], 1, 12, &MONTHS)?,
            weekdays,
        })
    }

    /// Whether `date` is one of its days: the month matches, and the day of month and the day
    /// of week both match, or either when both are restricted (the usual cron rule).
    fn has_day(&self, date: Date) -> bool {
        let month = u32::try_from(date.month()).unwrap_or(0);
        if !self.months.has(month) {
            return false;
        }
        let dom = self.days.has(u32::try_from(date.day()).unwrap_or(0));
        let dow = self.weekdays.has(u32::from(
            date.weekday().to_sunday_zero_offset().unsigned_abs(),
        ));
        if self.days.star || self.weekdays.star {
            dom && dow
        } else {
            dom || dow
        }
    }
}

/// Parses one cron field over `lo..=hi`, with `names` for `lo + i` (months start at 1, days of
/// week at 0).
fn field(what: &str, text: &str, lo: u32, hi: u32, names: &[&str]) -> Result<Field, String> {
    let bad = |why: String| format!("the {what} field `{}`: {why}", text.escape_debug());
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(lo + u32::try_from(i).unwrap_or(0));
        }
        let v: u32 = s
            .parse()
            .map_err(|_| bad(format!("`{}` is not a number", s.escape_debug())))?;
        if v < lo || v > hi {
            return Err(bad(format!("{v} is out of {lo}-{hi}")));
        }
        Ok(v)
    };
    let mut out = Field {
        bits: 0,
        star: false,
        every: false,
    };
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    bad(format!(
                        "the step `{}` is not a positive number",
                        step.escape_debug()
                    ))
                })?;
                (range, Some(step))
            }
            None => (item, None),
        };
        let (a, b) = if range == "*" || range == "?" {
            if step.is_none() && text.split(',').count() == 1 {
                out.star = true;
            }
            out.every = true;
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(bad(format!("the range {a}-{b} runs backwards")));
            }
            (a, b)
        } else if range.is_empty() {
            return Err(bad("an empty item".into()));
        } else {
            let a = value(range)?;
            // `a/n` runs from `a` to the end.
            (a, if step.is_some() { hi } else { a })
        };
        if step.is_some() {
            out.every = true;
        }
        let step = step.unwrap_or(1);
        let mut v = a;
        while v <= b {
            out.bits |= 1 << v;
            v = v.saturating_add(step);
        }
    }
    Ok(out)
}

/// A schedule's fire times, ready to be computed.
#[derive(Debug, Clone)]
pub struct Plan {
    when: When,
    tz: TimeZone,
    dst: Dst,
    start: Option<u64>,
    end: Option<u64>,
}

#[derive(Debug, Clone)]
enum When {
    Cron(Box<Cron>),
    Every { every: u64, anchor: u64 },
    At(u64),
}

/// The fire times in a span: those that fire, and the wall times a `dst.gap = skip` left out
/// (as the first instant after their gap).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fires {
    /// Fire times, ascending.
    pub fires: Vec<u64>,
    /// Skipped for a gap, ascending.
    pub gaps: Vec<u64>,
}

/// The zone named `name` (IANA, or `UTC`).
///
/// # Errors
///
/// The zone is unknown.
pub fn zone(name: &str) -> Result<TimeZone, String> {
    TimeZone::get(name).map_err(|_| {
        format!(
            "unknown time zone `{}` (expected an IANA name such as UTC or Europe/Paris)",
            name.escape_debug()
        )
    })
}

impl Plan {
    /// The plan of `def`'s fire times.
    ///
    /// # Errors
    ///
    /// The cron, the interval or the zone is malformed, naming the field.
    pub fn of(def: &ScheduleDef) -> Result<Plan, String> {
        let tz = zone(&def.timezone).map_err(|e| format!("timezone: {e}"))?;
        let when = match &def.spec {
            Spec::Cron(expr) => When::Cron(Box::new(
                Cron::parse(expr).map_err(|e| format!("cron: `{}`: {e}", expr.escape_debug()))?,
            )),
            Spec::Every {
                every_ms,
                anchor_ms,
            } => {
                if *every_ms < MIN_EVERY_MS {
                    return Err(format!(
                        "every: {every_ms} ms is shorter than the shortest interval, {MIN_EVERY_MS} ms"
                    ));
                }
                When::Every {
                    every: *every_ms,
                    anchor: *anchor_ms,
                }
            }
            Spec::At(at) => When::At(*at),
        };
        Ok(Plan {
            when,
            tz,
            dst: def.dst,
            start: def.start_at,
            end: def.end_at,
        })
    }

    /// The fire times in `(after, until]`, at most `limit` of them (the earliest), with the
    /// gap-skipped ones of the same span.
    pub fn fires(&self, after: u64, until: u64, limit: usize) -> Fires {
        let mut out = Fires::default();
        let until = self.end.map_or(until, |end| until.min(end));
        let after = match self.start {
            // Fire times from `start` on: those after `start - 1`.
            Some(start) => after.max(start.saturating_sub(1)),
            None => after,
        };
        if until <= after || limit == 0 {
            return out;
        }
        match &self.when {
            When::At(at) => {
                if *at > after && *at <= until {
                    out.fires.push(*at);
                }
            }
            When::Every { every, anchor } => {
                let (every, anchor) = (i128::from(*every), i128::from(*anchor));
                let k = (i128::from(after) - anchor).div_euclid(every) + 1;
                let mut t = anchor + k * every;
                while t <= i128::from(until) && out.fires.len() < limit {
                    match u64::try_from(t) {
                        Ok(v) => out.fires.push(v),
                        Err(_) => break,
                    }
                    t += every;
                }
            }
            When::Cron(cron) => self.cron_fires(cron, after, until, limit, &mut out),
        }
        out
    }

    /// The first fire time after `after`, if there is one.
    pub fn next(&self, after: u64) -> Option<u64> {
        self.fires(after, u64::MAX, 1).fires.first().copied()
    }

    /// The first `n` fire times after `after`.
    pub fn upcoming(&self, after: u64, n: usize) -> Vec<u64> {
        self.fires(after, u64::MAX, n).fires
    }

    fn cron_fires(&self, cron: &Cron, after: u64, until: u64, limit: usize, out: &mut Fires) {
        let Some(start) = millis(after).map(|ts| self.tz.to_datetime(ts)) else {
            return;
        };
        // From the day before, for a fold that reaches back across midnight.
        let mut day = start.date().yesterday().unwrap_or(start.date());
        for _ in 0..HORIZON_DAYS {
            if cron.has_day(day) {
                let mut fires = Vec::new();
                let mut gaps = Vec::new();
                // Hour by hour, stopping one hour after the limit is reached: the instants of a
                // repeated wall time interleave with those of the hour after it at most.
                let mut reached = None;
                for h in cron.hours.values(0, 23) {
                    if reached.is_some_and(|r| h > r + 1) {
                        break;
                    }
                    for m in cron.minutes.values(0, 59) {
                        for s in cron.seconds.values(0, 59) {
                            let (Ok(h), Ok(m), Ok(s)) =
                                (i8::try_from(h), i8::try_from(m), i8::try_from(s))
                            else {
                                continue;
                            };
                            self.resolve(cron, day.at(h, m, s, 0), &mut fires, &mut gaps);
                        }
                    }
                    if reached.is_none()
                        && fires.iter().filter(|t| **t > after).count() + out.fires.len() >= limit
                    {
                        reached = Some(h);
                    }
                }
                fires.sort_unstable();
                fires.dedup();
                gaps.sort_unstable();
                gaps.dedup();
                for t in fires.into_iter().filter(|t| *t > after && *t <= until) {
                    if out.fires.len() < limit && out.fires.last().is_none_or(|l| *l < t) {
                        out.fires.push(t);
                    }
                }
                // Past the limit, only the gaps before the last fire belong to the span.
                let last = (out.fires.len() >= limit).then(|| out.fires.last().copied());
                out.gaps.extend(gaps.into_iter().filter(|t| {
                    *t > after && *t <= until && last.flatten().is_none_or(|l| *t < l)
                }));
                if out.fires.len() >= limit {
                    return;
                }
            }
            // Past `until`: the whole day is later.
            let Ok(next) = day.tomorrow() else { return };
            day = next;
            let Ok(midnight) = day.at(0, 0, 0, 0).to_zoned(self.tz.clone()) else {
                continue;
            };
            if u64::try_from(midnight.timestamp().as_millisecond())
                .is_ok_and(|t| t > until.saturating_add(86_400_000))
            {
                return;
            }
        }
    }

    /// The instants of wall time `dt` under the daylight-saving policy: one, none (a gap
    /// skipped, reported in `gaps`) or two (a fold, with `both` or a `*`/step hour).
    fn resolve(&self, cron: &Cron, dt: DateTime, fires: &mut Vec<u64>, gaps: &mut Vec<u64>) {
        let at = |offset: Offset| offset.to_timestamp(dt).ok().and_then(to_millis);
        match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => fires.extend(at(offset)),
            AmbiguousOffset::Gap { before, after } => {
                // `dt` read with the offset after the gap is an instant before it; the gap ends
                // at the first instant whose offset is `after`.
                let end = at(after).and_then(|lo| self.gap_end(lo, at(before)?, after));
                match self.dst.gap {
                    Gap::Shift => fires.extend(end),
                    Gap::Skip => gaps.extend(end),
                }
            }
            AmbiguousOffset::Fold { before, after } => {
                let fold = if cron.hours.every {
                    Fold::Both
                } else {
                    self.dst.fold
                };
                if matches!(fold, Fold::First | Fold::Both) {
                    fires.extend(at(before));
                }
                if matches!(fold, Fold::Last | Fold::Both) {
                    fires.extend(at(after));
                }
            }
        }
    }

    /// The first instant in `(lo, hi]` whose offset is `after` (a gap's end), to the second.
    fn gap_end(&self, lo: u64, hi: u64, after: Offset) -> Option<u64> {
        let (mut lo, mut hi) = (lo / 1000, hi.div_ceil(1000));
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            let offset = self.tz.to_offset(millis(mid * 1000)?);
            if offset == after {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi * 1000)
    }
}

fn millis(ms: u64) -> Option<Timestamp> {
    Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok()
}

fn to_millis(ts: Timestamp) -> Option<u64> {
    u64::try_from(ts.as_millisecond()).ok()
}

/// A fire time as the ids and metadata show it: RFC 3339 in UTC, to the second
/// (`2026-12-07T09:30:00Z`), with milliseconds when it has some.
pub fn fire_label(fire: u64) -> String {
    match millis(fire) {
        Some(ts) if fire.is_multiple_of(1000) => ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Some(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => fire.to_string(),
    }
}

/// A fire time in a zone, for people (`2026-12-07 10:30:00 CET`).
pub fn local_label(fire: u64, tz: &TimeZone) -> String {
    match millis(fire) {
        Some(ts) => ts
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        None => fire.to_string(),
    }
}

/// The id of the dispatch that fire `fire` of schedule `name` enqueues: the same whichever
/// host fires it, so a slot fires once.
pub fn dispatch_id(name: &str, fire: u64) -> String {
    format!("sched:{name}:{}", fire_label(fire))
}

/// The id of tick number `n` of schedule `name`, due at `due` (the number makes it unique:
/// two ticks may be due at one time, one of them stale).
pub fn tick_id(name: &str, n: u64, due: u64) -> String {
    format!("sched:{name}:tick:{n}:{}", fire_label(due))
}

/// The thread of schedule `name`'s ticks: one per schedule, so its ticks run one at a time.
pub fn tick_thread(name: &str) -> String {
    format!("homing.schedule/{name}")
}

/// The thread of fire `fire`'s dispatch.
pub fn fire_thread(def: &ScheduleDef, fire: u64) -> String {
    match &def.thread {
        ThreadChoice::Fixed(thread) => thread.clone(),
        ThreadChoice::PerFire => format!("{}/{}", def.name, fire_label(fire)),
    }
}

/// The metadata keys a fire's dispatch carries besides the schedule's own.
pub const META_SCHEDULE: &str = "schedule";
/// The fire time it is for (RFC 3339, UTC).
pub const META_SCHEDULED_FOR: &str = "scheduled-for";
/// How it fired (`on-time`, `catch-up`, `buffered`, `backfill`, `manual`).
pub const META_FIRE: &str = "fire";

/// When fire `fire` of schedule `name` is due: its time plus its jitter, a delay in
/// `[0, jitter_ms)` derived from the name and the fire time (the same on every host), kept
/// before `next` (the fire after it) when there is one.
pub fn due(name: &str, fire: u64, jitter_ms: u64, next: Option<u64>) -> u64 {
    if jitter_ms == 0 {
        return fire;
    }
    let digest = Sha256::digest(format!("{name}\u{0}{fire}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let mut delay = u64::from_be_bytes(first) % jitter_ms;
    if let Some(next) = next {
        delay = delay.min(next.saturating_sub(fire).saturating_sub(1));
    }
    fire.saturating_add(delay)
}

/// Checks a declaration (the contract, section 16.1) at `now`: its name, agent, zone, times,
/// metadata and policies. Whether the agent exists and the payload's size are the host's.
///
/// # Errors
///
/// What is wrong, naming the field.
pub fn check(def: &ScheduleDef, now: u64) -> Result<Plan, String> {
    check_schedule_name(&def.name)?;
    check_name("agent", &def.agent)?;
    check_metadata(&def.metadata, 16 * 1024)?;
    if let ThreadChoice::Fixed(thread) = &def.thread {
        check_name("thread", thread)?;
    }
    let plan = Plan::of(def)?;
    if let (Some(start), Some(end)) = (def.start_at, def.end_at)
        && end < start
    {
        return Err(format!(
            "end_at: {} is before start_at {}",
            fire_label(end),
            fire_label(start)
        ));
    }
    if def.overlap == Overlap::Allow && def.thread != ThreadChoice::PerFire {
        return Err(
            "overlap: `allow` needs a thread per fire (thread = \"per-fire\"); one thread runs \
             one dispatch at a time"
                .into(),
        );
    }
    if def.max_buffered == 0 || def.max_buffered > MAX_BUFFERED {
        return Err(format!(
            "max_buffered: {} is out of 1-{MAX_BUFFERED}",
            def.max_buffered
        ));
    }
    if def.catchup.policy == CatchupPolicy::All && (def.catchup.max == 0 || def.catchup.max > 1_000)
    {
        return Err(format!("catchup.max: {} is out of 1-1000", def.catchup.max));
    }
    let upcoming = plan.upcoming(now, JITTER_SAMPLE);
    let Some(first) = upcoming.first() else {
        return Err(match def.spec {
            Spec::At(at) => format!(
                "at: {} has passed: the schedule would never fire",
                fire_label(at)
            ),
            _ => "the schedule has no fire time after now (its cron matches no date, or end_at \
                  has passed)"
                .into(),
        });
    };
    if def.jitter_ms > 0 {
        let spacing = upcoming.windows(2).map(|w| w[1] - w[0]).min();
        if let Some(spacing) = spacing
            && def.jitter_ms >= spacing
        {
            return Err(format!(
                "jitter: {} ms is not shorter than the {spacing} ms between two fires (from {})",
                def.jitter_ms,
                fire_label(*first)
            ));
        }
    }
    Ok(plan)
}

/// Checks a schedule's name: 1 to [`MAX_SCHEDULE_NAME`] bytes of ASCII letters, digits, `-`,
/// `_` and `.`, not starting with `.` (it is part of ids, threads and paths).
///
/// # Errors
///
/// What is wrong.
pub fn check_schedule_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME {
        return Err(format!(
            "name: `{}` must be 1 to {MAX_SCHEDULE_NAME} bytes",
            name.escape_debug()
        ));
    }
    if name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "name: `{}` may hold only ASCII letters, digits, `-`, `_` and `.`, and not start with `.`",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// What a tick does with the slots due since the watermark, before overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// The slots to fire, oldest first, with whether each is late (a catch-up) or on time.
    pub fire: Vec<(u64, bool)>,
    /// Outcomes of the slots that do not fire (runs of one reason folded into one).
    pub skipped: Vec<Outcome>,
}

/// A slot as a tick sees it: its fire time and its due time.
type Slot = (u64, u64);

/// How late a slot may fire and still count as on time: a tick runs a little after its due
/// time, never exactly at it.
pub const ON_TIME_MS: u64 = 60_000;

/// The verdict on the slots `due` (fire times past the watermark whose due time has come,
/// ascending) and the gap-skipped wall times `gaps` at `now`: which fire under the catch-up
/// policy and which are recorded as skipped, and why. A slot due within [`ON_TIME_MS`] is on
/// time and always fires; an older one is missed, and fires only within the window and as the
/// policy says (`latest`: the newest missed one; `all`: up to `max`, the newest ones).
pub fn catch_up(def: &ScheduleDef, due: &[(u64, u64)], gaps: &[u64], now: u64) -> CatchUp {
    let mut out = CatchUp::default();
    let mut skips: Vec<(u64, SkipReason)> = gaps.iter().map(|g| (*g, SkipReason::DstGap)).collect();
    let window = def.catchup.window_ms;
    let (on_time, missed): (Vec<&Slot>, Vec<&Slot>) = due
        .iter()
        .partition(|(_, d)| now.saturating_sub(*d) <= ON_TIME_MS);
    let (inside, outside): (Vec<&Slot>, Vec<&Slot>) = missed
        .into_iter()
        .partition(|(_, d)| now.saturating_sub(*d) <= window);
    skips.extend(outside.iter().map(|(f, _)| (*f, SkipReason::MissedWindow)));
    let keep = match def.catchup.policy {
        CatchupPolicy::None => 0,
        CatchupPolicy::Latest => usize::from(!inside.is_empty() && on_time.is_empty()),
        CatchupPolicy::All => usize::try_from(def.catchup.max).unwrap_or(usize::MAX),
    };
    let cut = inside.len().saturating_sub(keep);
    let reason = match def.catchup.policy {
        CatchupPolicy::None => SkipReason::MissedWindow,
        _ => SkipReason::Coalesced,
    };
    skips.extend(inside[..cut].iter().map(|(f, _)| (*f, reason)));
    out.fire
        .extend(inside[cut..].iter().map(|(f, _)| (*f, true)));
    out.fire.extend(on_time.iter().map(|(f, _)| (*f, false)));
    skips.sort_unstable_by_key(|(f, _)| *f);
    out.skipped = fold_skips(&skips, now);
    out
}

/// Runs of slots skipped for the same reason, one outcome each.
pub fn fold_skips(skips: &[(u64, SkipReason)], now: u64) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = Vec::new();
    for (fire, reason) in skips {
        match out.last_mut() {
            Some(last) if last.skipped == Some(*reason) => {
                last.through = Some(*fire);
                last.slots += 1;
            }
            _ => out.push(Outcome {
                fire: *fire,
                through: None,
                slots: 1,
                at: now,
                dispatch: None,
                kind: None,
                skipped: Some(*reason),
            }),
        }
    }
    out
}

/// What overlap makes of a slot that is to fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlapped {
    /// It fires.
    Fire,
    /// It fires after the last dispatch's thread is interrupted.
    InterruptThenFire,
    /// It waits in the buffer.
    Buffer,
    /// It is skipped, for this reason.
    Skip(SkipReason),
}

/// The verdict of `def`'s overlap policy on one slot, while its last dispatch is `live` (and
/// `buffered` slots wait already).
pub fn overlap(def: &ScheduleDef, live: bool, buffered: usize) -> Overlapped {
    if !live {
        return Overlapped::Fire;
    }
    match def.overlap {
        Overlap::Skip => Overlapped::Skip(SkipReason::OverlapSkip),
        Overlap::BufferOne => Overlapped::Buffer,
        Overlap::BufferAll => {
            if buffered < usize::try_from(def.max_buffered).unwrap_or(usize::MAX) {
                Overlapped::Buffer
            } else {
                Overlapped::Skip(SkipReason::BufferFull)
            }
        }
        Overlap::CancelOther => Overlapped::InterruptThenFire,
        Overlap::Allow => Overlapped::Fire,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::model::schedules::{Catchup, DEFAULT_MAX_BUFFERED};

    fn def(spec: Spec, tz: &str) -> ScheduleDef {
        ScheduleDef {
            name: "nightly".into(),
            agent: "a".into(),
            payload: b"{}".to_vec(),
            metadata: Default::default(),
            thread: ThreadChoice::Fixed("t".into()),
            spec,
            timezone: tz.into(),
            start_at: None,
            end_at: None,
            jitter_ms: 0,
            overlap: Overlap::Skip,
            max_buffered: DEFAULT_MAX_BUFFERED,
            catchup: Catchup::default(),
            dst: Dst::default(),
            pause_on_failure: false,
        }
    }

    fn cron(expr: &str, tz: &str, dst: Dst) -> Plan {
        let mut d = def(Spec::Cron(expr.into()), tz);
        d.dst = dst;
        Plan::of(&d).unwrap()
    }

    /// UTC milliseconds of an RFC 3339 time.
    fn t(s: &str) -> u64 {
        u64::try_from(s.parse::<Timestamp>().unwrap().as_millisecond()).unwrap()
    }

    fn labels(fires: &[u64]) -> Vec<String> {
        fires.iter().map(|f| fire_label(*f)).collect()
    }

    const NY: &str = "America/New_York";

    #[test]
    fn a_wall_time_in_the_spring_gap_fires_once_after_it_or_is_skipped() {
        let span = (t("2026-03-07T00:00:00Z"), t("2026-03-10T00:00:00Z"));
        let shift = cron("30 2 * * *", NY, Dst::default()).fires(span.0, span.1, 100);
        // 02:30 EST, then 03:00 EDT (the end of the gap), then 02:30 EDT.
        assert_eq!(
            labels(&shift.fires),
            [
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z"
            ]
        );
        assert!(shift.gaps.is_empty());
        let skip = Dst {
            gap: Gap::Skip,
            fold: Fold::First,
        };
        let skip = cron("30 2 * * *", NY, skip).fires(span.0, span.1, 100);
        assert_eq!(
            labels(&skip.fires),
            ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"]
        );
        assert_eq!(labels(&skip.gaps), ["2026-03-08T07:00:00Z"]);
        // Two wall times in one gap shift to one instant: one fire.
        let both = cron("0,30 2 * * *", NY, Dst::default()).fires(
            t("2026-03-08T00:00:00Z"),
            t("2026-03-08T12:00:00Z"),
            100,
        );
        assert_eq!(labels(&both.fires), ["2026-03-08T07:00:00Z"]);
    }

    #[test]
    fn a_repeated_wall_time_fires_as_the_fold_policy_says() {
        let span = (t("2026-11-01T00:00:00Z"), t("2026-11-02T00:00:00Z"));
        let with = |fold| {
            let dst = Dst {
                gap: Gap::Shift,
                fold,
            };
            labels(&cron("30 1 * * *", NY, dst).fires(span.0, span.1, 100).fires)
        };
        // 01:30 EDT is 05:30Z; 01:30 EST is 06:30Z.
        assert_eq!(with(Fold::First), ["2026-11-01T05:30:00Z"]);
        assert_eq!(with(Fold::Last), ["2026-11-01T06:30:00Z"]);
        assert_eq!(
            with(Fold::Both),
            ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]
        );
    }

    #[test]
    fn a_star_or_step_hour_keeps_firing_through_the_fold() {
        let plan = cron("*/30 * * * *", NY, Dst::default());
        let fires = plan.fires(t("2026-11-01T04:00:00Z"), t("2026-11-01T07:00:00Z"), 100);
        // Every 30 minutes of absolute time, the repeated hour included.
        assert_eq!(
            labels(&fires.fires),
            [
                "2026-11-01T04:30:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:00:00Z",
            ]
        );
        // The same limit-bound search finds the same first fires.
        assert_eq!(plan.upcoming(t("2026-11-01T04:00:00Z"), 6), fires.fires);
    }

    #[test]
    fn every_is_absolute_time_from_its_anchor() {
        let mut d = def(
            Spec::Every {
                every_ms: 15 * 60_000,
                anchor_ms: t("2026-01-01T00:05:00Z"),
            },
            NY,
        );
        let plan = Plan::of(&d).unwrap();
        // After a fire time, exclusive; through the fold with no regard to wall time.
        assert_eq!(
            labels(&plan.upcoming(t("2026-11-01T05:50:00Z"), 3)),
            [
                "2026-11-01T06:05:00Z",
                "2026-11-01T06:20:00Z",
                "2026-11-01T06:35:00Z"
            ]
        );
        d.start_at = Some(t("2026-11-01T07:00:00Z"));
        d.end_at = Some(t("2026-11-01T07:30:00Z"));
        let plan = Plan::of(&d).unwrap();
        assert_eq!(
            labels(&plan.upcoming(0, 10)),
            ["2026-11-01T07:05:00Z", "2026-11-01T07:20:00Z"]
        );
    }

    #[test]
    fn cron_days_match_the_day_of_month_or_the_weekday_when_both_are_set() {
        let plan = cron("0 0 13 * FRI", "UTC", Dst::default());
        // 2026-02-13 is a Friday; 2026-02-06 and 2026-02-20 are Fridays; 2026-03-13 too.
        assert_eq!(
            labels(&plan.upcoming(t("2026-02-01T00:00:00Z"), 4)),
            [
                "2026-02-06T00:00:00Z",
                "2026-02-13T00:00:00Z",
                "2026-02-20T00:00:00Z",
                "2026-02-27T00:00:00Z",
            ]
        );
        let weekdays = cron("0 9 * JAN mon-fri", "Europe/Paris", Dst::default());
        // 2027-01-01 is a Friday; 09:00 CET is 08:00Z.
        assert_eq!(
            labels(&weekdays.upcoming(t("2026-06-01T00:00:00Z"), 2)),
            ["2027-01-01T08:00:00Z", "2027-01-04T08:00:00Z"]
        );
        let secs = cron("*/20 * * * * *", "UTC", Dst::default());
        assert_eq!(
            labels(&secs.upcoming(t("2026-01-01T00:00:00Z"), 2)),
            ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]
        );
        assert_eq!(
            Cron::parse("@daily").unwrap(),
            Cron::parse("0 0 * * *").unwrap()
        );
        assert_eq!(
            Cron::parse("0 0 * * 7").unwrap(),
            Cron::parse("0 0 * * 0").unwrap()
        );
    }

    #[test]
    fn a_malformed_cron_names_its_field() {
        for (expr, says) in [
            ("61 * * * *", "minute field `61`: 61 is out of 0-59"),
            ("* 24 * * *", "hour field"),
            ("* * *", "3 fields"),
            ("@reboot", "unknown shorthand `@reboot`"),
            ("*/0 * * * *", "step `0`"),
            ("5-1 * * * *", "runs backwards"),
            ("0 0 * FOO *", "`FOO` is not a number"),
            ("0 0 0 * *", "day of month field `0`"),
            ("0 0 * * 8", "day of week field"),
            ("0 0 1,,2 * *", "an empty item"),
        ] {
            let err = Cron::parse(expr).unwrap_err();
            assert!(err.contains(says), "{expr}: {err}");
        }
    }

    #[test]
    fn a_declaration_is_refused_with_the_field_that_is_wrong() {
        let now = t("2026-12-07T00:00:00Z");
        let ok = def(Spec::Cron("0 * * * *".into()), "UTC");
        assert!(check(&ok, now).is_ok());
        let refused = |d: ScheduleDef, says: &str| {
            let err = check(&d, now).err().unwrap_or_default();
            assert!(err.contains(says), "{says}: {err}");
        };
        refused(
            def(Spec::Cron("0 * * * *".into()), "Mars/Olympus"),
            "timezone: unknown time zone `Mars/Olympus`",
        );
        refused(
            def(Spec::Cron("0 0 30 2 *".into()), "UTC"),
            "no fire time after now",
        );
        refused(
            def(Spec::At(now - 1), "UTC"),
            "at: 2026-12-06T23:59:59.999Z has passed",
        );
        refused(
            def(
                Spec::Every {
                    every_ms: 10,
                    anchor_ms: 0,
                },
                "UTC",
            ),
            "every: 10 ms",
        );
        let mut jittery = ok.clone();
        jittery.jitter_ms = 3_600_000;
        refused(
            jittery,
            "jitter: 3600000 ms is not shorter than the 3600000 ms",
        );
        let mut allow = ok.clone();
        allow.overlap = Overlap::Allow;
        refused(allow, "overlap: `allow` needs a thread per fire");
        let mut name = ok.clone();
        name.name = "a/b".into();
        refused(name, "name: `a/b`");
        let mut window = ok.clone();
        window.start_at = Some(now + 10);
        window.end_at = Some(now);
        refused(window, "end_at:");
        let mut buffered = ok;
        buffered.max_buffered = 0;
        refused(buffered, "max_buffered: 0");
    }

    #[test]
    fn jitter_is_the_same_everywhere_below_its_bound_and_before_the_next_fire() {
        let fire = t("2026-12-07T09:00:00Z");
        let a = due("s", fire, 60_000, None);
        assert_eq!(a, due("s", fire, 60_000, None));
        assert!(a >= fire && a < fire + 60_000);
        assert_ne!(
            (0..16)
                .map(|i| due("s", fire + i * 3_600_000, 60_000, None) - (fire + i * 3_600_000))
                .collect::<Vec<_>>(),
            vec![0; 16],
            "some delay"
        );
        assert!(due("s", fire, 60_000, Some(fire + 10)) < fire + 10);
        assert_eq!(due("s", fire, 0, None), fire);
    }

    #[test]
    fn ids_name_the_schedule_and_the_fire_time() {
        let fire = t("2026-12-07T09:30:00Z");
        assert_eq!(
            dispatch_id("nightly", fire),
            "sched:nightly:2026-12-07T09:30:00Z"
        );
        assert_eq!(
            tick_id("nightly", 3, fire + 5),
            "sched:nightly:tick:3:2026-12-07T09:30:00.005Z"
        );
        let mut d = def(Spec::At(fire), "UTC");
        assert_eq!(fire_thread(&d, fire), "t");
        d.thread = ThreadChoice::PerFire;
        assert_eq!(fire_thread(&d, fire), "nightly/2026-12-07T09:30:00Z");
        assert_eq!(
            local_label(fire, &zone(NY).unwrap()),
            "2026-12-07 04:30:00 EST"
        );
    }

    #[test]
    fn catch_up_fires_the_latest_missed_slot_in_the_window_and_records_the_rest() {
        let now = t("2026-12-07T12:00:00Z");
        let hour = 3_600_000;
        // Hourly slots missed for six hours: 06:00 to 11:00, due at their times.
        let due: Vec<(u64, u64)> = (6..12)
            .map(|h| (now - (12 - h) * hour, now - (12 - h) * hour))
            .collect();
        let mut d = def(Spec::Cron("0 * * * *".into()), "UTC");
        d.catchup.window_ms = 3 * hour;
        let v = catch_up(&d, &due, &[], now);
        // 09:00 to 11:00 are in the window: 11:00 fires, 09:00 and 10:00 are coalesced;
        // 06:00 to 08:00 missed the window.
        assert_eq!(v.fire, vec![(now - hour, true)]);
        let got: Vec<(String, u64, SkipReason)> = v
            .skipped
            .iter()
            .map(|o| (fire_label(o.fire), o.slots, o.skipped.unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "2026-12-07T06:00:00Z".to_owned(),
                    3,
                    SkipReason::MissedWindow
                ),
                ("2026-12-07T09:00:00Z".to_owned(), 2, SkipReason::Coalesced),
            ]
        );
        d.catchup.policy = CatchupPolicy::All;
        d.catchup.max = 2;
        let all = catch_up(&d, &due, &[], now);
        assert_eq!(all.fire, vec![(now - 2 * hour, true), (now - hour, true)]);
        d.catchup.policy = CatchupPolicy::None;
        let none = catch_up(&d, &due, &[], now);
        assert!(none.fire.is_empty());
        assert_eq!(none.skipped.iter().map(|o| o.slots).sum::<u64>(), 6);
        // A slot on time fires, and a missed one beside it is coalesced into it.
        d.catchup.policy = CatchupPolicy::Latest;
        let on_time = catch_up(&d, &[(now - hour, now - hour), (now, now)], &[], now);
        assert_eq!(on_time.fire, vec![(now, false)]);
        assert_eq!(on_time.skipped[0].skipped, Some(SkipReason::Coalesced));
    }

    #[test]
    fn overlap_decides_on_a_live_last_dispatch() {
        let mut d = def(Spec::Cron("0 * * * *".into()), "UTC");
        assert_eq!(overlap(&d, false, 0), Overlapped::Fire);
        assert_eq!(
            overlap(&d, true, 0),
            Overlapped::Skip(SkipReason::OverlapSkip)
        );
        d.overlap = Overlap::BufferAll;
        d.max_buffered = 2;
        assert_eq!(overlap(&d, true, 1), Overlapped::Buffer);
        assert_eq!(
            overlap(&d, true, 2),
            Overlapped::Skip(SkipReason::BufferFull)
        );
        d.overlap = Overlap::CancelOther;
        assert_eq!(overlap(&d, true, 0), Overlapped::InterruptThenFire);
    }
}
