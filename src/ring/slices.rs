//! Slices: many elements moved at once, with one publication (SPSC: one `tail` or `head`
//! store per slice) or one claim (MPMC: one compare-and-swap per run of up to
//! [`MAX_RUN`](super::mpmc::MAX_RUN) cells). A stream of small elements moves far faster
//! this way; descriptors of 384 bytes about three times as fast in slices of 32.
//!
//! `try_push_slice` pushes what fits now and says how many; `push_slice_until` pushes all
//! of a slice as room appears (another MPMC producer's elements may fall between two of its
//! runs). `try_pop_into` takes what is published now, up to the buffer; `pop_into_until`
//! waits for at least one.

use bytemuck::Pod;

use super::mpmc::{self, MAX_RUN, fill};
use super::repair::try_adopt_in;
use super::spsc::{self, Local};
use super::{Hint, PopTimeoutError, PushTimeoutError, Storage, cache_hint, cell_at, wait_for};
use crate::layout::{Corrupted, MpmcCell, SpscCell};
use crate::liveness::{Blocked, Role, Tick};
use crate::sync::Ordering;
use crate::wait::{Deadline, notify};

/// Moves up to `want` elements through the cells from this SPSC endpoint's position: the
/// producer (`me`) writes them, the consumer reads them, by `each(i, cell)` for the `i`-th;
/// then publishes the new position with one store (`tail` or `head`). Returns how many.
fn slice_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    me: Role,
    want: usize,
    mut each: impl FnMut(usize, &SpscCell<T>),
) -> Result<usize, Corrupted> {
    let (mut ready, hint) = match me {
        Role::Producer => {
            (local.capacity - local.pos.wrapping_sub(local.peer).min(local.capacity), Hint::Write)
        }
        Role::Consumer => (local.peer.wrapping_sub(local.pos).min(local.capacity), Hint::Read),
    };
    if (ready as usize) < want {
        ready = match me {
            Role::Producer => local.refresh_head(storage)?,
            Role::Consumer => local.refresh_tail(storage)?,
        };
    }
    let n = want.min(ready as usize);
    let cells = (0..n as u64).map(|i| cell_at(storage, local.capacity, local.pos.wrapping_add(i)));
    if local.hints.prefetch {
        // Ask for every cell of the slice at once, so that the lines the other side last
        // touched come over in parallel rather than one miss at a time.
        cells.clone().for_each(|cell| cache_hint(cell, hint));
    }
    cells.enumerate().for_each(|(i, cell)| each(i, cell));
    if n > 0 {
        local.pos = local.pos.wrapping_add(n as u64);
        let c = storage.control();
        // Release: as in `spsc::try_push_in` (publishes all n cells at once) and
        // `spsc::try_pop_in` (frees them at once).
        match me {
            Role::Producer => c.tail.store(local.pos, Ordering::Release),
            Role::Consumer => c.head.store(local.pos, Ordering::Release),
        }
    }
    Ok(n)
}

/// Pushes as many of `values` as fit, from the front, with one publication of `tail`.
fn try_push_slice_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    values: &[T],
) -> Result<usize, Corrupted> {
    slice_in(storage, local, Role::Producer, values.len(), |i, cell| {
        // SAFETY: as in `spsc::try_push_in`: positions pos..pos + n are below head +
        // capacity (n <= free), so these cells belong to the producer until `tail` passes
        // them.
        cell.value.with_mut(|p| unsafe { p.write(values[i]) });
    })
}

/// Pops up to `out.len()` elements into `out`, with one publication of `head`.
fn try_pop_into_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    out: &mut [T],
) -> Result<usize, Corrupted> {
    slice_in(storage, local, Role::Consumer, out.len(), |i, cell| {
        // SAFETY: as in `spsc::try_pop_in`: positions pos..pos + n are below tail (n <=
        // ready), published, and the producer does not write them until `head` passes them.
        out[i] = cell.value.with(|p| unsafe { p.read() });
    })
}

