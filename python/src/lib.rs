//! `gpuring._gpuring`: the Python extension of gpuring, a thin layer over the Rust API
//! (the `gpuring` package in `gpuring/` re-exports it and adds `Queue`).
//!
//! | file | what |
//! |---|---|
//! | `channel.rs` | `Channel`: create, open, senders and receivers |
//! | `sender.rs` | `Sender` (`send` copies a tensor into a slot), `Lease` (fill in place) |
//! | `receiver.rs` | `Receiver`, `Message` (a zero-copy view, exported by DLPack) |
//! | `tree.rs` | plain trees (tuples, lists, dicts, scalars, tensors) as one message, no pickle |
//! | `dlpack.rs` | DLPack both ways: reading a caller's tensor, exporting a slot |
//! | `gpu.rs` | contexts, torch's current stream, copies, ordering streams |
//! | `gather.rs`, `kernels/` | one kernel launch copying a message's CUDA tensors into its slot |
//! | `blocking.rs` | waits with the GIL released, in slices, interruptible |
//! | `dtypes.rs`, `errors.rs` | dtype names; gpuring's exception classes, and which stands for each Rust error |
//!
//! Tensors cross by DLPack only: no pickle, no copy beyond the one `send` makes (and
//! none for a lease).

use pyo3::prelude::*;

mod blocking;
mod channel;
mod dlpack;
mod dtypes;
mod errors;
mod gather;
mod gpu;
mod receiver;
mod sender;
mod tree;

/// Whether a CUDA driver is present and initialises here.
#[pyfunction]
fn cuda_available(py: Python<'_>) -> bool {
    py.detach(gpuring::cuda::available)
}

/// CUDA IPC handles this process has opened (memory and event handles together): a
/// receiver opens a sender's pool once, on first sight, never per message.
#[pyfunction]
fn ipc_opens() -> u64 {
    gpuring::cuda::ipc_opens()
}

/// The element type names gpuring carries, as numpy and torch name them.
#[pyfunction(name = "dtypes")]
fn dtype_names() -> Vec<&'static str> {
    dtypes::NAMES.iter().map(|(_, n)| *n).collect()
}

/// Removes the segments nobody uses whose names start with `prefix` (see
/// `gpuring::inspect::clean`, as `gpuring clean`): returns `(name, why)` of each.
#[pyfunction]
#[pyo3(signature = (prefix, queued = false, dry_run = false))]
fn clean(
    py: Python<'_>,
    prefix: &str,
    queued: bool,
    dry_run: bool,
) -> PyResult<Vec<(String, String)>> {
    use errors::ClassOf;
    use gpuring::inspect::{self, CleanReason};
    let removed = py
        .detach(|| inspect::clean(dry_run, queued, prefix))
        .map_err(|e| e.raised().into_err(py))?;
    let why = |w: CleanReason| match w {
        CleanReason::OtherVersion => "other-version",
        CleanReason::NeverInitialized => "never-initialized",
        CleanReason::LeftOver => "left-over",
        CleanReason::Queued(_) => "queued",
        CleanReason::UnreadablePositions => "unreadable",
        CleanReason::OrphanedPool => "orphaned-pool",
        _ => "other",
    };
    Ok(removed.into_iter().map(|c| (c.name, why(c.why).to_owned())).collect())
}

#[pymodule]
fn _gpuring(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<channel::PyChannel>()?;
    m.add_class::<sender::PySender>()?;
    m.add_class::<sender::PyLease>()?;
    m.add_class::<receiver::PyReceiver>()?;
    m.add_class::<receiver::PyMessage>()?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(ipc_opens, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(clean, m)?)?;
    m.add_function(wrap_pyfunction!(receiver::torch_views, m)?)?;
    m.add_function(wrap_pyfunction!(receiver::copies, m)?)?;
    m.add("MAX_DIMS", gpuring::MAX_DIMS)?;
    m.add("SLOT_HEADER_SIZE", gpuring::SLOT_HEADER_SIZE)?;
    errors::register(m)?;
    Ok(())
}
