//! The fuzzing core shared by `fuzzer` (handler world) and `fuzzer-agent` (agent world).
//!
//! A [`Run`] is one attempt of one dispatch: seeded from the dispatch's payload
//! (`<seed>:<steps>`) and its attempt number, it makes `steps` random WIT calls through the
//! claim (and a few without one) with random and extreme arguments, predicts the outcome class
//! of each call from the contract (`wit/homing.wit`, the host's documented caps), and records
//! the outcome and every mismatch. Its summary (one JSON line, logged with [`MARK`] in front)
//! is what the host test checks against the store.
//!
//! The calls go through the raw bindings, not the SDK's wrappers, so that every argument the
//! WIT allows can be sent (a metadata list with a key twice, `thread: none` outside a claim).

use std::collections::BTreeMap;

use homing_guest::__bindings::log::{self, Level};
use homing_guest::__bindings::mailbox::{self, Claim};
use homing_guest::__bindings::types::{DispatchInfo, EnqueueRequest, Error, StopReason};

/// The marker in front of a summary line in the host log.
pub const MARK: &str = "FUZZSUM";
/// The host's `[host] max_payload` in the fuzz test's config (bytes).
pub const MAX_PAYLOAD: usize = 4096;
/// The one agent the fuzz plugins may enqueue to.
pub const SINK: &str = "sink";
/// The host's cap on names (agent, thread), in bytes.
const MAX_NAME: usize = 256;
/// The host's cap on a dispatch's metadata, keys and values together.
const MAX_METADATA: usize = 64 * 1024;
/// What the host may add to a follow-up's metadata: `enqueued-by`, `parent`, `traceparent`.
const HOST_METADATA: usize = 300;

/// Whether the host takes `s` as a name: at most [`MAX_NAME`] bytes, no control character,
/// line or paragraph separator, or invisible formatting character (its `check_text`).
fn name_ok(s: &str) -> bool {
    s.len() <= MAX_NAME
        && !s.chars().any(|c| {
            c.is_control()
                || matches!(
                    c,
                    '\u{00AD}'
                        | '\u{061C}'
                        | '\u{180E}'
                        | '\u{200B}'..='\u{200F}'
                        | '\u{2028}'..='\u{202E}'
                        | '\u{2060}'..='\u{206F}'
                        | '\u{FEFF}'
                        | '\u{FFF9}'..='\u{FFFB}'
                        | '\u{E0000}'..='\u{E007F}'
                )
        })
}
/// The host's cap on a follow-up's delay (30 days), in milliseconds.
const MAX_DELAY_MS: u64 = 30 * 24 * 3600 * 1000;
/// The host's cap on one `read-log` page.
const MAX_READ: u64 = 1000;
/// The host's cap on follow-ups per claim.
const MAX_ENQUEUES: u32 = 1000;
/// Violations kept in full in a summary (all are counted).
const KEEP_VIOLATIONS: usize = 4;
/// A summary line must stay under the host's 4 KiB log-line cap.
const MAX_SUMMARY: usize = 3900;
/// The size of an "oversized" value: beyond a NATS message (1 MiB) and the host's
/// `max_payload`; as an error text, beyond what a record keeps (cut to 8 KiB).
const XL: usize = 1_500_000;

/// splitmix64: a tiny seeded generator, good enough to pick calls and arguments.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// FNV-1a, 64 bits: how a summary names bytes without carrying them.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Pieces of odd strings: control characters, combining and invisible characters, emoji,
/// right-to-left overrides, subject wildcards, format strings, quotes.
const PIECES: &[&str] = &[
    "",
    " ",
    "a",
    "sink",
    "fuzzer",
    "\t",
    "\n",
    "\r\n",
    "\0",
    "\u{7f}",
    "é",
    "ü",
    "ñ",
    "日本語",
    "🙂",
    "👩\u{200d}👩\u{200d}👧",
    "\u{202e}",
    "\u{feff}",
    "\u{200b}",
    "\u{fffd}",
    "\u{10ffff}",
    "e\u{301}",
    ".",
    "*",
    ">",
    "..",
    "$JS.API.>",
    "%s%n",
    "{}",
    "{\"a\":1}",
    "\"",
    "\\",
    "'",
    "<b>",
    "../",
    "~",
    "=",
    "|",
    "\u{1b}[31m",
];

