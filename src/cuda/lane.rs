//! Lanes: where the hand-offs that follow a stream run (a pinned sender's publish once its
//! copy into the slot is done, a pinned receiver's return of a slot once the copy out of
//! it is done, a GPU broadcast reader's hold given up once its reads are done), with no
//! caller's thread blocked; and the preallocated entries that hand their arguments over
//! ([`Handoff`]).
//!
//! A copy into or out of pinned memory is truly asynchronous, so the hand-off must follow
//! the stream, not the call: a function run when the copy has completed publishes the
//! descriptor or returns the slot. It runs on a [`Lane`]'s thread (polling an event
//! recorded after the copy), or as a host function (`cuLaunchHostFunc`) on a stream of
//! another context than the lane's. Either way it keeps a host function's rules: it calls
//! no CUDA, and touches only shared-memory atomics, a process-local lock, and (to wake a
//! sleeper) a futex.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering as StdOrdering};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, sys};

use super::CudaError;
use super::driver;

/// Enqueues `f(user)` on `stream`, after the work queued there.
///
/// # Safety
///
/// `f` must not call CUDA nor unwind, and `user` must stay valid until `f` has run.
pub(crate) unsafe fn launch_host_fn(
    stream: &CudaStream,
    f: unsafe extern "C" fn(*mut c_void),
    user: *mut c_void,
) -> Result<(), CudaError> {
    stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: a live stream of a bound context; `f` and `user` as the caller promises.
    let r = unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(f), user) };
    r.result().map_err(driver("cuLaunchHostFunc"))
}

/// Where the hand-off functions run: a thread of this lane's own, which waits for an event
/// recorded after the work they follow and then calls them, in the order they were
/// enqueued.
///
/// The thread polls the event ([`LaneShared::wait_for`]: `cuEventQuery` about every
/// half microsecond for the first [`SPIN_FOR`], then naps of an eighth of the time waited
/// so far), never `cuEventSynchronize` on a blocking-sync event: such an event has the GPU
/// raise an interrupt when it completes, and the interrupt and the wake-up it brings land
/// on whichever CPU the system picks, the CPU of a thread launching kernels included, and
/// stretch its launches (docs/GPU.md). A nap's timer fires on the lane's own CPU. What it
/// costs: a hand-off is noticed up to an eighth later than it completes (past the spin),
/// and a long copy is polled a few dozen times.
///
/// Why not a host function (`cuLaunchHostFunc`): it needs one on a stream of its own, or it
/// holds the work's stream until a driver thread has run it; and with one, each hand-off
/// costs an event record, a stream wait and the host function, which stretches the launch
/// calls of the process's other threads more.
/// A hand-off is one event record and a push under an uncontended lock; the thread is
/// woken (a futex) only when it sleeps for want of work.
///
/// The functions keep a host function's rules (no CUDA, no unwinding, never the last
/// reference to what owns the lane: [`drop_outside_cuda`]), so the thread never drops its
/// own lane.
#[derive(Debug)]
pub(crate) struct Lane {
    shared: Arc<LaneShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a lane and its thread share.
#[derive(Debug)]
struct LaneShared {
    ctx: Arc<CudaContext>,
    // One per slot (no timing, not blocking-sync): recorded after the work, polled by the
    // thread. A slot's event is recorded again only after its function ran (the slot
    // came back).
    events: Box<[sys::CUevent]>,
    queue: std::sync::Mutex<LaneQueue>,
    wake: std::sync::Condvar,
}

#[derive(Debug)]
struct LaneQueue {
    /// (slot, function, its argument); at most one entry per slot, so never above the
    /// capacity it was made with (a push allocates nothing).
    items: std::collections::VecDeque<(usize, unsafe extern "C" fn(*mut c_void), usize)>,
    /// The thread took an entry and has not come back for the next one (its function may
    /// still be running): with `items` empty and this false, every function has returned.
    running: bool,
    /// The thread waits on `wake` for want of work (the pusher wakes it only then).
    sleeping: bool,
    /// The lane is gone: the thread leaves once the queue is empty.
    stop: bool,
}

// SAFETY: driver handles, used from any thread with the context bound; the driver
// serialises calls on one handle. The queue is behind its lock.
unsafe impl Send for LaneShared {}
// SAFETY: as above.
unsafe impl Sync for LaneShared {}

impl Lane {
    /// A lane in `ctx`, with an event for each of `slots` slots, and its thread.
    pub(crate) fn new(ctx: &Arc<CudaContext>, slots: usize) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut shared = LaneShared {
            ctx: ctx.clone(),
            events: Box::new([]),
            queue: std::sync::Mutex::new(LaneQueue {
                items: std::collections::VecDeque::with_capacity(slots),
                running: false,
                sleeping: false,
                stop: false,
            }),
            wake: std::sync::Condvar::new(),
        };
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut events = Vec::with_capacity(slots);
        for _ in 0..slots {
            let mut e = std::ptr::null_mut();
            // SAFETY: out-pointer valid; context bound above.
            let r = unsafe { sys::cuEventCreate(&mut e, flags) };
            if let Err(e) = r.result() {
                shared.events = events.into_boxed_slice(); // destroyed with `shared`
                return Err(driver("cuEventCreate")(e));
            }
            events.push(e);
        }
        shared.events = events.into_boxed_slice();
        let shared = Arc::new(shared);
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gpuring-lane".into())
            .spawn(move || theirs.run())
            .map_err(|_| CudaError::Thread)?;
        Ok(Self { shared, thread: Some(thread) })
    }

