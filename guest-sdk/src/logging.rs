//! Logging into the host's log, where each line is tagged with the plugin, the dispatch and the
//! attempt.
//!
//! Use the macros, which take `format!` arguments:
//!
//! ```no_run
//! # let id = "d1";
//! homing_guest::info!("handling {id}");
//! homing_guest::warn!("payload is empty");
//! ```
//!
//! or the functions ([`info`], [`warn`], …, [`write`](fn@write)) when the text is already built. Lines go
//! to the host, not to stdout or stderr.

pub use crate::__bindings::log::Level;

/// Writes one line to the host's log at `level`.
pub fn write(level: Level, message: &str) {
    crate::__bindings::log::write(level, message);
}

/// Writes one line at [`Level::Trace`].
pub fn trace(message: &str) {
    write(Level::Trace, message);
}

/// Writes one line at [`Level::Debug`].
pub fn debug(message: &str) {
    write(Level::Debug, message);
}

/// Writes one line at [`Level::Info`].
pub fn info(message: &str) {
    write(Level::Info, message);
}

/// Writes one line at [`Level::Warn`].
pub fn warn(message: &str) {
    write(Level::Warn, message);
}

/// Writes one line at [`Level::Error`].
pub fn error(message: &str) {
    write(Level::Error, message);
}

/// Writes one `format!`-style line to the host's log at the given [`Level`]:
/// `homing_guest::log!(Level::Info, "{n} items")`.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        $crate::logging::write($level, &::std::format!($($arg)+))
    };
}

/// Writes one `format!`-style line to the host's log at [`Level::Trace`].
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log!($crate::logging::Level::Trace, $($arg)+) };
}

/// Writes one `format!`-style line to the host's log at [`Level::Debug`].
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log!($crate::logging::Level::Debug, $($arg)+) };
}

/// Writes one `format!`-style line to the host's log at [`Level::Info`].
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log!($crate::logging::Level::Info, $($arg)+) };
}

/// Writes one `format!`-style line to the host's log at [`Level::Warn`].
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log!($crate::logging::Level::Warn, $($arg)+) };
}

/// Writes one `format!`-style line to the host's log at [`Level::Error`].
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log!($crate::logging::Level::Error, $($arg)+) };
}