/// An odd string of up to `pieces` pieces; now and then one piece repeated thousands of
/// times (past the host's 4 KiB log-line cut, often in the middle of a multi-byte character).
pub fn odd(rng: &mut Rng, pieces: u64) -> String {
    let mut s = String::new();
    if rng.chance(4) {
        let piece = rng.pick(PIECES);
        let times = rng.range(500, 3000) as usize;
        s.push_str(&piece.repeat(times));
        return s;
    }
    for _ in 0..rng.below(pieces + 1) {
        s.push_str(rng.pick(PIECES));
    }
    s
}

/// A size class for data (outputs, entries, error texts) and a size in it.
fn data_size(rng: &mut Rng) -> (usize, bool) {
    match rng.below(100) {
        0..=9 => (0, false),
        10..=59 => (rng.range(1, 64) as usize, false),
        60..=86 => (rng.range(65, 4096) as usize, false),
        87..=98 => (rng.range(4097, 65_536) as usize, false),
        _ => (XL, true),
    }
}

/// `n` bytes: random binary, or odd text (valid UTF-8, which the stores keep as text).
fn fill(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    if rng.chance(50) {
        while out.len() < n {
            out.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        out.truncate(n);
    } else {
        while out.len() < n {
            let piece = rng.pick(PIECES);
            out.extend_from_slice(if piece.is_empty() { "x" } else { piece }.as_bytes());
        }
        // Cut at a character boundary so the text stays UTF-8.
        let mut end = n;
        while end > 0 && std::str::from_utf8(&out[..end]).is_err() {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// Random data of a random size class; `true` when oversized.
fn data(rng: &mut Rng) -> (Vec<u8>, bool) {
    let (n, xl) = data_size(rng);
    (fill(rng, n), xl)
}

/// An error text for nack and dead-letter: usually short, sometimes oversized.
fn error_text(rng: &mut Rng) -> (String, bool) {
    if rng.chance(2) {
        return ("e".repeat(XL), true);
    }
    (odd(rng, 6), false)
}

/// The outcome class of a call: `ok` or the error variant's WIT name.
fn class<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(Error::LostClaim(_)) => "lost-claim",
        Err(Error::Interrupted(_)) => "interrupted",
        Err(Error::Contention(_)) => "contention",
        Err(Error::Invalid(_)) => "invalid",
        Err(Error::Denied(_)) => "denied",
        Err(Error::Duplicate(_)) => "duplicate",
        Err(Error::Conflict(_)) => "conflict",
        Err(Error::Unavailable(_)) => "unavailable",
        Err(Error::Internal(_)) => "internal",
    }
}

fn describe(error: &Error) -> String {
    let text = match error {
        Error::LostClaim(s)
        | Error::Interrupted(s)
        | Error::Contention(s)
        | Error::Invalid(s)
        | Error::Denied(s)
        | Error::Duplicate(s)
        | Error::Unavailable(s)
        | Error::Internal(s) => s.clone(),
        Error::Conflict(latest) => format!("latest {latest}"),
    };
    cut(&text, 100)
}

/// `s` cut to at most `n` bytes at a character boundary.
fn cut(s: &str, n: usize) -> String {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How the attempt was settled by the guest itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ack` or `complete` (one settlement in the store: a repeat of either is idempotent).
    Ack,
    /// `nack`.
    Nack,
    /// `dead-letter`.
    Dead,
}

/// What the dispatch's recorded result should be, as far as this attempt knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    /// None recorded.
    Nothing,
    /// The output with this hash.
    Hash(u64),
    /// A write whose outcome is ambiguous (it failed as unavailable).
    Unknown,
}

/// One attempt of one dispatch being fuzzed.
#[derive(Debug)]
pub struct Run {
    world: &'static str,
    rng: Rng,
    seed: u64,
    steps: u32,
    /// Steps still to make.
    pub left: u32,
    info: DispatchInfo,
    call: u32,
    settled: Option<(Kind, u32)>,
    latest: Option<u64>,
    mine: BTreeMap<u64, u64>,
    appends: u32,
    empty: u32,
    amb_appends: u32,
    cenq: u32,
    amb_cenq: u32,
    enqueued: u32,
    result: Expected,
    outcomes: BTreeMap<String, u32>,
    violations: Vec<String>,
    nviol: u32,
}

/// `<seed>:<steps>`; anything else fuzzes from a hash of the payload for 8 steps.
pub fn parse_payload(payload: &[u8]) -> (u64, u32, bool) {
    let text = std::str::from_utf8(payload).unwrap_or("");
    if let Some((seed, steps)) = text.split_once(':')
        && let (Ok(seed), Ok(steps)) = (seed.parse::<u64>(), steps.parse::<u32>())
    {
        return (seed, steps.min(100_000), true);
    }
    (fnv(payload), 8, false)
}

impl Run {
    /// Starts fuzzing `claim` (the host's claim of one attempt), as plugin `agent` of `world`.
    pub fn start(claim: &Claim, world: &'static str, agent: &str) -> Run {
        let info = claim.info();
        let (seed, steps, well_formed) = parse_payload(&info.payload);
        let rng = Rng::new(seed ^ u64::from(info.attempt).wrapping_mul(0xA076_1D64_78BD_642F));
        let mut run = Run {
            world,
            rng,
            seed,
            steps,
            left: steps,
            info,
            call: 0,
            settled: None,
            latest: None,
            mine: BTreeMap::new(),
            appends: 0,
            empty: 0,
            amb_appends: 0,
            cenq: 0,
            amb_cenq: 0,
            enqueued: 0,
            // The host records the start when it claims, which clears any earlier result.
            result: Expected::Nothing,
            outcomes: BTreeMap::new(),
            violations: Vec::new(),
            nviol: 0,
        };
        if !well_formed {
            run.violation("payload is not <seed>:<steps>".into());
        }
        if run.info.agent != agent {
            run.violation(format!("info.agent is {:?}, not {agent:?}", run.info.agent));
        }
        if run.info.attempt >= run.info.max_attempts {
            run.violation(format!(
                "attempt {} is not below max-attempts {}",
                run.info.attempt, run.info.max_attempts
            ));
        }
        run
    }

    /// The instance-level generator's seed for an agent run started with this claim.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether the guest settled this attempt.
    pub fn is_settled(&self) -> bool {
        self.settled.is_some()
    }

    fn violation(&mut self, what: String) {
        self.nviol += 1;
        if self.violations.len() < KEEP_VIOLATIONS {
            self.violations
                .push(format!("call {}: {}", self.call, cut(&what, 160)));
        }
    }

    /// Counts `op`'s outcome and checks it is one of `allowed`. `internal` never is.
    fn note<T>(&mut self, op: &str, result: &Result<T, Error>, allowed: &[&str]) -> &'static str {
        let class = class(result);
        let key = if self.settled.is_some() {
            format!("post-{op}:{class}")
        } else {
            format!("{op}:{class}")
        };
        *self.outcomes.entry(key).or_default() += 1;
        if class == "internal" || !allowed.contains(&class) {
            let got = match result {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("{class} ({})", describe(e)),
            };
            let phase = if self.settled.is_some() {
                "after settling"
            } else {
                "live"
            };
            self.violation(format!("{op} {phase}: expected {allowed:?}, got {got}"));
        }
        class
    }

    fn count(&mut self, key: String) {
        *self.outcomes.entry(key).or_default() += 1;
    }

    /// One random call.
    pub fn step(&mut self, claim: &Claim) {
        self.left = self.left.saturating_sub(1);
        let roll = self.rng.below(100);
        match roll {
            0..=4 => self.info(claim),
            5..=9 => self.record_start(claim),
            10..=15 => self.record_result(claim),
            16..=17 => self.complete(claim),
            18..=19 => self.ack(claim),
            20..=21 => self.nack(claim),
            22 => self.dead_letter(claim),
            23..=36 => self.append(claim),
            37..=46 => self.append_expected(claim),
            47..=56 => self.read_log(claim),
            57..=62 => self.log_latest(claim),
            63..=66 => self.stop_requested(claim),
            67..=78 => self.claim_enqueue(claim),
            79..=87 => self.mailbox_enqueue(),
            _ => self.log_write(),
        }
        self.call += 1;
    }

    /// Settles now with a random settling call (complete, ack, nack or dead-letter).
    pub fn settle_now(&mut self, claim: &Claim) {
        match self.rng.below(4) {
            0 => self.complete(claim),
            1 => self.ack(claim),
            2 => self.nack(claim),
            _ => self.dead_letter(claim),
        }
        self.call += 1;
    }

    fn info(&mut self, claim: &Claim) {
        let now = claim.info();
        let first = &self.info;
        let same = now.id == first.id
            && now.agent == first.agent
            && now.thread == first.thread
            && now.run_id == first.run_id
            && now.payload == first.payload
            && now.metadata == first.metadata
            && now.attempt == first.attempt
            && now.max_attempts == first.max_attempts
            && now.priority == first.priority;
        self.note::<()>("info", &Ok(()), &["ok"]);
        if !same {
            self.violation(format!(
                "info changed: now {} attempt {}",
                now.id, now.attempt
            ));
        }
    }

    fn record_start(&mut self, claim: &Claim) {
        let out = claim.record_start();
        let allowed: &[&str] = if self.settled.is_some() {
            &["lost-claim"]
        } else {
            &["ok"]
        };
        if self.note("start", &out, allowed) == "ok" && self.settled.is_none() {
            self.result = Expected::Nothing;
        }
    }

    fn record_result(&mut self, claim: &Claim) {
        let (output, _) = data(&mut self.rng);
        let out = claim.record_result(&output);
        // The host checks sizes first: over `max_payload` is `invalid` on every backend, also
        // after settling (never `unavailable`: retrying cannot help).
        let allowed: &[&str] = match (self.settled.is_some(), output.len() > MAX_PAYLOAD) {
            (_, true) => &["invalid"],
            (true, false) => &["lost-claim"],
            (false, false) => &["ok"],
        };
        let class = self.note("result", &out, allowed);
        if self.settled.is_none() {
            match class {
                "ok" => self.result = Expected::Hash(fnv(&output)),
                "unavailable" => self.result = Expected::Unknown,
                _ => {}
            }
        }
    }

    /// What a settling call may return, given what settled the attempt before; `oversized`
    /// when it carries an output over `max_payload` (then `invalid`, whatever came before).
    fn settle_allowed(&self, kind: Kind, oversized: bool) -> &'static [&'static str] {
        match self.settled {
            _ if oversized => &["invalid"],
            None => &["ok"],
            // A repeat of the settling operation with the same token is idempotent.
            Some((Kind::Ack, _)) if kind == Kind::Ack => &["ok"],
            Some((Kind::Dead, _)) if kind == Kind::Dead => &["ok"],
            // A nacked dispatch may be claimed and settled by another holder meanwhile.
            Some((Kind::Nack, _)) if kind == Kind::Nack => &["ok", "lost-claim"],
            Some(_) => &["lost-claim"],
        }
    }

    fn settled_by(&mut self, kind: Kind, class: &str) {
        if self.settled.is_none() && class == "ok" {
            self.settled = Some((kind, self.call));
            // Another holder may write the log once this one let go.
            self.latest = None;
        }
    }

    fn complete(&mut self, claim: &Claim) {
        let (output, _) = data(&mut self.rng);
        let out = claim.complete(&output);
        let allowed = self.settle_allowed(Kind::Ack, output.len() > MAX_PAYLOAD);
        let class = self.note("complete", &out, allowed);
        if self.settled.is_none() {
            match class {
                "ok" => self.result = Expected::Hash(fnv(&output)),
                "unavailable" => self.result = Expected::Unknown,
                _ => {}
            }
        }
        self.settled_by(Kind::Ack, class);
    }

    fn ack(&mut self, claim: &Claim) {
        let out = claim.ack();
        let allowed = self.settle_allowed(Kind::Ack, false);
        let class = self.note("ack", &out, allowed);
        self.settled_by(Kind::Ack, class);
    }

    fn nack(&mut self, claim: &Claim) {
        // An oversized error text is kept cut (8 KiB): the nack itself succeeds.
        let (error, _) = error_text(&mut self.rng);
        let retry = match self.rng.below(7) {
            0 => None,
            1 => Some(0),
            2 => Some(1),
            3 => Some(u64::MAX),
            4 => Some(u64::MAX / 2),
            5 => Some(self.rng.below(100)),
            _ => Some(self.rng.next_u64()),
        };
        let out = claim.nack(&error, retry);
        let allowed = self.settle_allowed(Kind::Nack, false);
        let class = self.note("nack", &out, allowed);
        self.settled_by(Kind::Nack, class);
    }

    fn dead_letter(&mut self, claim: &Claim) {
        let (error, _) = error_text(&mut self.rng);
        let out = claim.dead_letter(&error);
        let allowed = self.settle_allowed(Kind::Dead, false);
        let class = self.note("dead", &out, allowed);
        self.settled_by(Kind::Dead, class);
    }

    /// A log entry: `fz|<id>|<attempt>|<call>|` and random data, or (sometimes) nothing at all.
    fn entry(&mut self) -> (Vec<u8>, bool) {
        if self.rng.chance(8) {
            return (Vec::new(), false);
        }
        let mut entry =
            format!("fz|{}|{}|{}|", self.info.id, self.info.attempt, self.call).into_bytes();
        let (tail, xl) = data(&mut self.rng);
        entry.extend_from_slice(&tail);
        (entry, xl)
    }

    /// Books an append's outcome.
    fn appended(&mut self, entry: &[u8], class: &str, seq: Option<u64>) {
        if self.settled.is_some() {
            return;
        }
        match (class, seq) {
            ("ok", Some(seq)) => {
                if let Some(latest) = self.latest
                    && seq != latest.saturating_add(1)
                {
                    self.violation(format!("append returned {seq}, latest was {latest}"));
                }
                if self
                    .mine
                    .keys()
                    .next_back()
                    .is_some_and(|last| *last >= seq)
                {
                    self.violation(format!("append returned {seq}, not above my last"));
                }
                self.latest = Some(seq);
                self.mine.insert(seq, fnv(entry));
                if entry.is_empty() {
                    self.empty += 1;
                } else {
                    self.appends += 1;
                }
            }
            ("unavailable" | "contention", _) => {
                self.amb_appends += 1;
                self.latest = None;
            }
            _ => {}
        }
    }

    fn append(&mut self, claim: &Claim) {
        let (entry, _) = self.entry();
        let out = claim.append(&entry);
        let allowed: &[&str] = match (self.settled.is_some(), entry.len() > MAX_PAYLOAD) {
            (_, true) => &["invalid"],
            (true, false) => &["lost-claim"],
            (false, false) => &["ok"],
        };
        let class = self.note("append", &out, allowed);
        self.appended(&entry, class, out.ok());
    }

    fn append_expected(&mut self, claim: &Claim) {
        let (entry, _) = self.entry();
        let oversized = entry.len() > MAX_PAYLOAD;
        let known = self.latest;
        let expected = match (self.rng.below(9), known) {
            (0..=3, Some(l)) => l,
            (4, Some(l)) => l.saturating_add(1),
            (5, Some(l)) => l.saturating_sub(1),
            (6, _) => u64::MAX,
            (7, _) => self.rng.below(4),
            _ => 0,
        };
        let out = claim.append_expected(&entry, expected);
        let allowed: &[&str] = if oversized {
            &["invalid"]
        } else if self.settled.is_some() {
            &["lost-claim"]
        } else {
            &["ok", "conflict"]
        };
        let class = self.note("expect", &out, allowed);
        if self.settled.is_some() {
            return;
        }
        match (&out, known) {
            (Ok(seq), _) if *seq != expected.wrapping_add(1) => {
                self.violation(format!("append-expected {expected} returned {seq}"));
            }
            (Ok(_), Some(l)) if l != expected => {
                self.violation(format!(
                    "append-expected {expected} succeeded at latest {l}"
                ));
            }
            (Err(Error::Conflict(v)), Some(l)) if *v != l || l == expected => {
                self.violation(format!(
                    "append-expected {expected} conflicted with {v}, latest was {l}"
                ));
            }
            (Err(Error::Conflict(v)), None) => {
                if *v == expected {
                    self.violation(format!("append-expected {expected} conflicted with {v}"));
                }
                self.latest = Some(*v);
            }
            _ => {}
        }
        self.appended(&entry, class, out.ok());
    }

    fn read_log(&mut self, claim: &Claim) {
        let known = self.latest;
        let after = match (self.rng.below(8), known) {
            (0 | 1, _) => 0,
            (2, Some(l)) => l,
            (3, Some(l)) => l.saturating_sub(self.rng.below(5)),
            (4, Some(l)) => l.saturating_add(1),
            (5, _) => u64::MAX,
            (6, _) => i64::MAX as u64 + 1,
            _ => self.rng.below(6),
        };
        let limit = match self.rng.below(8) {
            0 => 0,
            1 => 1,
            2 => 2,
            3 => 1000,
            4 => 1001,
            5 => u32::MAX,
            _ => self.rng.below(20) as u32,
        };
        let out = claim.read_log(after, limit);
        self.note("read", &out, &["ok"]);
        let Ok(entries) = out else { return };
        let cap = u64::from(limit).min(MAX_READ);
        if entries.len() as u64 > cap {
            self.violation(format!(
                "read-log after {after} limit {limit} returned {} entries",
                entries.len()
            ));
        }
        let mut last = after;
        for e in &entries {
            if e.seq <= last {
                self.violation(format!(
                    "read-log after {after}: seq {} not above {last}",
                    e.seq
                ));
                break;
            }
            last = e.seq;
            if let Some(hash) = self.mine.get(&e.seq)
                && *hash != fnv(&e.data)
            {
                self.violation(format!("read-log: entry {} is not what I appended", e.seq));
            }
        }
        if self.settled.is_none()
            && let Some(l) = known
        {
            let want = cap.min(l.saturating_sub(after));
            let contiguous = entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == after.saturating_add(1 + i as u64));
            if entries.len() as u64 != want || !contiguous {
                self.violation(format!(
                    "read-log after {after} limit {limit} at latest {l}: {} entries, want {want} contiguous",
                    entries.len()
                ));
            }
        }
    }

    fn log_latest(&mut self, claim: &Claim) {
        let out = claim.log_latest();
        self.note("latest", &out, &["ok"]);
        let Ok(v) = out else { return };
        if let Some(mine) = self.mine.keys().next_back()
            && v < *mine
        {
            self.violation(format!("log-latest {v} is below my entry {mine}"));
        }
        if self.settled.is_none() {
            if let Some(l) = self.latest
                && v != l
            {
                self.violation(format!("log-latest {v}, but I hold the thread at {l}"));
            }
            self.latest = Some(v);
        }
    }

    fn stop_requested(&mut self, claim: &Claim) {
        let reason = claim.stop_requested();
        let name = match reason {
            None => "none",
            Some(StopReason::Interrupted) => "interrupted",
            Some(StopReason::LeaseLost) => "lease-lost",
            Some(StopReason::Shutdown) => "shutdown",
            Some(StopReason::Deadline) => "deadline",
            Some(StopReason::Upgrade) => "upgrade",
        };
        let prefix = if self.settled.is_some() { "post-" } else { "" };
        self.count(format!("{prefix}stop:{name}"));
        if reason.is_some() {
            self.violation(format!("stop-requested says {name}"));
        }
    }

    /// A random follow-up request and the outcome classes the host may answer it with.
    fn request(&mut self, through_claim: bool) -> (EnqueueRequest, Vec<&'static str>) {
        let rng = &mut self.rng;
        let agent = match rng.below(14) {
            0..=6 => SINK.to_owned(),
            7 => "fuzzer".to_owned(),
            8 => "fuzzer-agent".to_owned(),
            9 => "bystander".to_owned(),
            10 => String::new(),
            11 => rng.pick(&["sink ", "SINK", "s\u{ef}nk", " "]).to_owned(),
            12 => "a".repeat(300),
            _ => odd(rng, 4),
        };
        let thread = match rng.below(12) {
            0..=2 => None,
            3 => Some(self.info.thread.clone()),
            4 => Some(String::new()),
            5 => Some(" \t\n".to_owned()),
            6 => Some("x".repeat(MAX_NAME)),
            7 => Some("x".repeat(MAX_NAME + 1)),
            8 => Some("é".repeat(MAX_NAME / 2 + rng.below(2) as usize)),
            9 => Some(format!("fz-side-{}", rng.below(4))),
            _ => Some(odd(rng, 5)),
        };
        let payload = match rng.below(10) {
            0 => Vec::new(),
            1 => fill(rng, MAX_PAYLOAD),
            2 => fill(rng, MAX_PAYLOAD + 1),
            3 => fill(rng, MAX_PAYLOAD * 3),
            4 if rng.chance(20) => fill(rng, XL),
            _ => {
                let n = rng.range(1, 200) as usize;
                fill(rng, n)
            }
        };
        let mut metadata = Vec::new();
        for _ in 0..rng.below(5) {
            let key = match rng.below(7) {
                0 => "k".to_owned(),
                1 => "a".to_owned(),
                2 => String::new(),
                3 => "parent".to_owned(),
                4 => "enqueued-by".to_owned(),
                _ => odd(rng, 3),
            };
            let value = if rng.chance(2) {
                "v".repeat(20_000)
            } else {
                odd(rng, 4)
            };
            metadata.push((key, value));
        }
        let priority = match rng.below(5) {
            0 => None,
            1 => Some(0),
            2 => Some(255),
            _ => Some(rng.below(256) as u8),
        };
        let delay_ms = match rng.below(10) {
            0..=2 => None,
            3 => Some(0),
            4 => Some(rng.range(1, 100)),
            5 => Some(MAX_DELAY_MS),
            6 => Some(MAX_DELAY_MS + 1),
            7 => Some(u64::MAX),
            8 => Some(rng.range(600_000, MAX_DELAY_MS)),
            _ => Some(rng.next_u64()),
        };
        let dedupe_key = match rng.below(10) {
            0..=4 => None,
            5 => Some(String::new()),
            6 => Some("d".repeat(1000)),
            7 => Some(odd(rng, 3)),
            _ => Some(format!("k{}", rng.below(3))),
        };
        // A follow-up delayed far ahead stays live and holds its key: the next one is refused.
        let delay_ms = match &dedupe_key {
            Some(key) if key.starts_with('k') && rng.chance(50) => Some(MAX_DELAY_MS),
            _ => delay_ms,
        };
        let max_attempts = match rng.below(6) {
            0 | 1 => None,
            2 => Some(0),
            3 => Some(1),
            4 => Some(u32::MAX),
            _ => Some(rng.below(10) as u32),
        };
        // The host's checks, in its order: target, thread, payload, delay, then the names and
        // the metadata (every entry point's rules), then the store's.
        let resolved = match (&thread, through_claim) {
            (Some(t), _) => Some(t.clone()),
            (None, true) => Some(self.info.thread.clone()),
            (None, false) => None,
        };
        // The metadata as the host keeps it (a later key wins; it sets `enqueued-by` and,
        // through a claim, `parent`), less what the host adds.
        let mut kept: BTreeMap<&str, &str> = BTreeMap::new();
        for (key, value) in &metadata {
            kept.insert(key, value);
        }
        let bad_key = kept.keys().any(|k| k.trim().is_empty() || !name_ok(k));
        kept.remove("enqueued-by");
        if through_claim {
            kept.remove("parent");
        }
        let size: usize = kept.iter().map(|(k, v)| k.len() + v.len()).sum();
        let allowed: Vec<&'static str> = if agent != SINK {
            vec!["denied"]
        } else if resolved.is_none()
            || payload.len() > MAX_PAYLOAD
            || delay_ms.is_some_and(|d| d > MAX_DELAY_MS)
            || resolved
                .as_ref()
                .is_some_and(|t| t.trim().is_empty() || !name_ok(t))
            || dedupe_key
                .as_ref()
                .is_some_and(|k| k.is_empty() || !name_ok(k))
            || bad_key
            || size > MAX_METADATA
        {
            vec!["invalid"]
        } else if size + HOST_METADATA > MAX_METADATA {
            // What the host adds may take it over the cap.
            if dedupe_key.is_some() {
                vec!["ok", "duplicate", "invalid"]
            } else {
                vec!["ok", "invalid"]
            }
        } else if dedupe_key.is_some() {
            vec!["ok", "duplicate"]
        } else {
            vec!["ok"]
        };
        let request = EnqueueRequest {
            agent,
            thread,
            payload,
            metadata,
            priority,
            delay_ms,
            dedupe_key,
            max_attempts,
            concurrency_key: None,
            debounce: None,
        };
        (request, allowed)
    }

    fn claim_enqueue(&mut self, claim: &Claim) {
        let (request, mut allowed) = self.request(true);
        if self.settled.is_some() {
            allowed = vec!["lost-claim"];
        } else if self.enqueued >= MAX_ENQUEUES {
            allowed = vec!["denied"];
        }
        let out = claim.enqueue(&request);
        let class = self.note("cenq", &out, &allowed);
        if let Ok(id) = &out
            && id.is_empty()
        {
            self.violation("claim.enqueue returned an empty id".into());
        }
        if self.settled.is_none() {
            match class {
                "ok" => {
                    self.cenq += 1;
                    self.enqueued += 1;
                }
                "unavailable" | "contention" => self.amb_cenq += 1,
                _ => {}
            }
        }
    }

    fn mailbox_enqueue(&mut self) {
        let (request, allowed) = self.request(false);
        let out = mailbox::enqueue(&request);
        self.note("menq", &out, &allowed);
    }

    fn log_write(&mut self) {
        let level = self.rng.pick(&[
            Level::Trace,
            Level::Debug,
            Level::Info,
            Level::Warn,
            Level::Error,
        ]);
        let message = if self.rng.chance(2) {
            "é".repeat(XL / 2)
        } else {
            odd(&mut self.rng, 8)
        };
        log::write(level, &message);
        self.note::<()>("log", &Ok(()), &["ok"]);
    }

    /// The summary of this attempt, ended by `end` (what settled it or should settle it).
    pub fn summary(&self, end: &str) -> String {
        let settle = match self.settled {
            None => "null".to_owned(),
            Some((kind, at)) => format!(
                "{{\"kind\":\"{}\",\"at\":{at}}}",
                match kind {
                    Kind::Ack => "ack",
                    Kind::Nack => "nack",
                    Kind::Dead => "dead",
                }
            ),
        };
        let result = match self.result {
            Expected::Nothing => "null".to_owned(),
            Expected::Hash(h) => format!("\"{h:016x}\""),
            Expected::Unknown => "\"?\"".to_owned(),
        };
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, v)| format!("{}:{v}", json_str(k)))
            .collect();
        let head = format!(
            "{{\"world\":\"{}\",\"seed\":{},\"steps\":{},\"id\":{},\"attempt\":{},\"max\":{},\"end\":{},\"settle\":{settle},\"appends\":{},\"empty\":{},\"amb_appends\":{},\"cenq\":{},\"amb_cenq\":{},\"result\":{result},\"calls\":{},\"outcomes\":{{{}}},\"nviol\":{}",
            self.world,
            self.seed,
            self.steps,
            json_str(&self.info.id),
            self.info.attempt,
            self.info.max_attempts,
            json_str(end),
            self.appends,
            self.empty,
            self.amb_appends,
            self.cenq,
            self.amb_cenq,
            self.call,
            outcomes.join(","),
            self.nviol,
        );
        let mut kept: Vec<String> = self.violations.iter().map(|v| json_str(v)).collect();
        loop {
            let line = format!("{head},\"violations\":[{}]}}", kept.join(","));
            if line.len() <= MAX_SUMMARY || kept.is_empty() {
                return line;
            }
            kept.pop();
        }
    }

    /// Logs the summary with its marker; returns the summary.
    pub fn report(&self, end: &str) -> String {
        let summary = self.summary(end);
        log::write(Level::Info, &format!("{MARK} {summary}"));
        summary
    }

    /// How the attempt ended, when the guest settled it itself.
    pub fn settled_end(&self) -> Option<&'static str> {
        self.settled.map(|(kind, _)| match kind {
            Kind::Ack => "ack",
            Kind::Nack => "nack",
            Kind::Dead => "dead",
        })
    }

    /// The generator, for the world's own choices.
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }
}
