//! The forms of a blocking call: the one [`Deadline`] type under every wait, the
//! `blocking!` macro that makes `x`, `x_timeout`, `x_deadline` (and `try_x`) from one
//! deadline form, and the iterator of a receiving end.

use std::time::{Duration, Instant};

/// The deadline passed before the operation could proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimedOut;

/// When a blocking call gives up: the one deadline type under every blocking call.
///
/// `pub` only so that the sealed `Selectable` trait may name it: `wait` is a private
/// module, so no user can.
///
/// `try_x` is `x` with [`Deadline::Now`] (one attempt, no clock read), `x` waits with
/// [`Deadline::Never`], `x_timeout(t)` with [`Deadline::after`]`(t)` and `x_deadline(i)`
/// with [`Deadline::At`]`(i)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Do not wait: one attempt.
    Now,
    /// Wait as long as it takes.
    Never,
    /// Give up at this instant.
    At(Instant),
    /// One attempt, then the work of one liveness tick (probe the peers, repair, take back
    /// what the dead held), then give up: how an async future looks again after its
    /// peers may have changed (the forms that map `Now` to `Full` or `Empty` say `Timeout`
    /// here).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    Tick,
}

impl Deadline {
    /// `timeout` from now (a timeout too long to represent never passes).
    pub(crate) fn after(timeout: Duration) -> Self {
        Instant::now().checked_add(timeout).map_or(Deadline::Never, Deadline::At)
    }

    /// Whether the deadline has passed (reads the clock for `At` only).
    pub(crate) fn passed(self) -> bool {
        match self {
            Deadline::Now | Deadline::Tick => true,
            Deadline::Never => false,
            Deadline::At(at) => Instant::now() >= at,
        }
    }

    /// Time left: `None` for no deadline, `Some(ZERO)` once it has passed.
    pub(crate) fn remaining(self) -> Option<Duration> {
        match self {
            Deadline::Now | Deadline::Tick => Some(Duration::ZERO),
            Deadline::Never => None,
            Deadline::At(at) => Some(at.saturating_duration_since(Instant::now())),
        }
    }

    /// The earlier of this deadline and `tick` from now.
    pub(crate) fn or_within(self, tick: Duration) -> Self {
        let soon = Deadline::after(tick);
        match (self, soon) {
            (Deadline::At(a), Deadline::At(b)) => Deadline::At(a.min(b)),
            (Deadline::Now | Deadline::Tick, _) => self,
            (Deadline::Never, _) => soon,
            (at, Deadline::Never | Deadline::Now | Deadline::Tick) => at,
        }
    }
}