    /// The lane in `cell`, made now (in `stream`'s context, with `slots` events) if there is
    /// none yet. Called by the one thread that owns `cell`'s holder.
    pub(crate) fn in_cell<'a>(
        cell: &'a std::sync::OnceLock<Lane>,
        stream: &CudaStream,
        slots: usize,
    ) -> Result<&'a Lane, CudaError> {
        if let Some(lane) = cell.get() {
            return Ok(lane);
        }
        let _ = cell.set(Lane::new(stream.context(), slots)?);
        Ok(cell.get().expect("set just above"))
    }

    /// Has `f(user)` called after the work queued on `stream` so far has completed, by this
    /// lane's thread (marked by slot `slot`'s event); by a host function on `stream` itself
    /// when it belongs to another context.
    ///
    /// # Safety
    ///
    /// As [`launch_host_fn`]; `slot` is one the caller holds.
    pub(crate) unsafe fn launch_after(
        &self,
        stream: &CudaStream,
        slot: usize,
        f: unsafe extern "C" fn(*mut c_void),
        user: *mut c_void,
    ) -> Result<(), CudaError> {
        let ctx = &self.shared.ctx;
        if stream.context().cu_ctx() != ctx.cu_ctx() {
            // SAFETY: as the caller promises.
            return unsafe { launch_host_fn(stream, f, user) };
        }
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let event = self.shared.events[slot];
        // SAFETY: our live event, the caller's live stream, one context.
        let r = unsafe { sys::cuEventRecord(event, stream.cu_stream()) };
        r.result().map_err(driver("cuEventRecord"))?;
        let mut q = self.shared.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        q.items.push_back((slot, f, user as usize));
        if q.sleeping {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Waits, up to `limit`, until every function enqueued on this lane has returned.
    /// Whether they all have.
    pub(crate) fn settle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        // The lock orders what the functions did before the caller goes on.
        while !self.shared.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).idle() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }
}

impl LaneQueue {
    /// Every function enqueued has returned.
    fn idle(&self) -> bool {
        self.items.is_empty() && !self.running
    }
}

/// How long the lane's thread polls an event without sleeping: what a small hand-off
/// takes from the record to its completion, a kernel launch included.
const SPIN_FOR: Duration = Duration::from_micros(20);
/// Between two polls while spinning.
const POLL_EVERY: Duration = Duration::from_nanos(500);
/// The shortest and the longest nap between two polls past the spin.
const NAP: (Duration, Duration) = (Duration::from_micros(4), Duration::from_millis(1));

impl LaneShared {
    /// Whether the work before `event` (recorded before its entry was pushed) has
    /// completed, asked until it has: false when the driver fails (a dead context).
    /// Polls every [`POLL_EVERY`] for [`SPIN_FOR`], then naps an eighth of the time waited
    /// so far, within [`NAP`].
    fn wait_for(&self, event: sys::CUevent) -> bool {
        let start = Instant::now();
        loop {
            // SAFETY: our live event.
            match unsafe { sys::cuEventQuery(event) } {
                sys::CUresult::CUDA_SUCCESS => return true,
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                _ => return false,
            }
            let waited = start.elapsed();
            if waited < SPIN_FOR {
                let until = waited + POLL_EVERY;
                while start.elapsed() < until {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::sleep((waited / 8).clamp(NAP.0, NAP.1));
            }
        }
    }

    /// The lane's thread: each entry's event waited for, then its function called, in
    /// order; leaves when the lane is gone and nothing is left to do.
    fn run(&self) {
        let bound = self.ctx.bind_to_thread().is_ok();
        // Naps as long as asked (the default slack of 50 µs would stretch the shortest
        // ones tenfold). Best effort: without it, naps are only longer.
        super::slack::set_timer_slack(1_000);
        loop {
            let mut q = self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            q.running = false; // back from the previous entry's function
            let (slot, f, user) = loop {
                if let Some(item) = q.items.pop_front() {
                    break item;
                }
                if q.stop {
                    return;
                }
                q.sleeping = true;
                q = self.wake.wait(q).unwrap_or_else(std::sync::PoisonError::into_inner);
                q.sleeping = false;
            };
            q.running = true;
            drop(q);
            let done = bound && self.wait_for(self.events[slot]);
            if done {
                // SAFETY: `f` and `user` as `launch_after`'s caller promised; the work it
                // follows has completed.
                unsafe { f(user as *mut c_void) };
            }
            // A failed wait (a dead context) leaves the entry unserved: its function does
            // not run on work that may not have happened, and what it holds is leaked.
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Never on the lane's own thread: its functions never let go of the last reference
        // to what owns the lane (`drop_outside_cuda`).
        let mut q = self.shared.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        q.stop = true;
        let idle = q.idle();
        self.shared.wake.notify_one();
        drop(q);
        // With work left (past the owner's `settle`), the thread finishes it on its own,
        // holding what it needs; otherwise it is about to leave: wait for it.
        if let Some(t) = self.thread.take()
            && idle
        {
            let _ = t.join();
        }
    }
}

impl Drop for LaneShared {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for &e in self.events.iter() {
            // SAFETY: our events, destroyed once, with no wait on them left (the thread is
            // gone or is the one dropping this).
            let _ = unsafe { sys::cuEventDestroy_v2(e) };
        }
    }
}

/// Lets a host function's reference go. A host function must not call CUDA, and the last
/// reference to what owns a registration or a lane would (its drop): that one is leaked
/// instead (until the process exits). The owners wait for their host functions before they
/// let go (`Lane::settle`), so this happens only past that wait.
pub(crate) fn drop_outside_cuda<T>(last: Arc<T>) {
    if let Some(inner) = Arc::into_inner(last) {
        std::mem::forget(inner);
    }
}

/// Runs `f` on a driver thread: a panic must not unwind into the driver, so it aborts.
pub(crate) fn in_host_fn(f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        std::process::abort();
    }
}

