//! Where a channel's slots live, as a type parameter: [`Host`] (shared memory, the
//! default) or `Cuda` (device memory, feature `cuda`, in `gpu.rs`).
//!
//! A `Channel<B>`, `Sender<B>`, `Receiver<B>`, `Lease<B>` and `Message<B>` are written
//! once; what differs between backends is the sealed trait below: how a sender makes its
//! pool and lets it go, how a receiver imports one and checks a descriptor's backend
//! fields, what a lease and a message hold to reach their slot. A host call on a GPU
//! channel (or the reverse) does not compile, and opening a channel with the wrong backend
//! is a typed error at `open` ([`ChannelError::WrongBackend`]).

use std::ptr::NonNull;

use super::error::{ChannelError, RecvError};
use crate::descriptor::Descriptor;
use crate::layout::{BACKEND_HOST, Corrupted};
use crate::liveness::{ProcessState, process_state};
use crate::pool::{CudaError, PoolSegment};

/// Where a channel's slots live: [`Host`] or `Cuda` (feature `cuda`). Sealed: the crate
/// defines the two there are.
///
/// The backend is part of every channel type, so a host call on a GPU channel does not
/// compile (and opening a channel with the other backend's builder is a typed error):
///
/// ```compile_fail
/// fn lease(tx: &gpuring::Sender<gpuring::Cuda>) {
///     let _ = tx.acquire(); // a host lease of device slots: no such method
/// }
/// ```
///
/// Generic code over both takes `B: Backend`:
///
/// ```
/// fn describe<B: gpuring::Backend>(rx: &gpuring::Receiver<B>) -> String {
///     format!("{rx:?}")
/// }
/// ```
pub trait Backend: sealed::Backend {}

impl<B: sealed::Backend> Backend for B {}

pub(crate) mod sealed {
    use super::*;

    /// What a backend provides to the generic channel code. See the module docs.
    pub trait Backend: Sized + Send + Sync + 'static {
        /// The code the channel header and pool table record.
        const CODE: u32;
        /// How errors name it.
        const NAME: &'static str;
        /// What a channel handle of this backend carries (the CUDA context).
        type Context: Clone + core::fmt::Debug + Send + Sync;
        /// What a sender owns besides its pool segment (the device allocation).
        type Exported: core::fmt::Debug + Send + Sync;
        /// What a receiver keeps per pool it has seen (the imported allocation).
        type Imported: Clone + core::fmt::Debug;
        /// What a lease holds to reach its slot.
        type LeaseSlot: core::fmt::Debug + Send;
        /// What a message holds to reach its slot; dropped before the slot goes back.
        type MessageSlot: core::fmt::Debug + Send;

        /// Makes a sender's pool: the segment `name` with `slot_count` slots of `slot_size`
        /// bytes, and what else the backend needs.
        fn create_pool(
            ctx: &Self::Context,
            name: &str,
            slot_count: u32,
            slot_size: u64,
        ) -> Result<(PoolSegment, Self::Exported), ChannelError>;

        /// A sender leaves; its pool is closed.
        fn retire(exported: Self::Exported, pool: &PoolSegment);

        /// Whether a slot held by a receiver whose liveness lock is gone (its process
        /// `pid` died) may be reused now.
        fn holder_gone(pid: u32) -> bool;

        /// A receiver sees pool `seg` for the first time.
        fn import(ctx: &Self::Context, seg: &PoolSegment) -> Result<Self::Imported, RecvError>;

        /// The checks of a descriptor's backend fields against its pool, after the common
        /// ones and before the slot is taken.
        fn check(imported: &Self::Imported, d: &Descriptor) -> Result<(), Corrupted>;

        /// Whether messages of pool `seg` are refused, unread: before the pool is imported,
        /// and after each slot is taken. Host memory outlives its sender (never); device
        /// memory does not (a retired pool, see `pool::cuda`).
        fn refuse(seg: &PoolSegment) -> Result<(), RecvError> {
            let _ = seg;
            Ok(())
        }

        /// Writes the descriptor's backend fields for a send of `lease`'s slot `slot`
        /// (after enqueueing what the send needs on the device).
        fn fill(lease: &Self::LeaseSlot, slot: u32, d: &mut Descriptor) -> Result<(), CudaError>;
    }
}

/// Slots in host shared memory: the default backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host;

/// What a host channel handle carries: the CUDA context its pools are pinned with, when it
/// was made with `pinned(&ctx)` (feature `cuda`). Not nameable outside the crate.
#[derive(Debug, Clone, Default)]
pub struct HostContext {
    #[cfg(feature = "cuda")]
    pub(crate) pinned: Option<std::sync::Arc<crate::pool::cuda::CudaContext>>,
}

/// A host slot's bytes, inside the pool's mapping (kept alive by the lease or message).
#[derive(Debug)]
pub struct HostSlot {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

// SAFETY: the bytes of one slot, which the lease protocol gives to one holder at a time;
// nothing in it is tied to a thread.
unsafe impl Send for HostSlot {}
// SAFETY: shared references give only `&[u8]` (see `Lease` and `Message`).
unsafe impl Sync for HostSlot {}

impl sealed::Backend for Host {
    const CODE: u32 = BACKEND_HOST;
    const NAME: &'static str = "host";
    type Context = HostContext;
    type Exported = ();
    // Why this process could not pin the pool (`pinned(&ctx)`), if it could not: the pool
    // is read unpinned then (pinning is a matter of speed, and the message is there).
    type Imported = Option<CudaError>;
    type LeaseSlot = HostSlot;
    type MessageSlot = HostSlot;

    fn create_pool(
        ctx: &HostContext,
        name: &str,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<(PoolSegment, ()), ChannelError> {
        let pool = PoolSegment::create(name, BACKEND_HOST, slot_count, slot_size, |_, _| {})?;
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &ctx.pinned {
            if let Err(e) = pool.pin(cuda) {
                pool.close(); // nothing was leased: this unlinks it
                return Err(ChannelError::Cuda(e));
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = ctx;
        Ok((pool, ()))
    }

    fn retire(_: (), _: &PoolSegment) {}

    fn holder_gone(_pid: u32) -> bool {
        // Its lock is gone, so it runs no more code: its slots are free to reuse at once.
        true
    }

    fn import(ctx: &HostContext, seg: &PoolSegment) -> Result<Option<CudaError>, RecvError> {
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &ctx.pinned {
            return Ok(seg.pin(cuda).err());
        }
        let _ = (ctx, seg);
        Ok(None)
    }

    fn check(_: &Option<CudaError>, d: &Descriptor) -> Result<(), Corrupted> {
        if d.device_ordinal != -1 {
            return Err(Corrupted { what: "descriptor names a device, the pool is host memory" });
        }
        Ok(())
    }

    fn fill(_: &HostSlot, _: u32, _: &mut Descriptor) -> Result<(), CudaError> {
        Ok(())
    }
}

/// Whether a dead receiver's device slots may be reused: only once its process has exited
/// (gone, or a zombie), when the driver has torn its context down, so that no kernel of it
/// can still touch the slot. Unknown counts as not exited.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn process_exited(pid: u32) -> bool {
    process_state(pid) == ProcessState::Exited
}