/// Pushes all of `values` by runs of `run` (which pushes a prefix, waiting for room until
/// the deadline, and says how long), counting what went in; the error carries that count.
fn push_all<T>(
    values: &[T],
    mut run: impl FnMut(&[T]) -> Result<usize, Blocked>,
) -> Result<(), PushTimeoutError<usize>> {
    let mut done = 0;
    while done < values.len() {
        done += run(&values[done..]).map_err(|b| PushTimeoutError::from_blocked(b, done))?;
    }
    Ok(())
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> spsc::Producer<T, S> {
    /// Pushes as many of `values` as there is room for, from the front, publishing them
    /// with one store; never blocks. Returns how many were pushed (0: full). Wakes a
    /// sleeping consumer.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the consumer's position is impossible.
    pub fn try_push_slice(&mut self, values: &[T]) -> Result<usize, Corrupted> {
        let n = try_push_slice_in(&self.storage, &mut self.local, values)?;
        if n > 0 {
            notify(&self.storage.control().not_empty);
        }
        Ok(n)
    }

    /// Pushes all of `values`, in slices as room appears, waiting as the wait policy says
    /// until `deadline`. The error carries how many were pushed.
    pub(crate) fn push_slice_until(
        &mut self,
        values: &[T],
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<usize>> {
        push_all(values, |rest| self.push_some_until(rest, deadline))
    }

    /// Pushes at least one of `values` (non-empty) and as many as fit, with one
    /// publication, waiting for room as the wait policy says until `deadline`. Returns how
    /// many were pushed.
    pub(crate) fn push_some_until(
        &mut self,
        values: &[T],
        deadline: Deadline,
    ) -> Result<usize, Blocked> {
        let Self { storage, local, policy, .. } = self;
        let attempt = || try_push_slice_in(storage, local, values).map(|n| (n > 0).then_some(n));
        wait_for(&*storage, Role::Producer, policy, deadline, attempt, || Tick::Idle)
    }
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> spsc::Consumer<T, S> {
    /// Pops up to `out.len()` elements into `out`, oldest first, freeing them with one
    /// store; never blocks. Returns how many (0: empty). Wakes a sleeping producer.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the producer's position is impossible.
    pub fn try_pop_into(&mut self, out: &mut [T]) -> Result<usize, Corrupted> {
        let n = try_pop_into_in(&self.storage, &mut self.local, out)?;
        if n > 0 {
            notify(&self.storage.control().not_full);
        }
        Ok(n)
    }

    /// Pops at least one and up to `out.len()` elements into `out`, waiting for the first
    /// as the wait policy says until `deadline`. Returns how many (0 only for an empty
    /// `out`).
    pub(crate) fn pop_into_until(
        &mut self,
        out: &mut [T],
        deadline: Deadline,
    ) -> Result<usize, PopTimeoutError> {
        if out.is_empty() {
            return Ok(0);
        }
        let Self { storage, local, policy, .. } = self;
        let attempt = || try_pop_into_in(storage, local, out).map(|n| (n > 0).then_some(n));
        wait_for(&*storage, Role::Consumer, policy, deadline, attempt, || Tick::Idle)
            .map_err(PopTimeoutError::from)
    }
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> mpmc::Producer<T, S> {
    /// Pushes as many of `values` as there are free cells for in a row at `tail`, from the
    /// front and at most [`MAX_RUN`], claiming them with one compare-and-swap; never blocks.
    /// Returns how many were pushed (0: full). The elements of a slice stay together and in
    /// order. Wakes sleeping consumers.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when a cell's stamp is impossible.
    pub fn try_push_slice(&self, values: &[T]) -> Result<usize, Corrupted> {
        let n = mpmc::try_push_in(&self.storage, self.capacity, self.hints, values)?;
        if n > 0 {
            notify(&self.storage.control().not_empty);
        }
        Ok(n)
    }

    /// Pushes all of `values`, in runs as room appears, waiting as the wait policy says
    /// until `deadline`. Other producers' elements may fall between two runs. The error
    /// carries how many were pushed.
    pub(crate) fn push_slice_until(
        &self,
        values: &[T],
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<usize>> {
        push_all(values, |rest| self.push_some_until(rest, deadline))
    }
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> mpmc::Consumer<T, S> {
    /// Pops the run of published elements at `head` into `out`, oldest first, up to
    /// `out.len()` and [`MAX_RUN`], claiming them with one compare-and-swap; never blocks.
    /// Returns how many (0: empty). The elements of one run were pushed in this order, and
    /// each producer's own elements keep theirs. Wakes sleeping producers.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when a cell's stamp is impossible.
    pub fn try_pop_into(&self, out: &mut [T]) -> Result<usize, Corrupted> {
        let n = self.pop_run(out)?;
        if n > 0 {
            notify(&self.storage.control().not_full);
        }
        Ok(n)
    }

    /// Pops at least one and up to `out.len()` elements into `out`, waiting for the first
    /// as the wait policy says until `deadline`. While it waits, it adopts the elements of
    /// dead consumers, up to `out.len()` each liveness tick. Returns how many (0 only for
    /// an empty `out`).
    pub(crate) fn pop_into_until(
        &self,
        out: &mut [T],
        deadline: Deadline,
    ) -> Result<usize, PopTimeoutError> {
        if out.is_empty() {
            return Ok(0);
        }
        let out = std::cell::RefCell::new(out);
        self.block_pop(
            deadline,
            || self.pop_run(&mut out.borrow_mut()).map(|n| (n > 0).then_some(n)),
            || {
                let mut out = out.borrow_mut();
                let max = out.len();
                match try_adopt_in(&self.storage, self.capacity, max, fill(&mut out)) {
                    0 => Tick::Idle,
                    n => Tick::Done(n),
                }
            },
        )
    }

    /// One run into `out` (no wake-up).
    fn pop_run(&self, out: &mut [T]) -> Result<usize, Corrupted> {
        let want = out.len().min(MAX_RUN) as u64;
        if want == 0 {
            return Ok(0);
        }
        Ok(mpmc::try_pop_in(&self.storage, self.capacity, want, fill(out))?.unwrap_or(0))
    }
}