const EMPTY: u32 = 0;
const FULL: u32 = 1;

/// A value handed from the thread that enqueues a host function to that function: `T`,
/// and a reference to `H` (what keeps the entry's memory alive until the function ran).
/// Entries are preallocated, one per slot (a slot has one holder at a time, and the
/// function empties its entry before the slot can be held again), so a hand-off allocates
/// nothing.
pub(crate) struct Handoff<T, H> {
    state: AtomicU32,
    value: UnsafeCell<MaybeUninit<T>>,
    // From `Arc::into_raw`; given back by `take`.
    home: UnsafeCell<*const H>,
}

// SAFETY: the fields are written by one thread before it enqueues the host function, and
// read once by that function after (ordered by `state`); `T` and `Arc<H>` move between
// threads, so they must be `Send` (and `H: Sync` for the `Arc`).
unsafe impl<T: Send, H: Send + Sync> Send for Handoff<T, H> {}
// SAFETY: as above.
unsafe impl<T: Send, H: Send + Sync> Sync for Handoff<T, H> {}

impl<T, H> Handoff<T, H> {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            value: UnsafeCell::new(MaybeUninit::uninit()),
            home: UnsafeCell::new(std::ptr::null()),
        }
    }

    /// `count` empty entries.
    pub(crate) fn entries(count: usize) -> Box<[Self]> {
        (0..count).map(|_| Self::new()).collect()
    }

    /// Fills the entry; its pointer then goes to the host function as `user`.
    ///
    /// # Safety
    ///
    /// The entry is empty, and the caller holds the slot it belongs to (nobody else fills
    /// it).
    pub(crate) unsafe fn fill(&self, value: T, home: Arc<H>) -> *mut c_void {
        // SAFETY: empty and ours, as the caller promises.
        unsafe {
            (*self.value.get()).write(value);
            *self.home.get() = Arc::into_raw(home);
        }
        // Release: pairs with the Acquire swap in `take`: the fields are written before
        // the host function reads them.
        self.state.store(FULL, StdOrdering::Release);
        std::ptr::from_ref(self).cast_mut().cast()
    }

    /// Empties the entry: its value and the reference to its home.
    ///
    /// # Safety
    ///
    /// `user` came from `fill` on a live entry (its home's reference keeps it), and this
    /// is its one `take` (the host function, or the filler when the enqueue failed).
    pub(crate) unsafe fn take(user: *mut c_void) -> (T, Arc<H>) {
        // SAFETY: a live entry, as the caller promises.
        let entry = unsafe { &*user.cast::<Self>() };
        // Acquire: pairs with the Release store in `fill`.
        let was = entry.state.swap(EMPTY, StdOrdering::Acquire);
        assert_eq!(was, FULL, "a hand-off is taken once per fill");
        // SAFETY: written before the Release store that the swap synchronised with; read
        // once (the entry is empty now, and filled again only after the slot came back,
        // which the caller's use of the value below makes happen).
        unsafe { ((*entry.value.get()).assume_init_read(), Arc::from_raw(*entry.home.get())) }
    }
}

impl<T, H> core::fmt::Debug for Handoff<T, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Handoff").field("state", &self.state).finish_non_exhaustive()
    }
}
