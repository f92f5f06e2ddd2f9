//! Rust errors as Python exceptions. The classes live in `gpuring/errors.py` (Python, so
//! that they can also be `TimeoutError`, `FileNotFoundError`, ...); each is raised with the
//! Rust error's message.

use std::fmt::Display;

use gpuring::{AcquireError, AttachError, ChannelError, CudaError, RecvError, SendError, ShmError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `class` (a name in `gpuring.errors`) saying `msg`.
pub(crate) fn raise(py: Python<'_>, class: &str, msg: impl Display) -> PyErr {
    let cls = ERRORS
        .get_or_try_init(py, || py.import("gpuring.errors").map(Bound::unbind))
        .and_then(|m| m.bind(py).getattr(class))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match cls {
        Ok(cls) => PyErr::from_type(cls, (msg.to_string(),)),
        Err(e) => e,
    }
}

/// The class for a segment error.
fn shm_class(e: &ShmError) -> &'static str {
    match e {
        ShmError::NotFound { .. } => "NotFound",
        ShmError::AlreadyExists { .. } => "AlreadyExists",
        ShmError::NoSpace { .. } => "NoSpace",
        ShmError::InvalidName { .. } => "ConfigError",
        ShmError::Corrupted(_) => "Corrupted",
        _ => "ShmError",
    }
}

fn attach_class(e: &AttachError) -> &'static str {
    match e {
        AttachError::Corrupted(_) => "Corrupted",
        _ => "AttachError",
    }
}

/// `create`, `open`, `sender()`, `receiver()`.
pub(crate) fn channel(py: Python<'_>, e: ChannelError) -> PyErr {
    raise(py, channel_class(&e), e)
}

fn channel_class(e: &ChannelError) -> &'static str {
    match e {
        ChannelError::Segment(s) => shm_class(s),
        ChannelError::Attach(a) => attach_class(a),
        ChannelError::WrongBackend { .. } => "WrongBackend",
        ChannelError::Cuda(_) => "CudaError",
        ChannelError::Corrupted(_) => "Corrupted",
        // InvalidCapacity, InvalidPool, InvalidConfig, PoolTableFull, and what comes.
        _ => "ConfigError",
    }
}

pub(crate) fn acquire(py: Python<'_>, e: AcquireError) -> PyErr {
    let class = match &e {
        AcquireError::Exhausted | AcquireError::Timeout => "Timeout",
        AcquireError::Corrupted(_) => "Corrupted",
        AcquireError::Cuda(_) => "CudaError",
        AcquireError::PeerDead => "PeerDead",
        AcquireError::Disconnected => "Disconnected",
        _ => "Error",
    };
    raise(py, class, e)
}

/// The class and message of a send error (made without the GIL; raised with [`raise`]).
pub(crate) fn send_parts<L>(e: &SendError<L>) -> (&'static str, String) {
    let class = match e {
        SendError::Full(_) | SendError::Timeout(_) => "Timeout",
        SendError::TooLarge { .. } => "TooLarge",
        SendError::Corrupted(_) => "Corrupted",
        SendError::Cuda(_) => "CudaError",
        SendError::PeerDead(_) => "PeerDead",
        SendError::Disconnected(_) => "Disconnected",
        _ => "Error",
    };
    (class, e.to_string())
}

pub(crate) fn recv(py: Python<'_>, e: RecvError) -> PyErr {
    let class = match &e {
        RecvError::Empty | RecvError::Timeout => "Timeout",
        RecvError::Corrupted(_) => "Corrupted",
        // The pool's trouble, in the class of that trouble.
        RecvError::Pool(c) => channel_class(c),
        RecvError::Cuda(_) => "CudaError",
        RecvError::PeerDead => "PeerDead",
        RecvError::Disconnected => "Disconnected",
        RecvError::SenderGone => "SenderGone",
        _ => "Error",
    };
    raise(py, class, e)
}

pub(crate) fn cuda(py: Python<'_>, e: CudaError) -> PyErr {
    raise(py, "CudaError", e)
}

/// A call on something this process closed.
pub(crate) fn closed(py: Python<'_>, what: &str) -> PyErr {
    raise(py, "Closed", format!("the {what} is closed"))
}