/// Writes the blocking forms of an operation from its deadline form `$until` (a method of
/// `self`, or of one of its fields: `inner.push_until`, taking the operation's arguments
/// and a `Deadline`, returning `Result<$out, $timeout_err>`): `$name` waits as long as it
/// takes (its error `$err` has no `Timeout`), `$timeout` gives up after a `Duration`,
/// `$deadline` at an `Instant` (both `$timeout_err`); with `try $try -> $try_err` after
/// them (then `;` before the receiver), `$try` makes one attempt (the deadline form's `Timeout` said as `$try_err`'s
/// "nothing now"). The error types come from `wait_errors!`, whose `from_timeout` converts.
/// The operation's own documentation goes in, ending with its `# Errors` section; each form
/// says how long it waits. An optional `examples { timeout { .. } deadline { .. } try { .. } }`
/// after the receiver line gives the other forms' examples (doc comments). One macro for
/// every blocking call, so that the forms mean the same on every type.
macro_rules! blocking {
    (
        $(#[doc = $doc:expr])*
        $vis:vis fn $name:ident -> $err:ty, $timeout:ident, $deadline:ident -> $timeout_err:ty
            $(, try $try:ident -> $try_err:ty)?;
            $params:tt -> $out:ty => $($until:ident).+;
        $(examples $examples:tt)?
    ) => {
        $crate::wait::blocking!(@receiver $params [$(#[doc = $doc])*]
            $vis $name $err, $timeout $deadline $timeout_err, [$($try $try_err)?]
            $out, [$($until).+] [$($examples)?]);
    };
    // The receiver: `&mut self` (an SPSC end) or `&self`, then the arguments.
    (@receiver (&mut $self:ident $(, $arg:ident: $ty:ty)*) $docs:tt $($rest:tt)*) => {
        $crate::wait::blocking!(@emit $self [&mut $self] ($($arg: $ty),*) $docs $($rest)*);
    };
    (@receiver (&$self:ident $(, $arg:ident: $ty:ty)*) $docs:tt $($rest:tt)*) => {
        $crate::wait::blocking!(@emit $self [&$self] ($($arg: $ty),*) $docs $($rest)*);
    };
    (@emit $self:ident [$($recv:tt)*] ($($arg:ident: $ty:ty),*) [$($doc:tt)*]
        $vis:vis $name:ident $err:ty, $timeout:ident $deadline:ident $timeout_err:ty,
        [$($try:ident $try_err:ty)?] $out:ty, [$($until:tt)+]
        [$({
            timeout { $(#[doc = $te:expr])* }
            deadline { $(#[doc = $de:expr])* }
            $(try { $(#[doc = $ye:expr])* })?
        })?]) => {
        $crate::wait::blocking!(@try [$($try $try_err)?] $self [$($recv)*] $vis $name
            ($($arg: $ty),*) $out, [$($until)+] [$($($(#[doc = $ye])*)?)?]);

        $($doc)*
        ///
        /// Never times out: it waits as long as it takes (the
        #[doc = concat!("[`", stringify!($timeout), "`](Self::", stringify!($timeout), ")")]
        /// and
        #[doc = concat!("[`", stringify!($deadline), "`](Self::", stringify!($deadline), ")")]
        /// forms give up in time).
        $vis fn $name($($recv)* $(, $arg: $ty)*) -> Result<$out, $err> {
            $self.$($until)+($($arg,)* $crate::wait::Deadline::Never).map_err(<$err>::from_timeout)
        }

        $crate::wait::blocking!(@bounded $self [$($recv)*] ($($arg: $ty),*) $vis $name $timeout
            (timeout: ::std::time::Duration => $crate::wait::Deadline::after(timeout))
            "giving up once `timeout` has passed." $out, $timeout_err, [$($until)+]
            [$($(#[doc = $te])*)?]);
        $crate::wait::blocking!(@bounded $self [$($recv)*] ($($arg: $ty),*) $vis $name $deadline
            (deadline: ::std::time::Instant => $crate::wait::Deadline::At(deadline))
            "giving up at `deadline`: one deadline for several calls." $out, $timeout_err,
            [$($until)+] [$($(#[doc = $de])*)?]);
    };
    // A form with a deadline: `$form(.., $param)`, waiting until `$deadline`.
    (@bounded $self:ident [$($recv:tt)*] ($($arg:ident: $ty:ty),*) $vis:vis $name:ident
        $form:ident ($param:ident: $param_ty:ty => $deadline:expr) $summary:literal $out:ty,
        $timeout_err:ty, [$($until:tt)+] [$($example:tt)*]) => {
        #[doc = concat!("As [`", stringify!($name), "`](Self::", stringify!($name), "), ", $summary)]
        ///
        $($example)*
        ///
        /// # Errors
        ///
        #[doc = concat!("`Timeout` once `", stringify!($param), "` has passed (carrying back what the")]
        /// call was given, where it takes something), or as
        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ").")]
        $vis fn $form($($recv)* $(, $arg: $ty)*, $param: $param_ty) -> Result<$out, $timeout_err> {
            $self.$($until)+($($arg,)* $deadline)
        }
    };
    (@try [] $($rest:tt)*) => {};
    (@try [$try:ident $try_err:ty] $self:ident [$($recv:tt)*] $vis:vis $name:ident
        ($($arg:ident: $ty:ty),*) $out:ty, [$($until:tt)+] [$($ye:tt)*]) => {
        #[doc = concat!("As [`", stringify!($name), "`](Self::", stringify!($name), "), without waiting: one attempt, and no clock read.")]
        ///
        $($ye)*
        ///
        /// # Errors
        ///
        /// The variant that says it cannot proceed now (`Exhausted`, `Full` or `Empty`),
        /// or as
        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ").")]
        $vis fn $try($($recv)* $(, $arg: $ty)*) -> Result<$out, $try_err> {
            $self.$($until)+($($arg,)* $crate::wait::Deadline::Now).map_err(<$try_err>::from_timeout)
        }
    };
}
pub(crate) use blocking;

/// The iterator of a receiving end over one of its receive forms (`next`): yields what it
/// receives; ends quietly when `next` says the other side has gone, or that nothing is
/// there now (`quiet`); yields an error that says what the next receive goes on from
/// (`passing`: a lagging broadcast channel's `Lagged`) and goes on; ends after yielding
/// any other error, so that a `for` loop over it never spins on an error that stays.
pub(crate) fn receive_iter<T, E>(
    mut next: impl FnMut() -> Result<T, E>,
    quiet: impl Fn(&E) -> bool,
    passing: impl Fn(&E) -> bool,
) -> impl Iterator<Item = Result<T, E>> {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        match next() {
            Ok(v) => Some(Ok(v)),
            Err(e) if passing(&e) => Some(Err(e)),
            Err(e) => {
                done = true;
                (!quiet(&e)).then_some(Err(e))
            }
        }
    })
}
