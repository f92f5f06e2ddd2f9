//! gpuring's exception classes, defined here and made once when the module is imported:
//! one base, `Error`, and one subclass per kind of failure, each also the built-in
//! exception that means the same where there is one (`Timeout` is a `TimeoutError`,
//! `NotFound` a `FileNotFoundError`, ...). A Rust error is raised as the class [`Class`]
//! names for it, with its message; nothing is looked up by name at run time.

use std::fmt::Display;

use gpuring::{
    AcquireTimeoutError, AttachError, Backend, ChannelError, CudaError, PoolError,
    RecvTimeoutError, SendTimeoutError, ShmError, TryAcquireError, TryRecvError, TrySendError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PyTuple, PyType};

/// The exception classes, in the order of [`Class`], and each one's bases.
macro_rules! classes {
    ($($class:ident($($base:ident),*) [$($builtin:literal),*] $doc:literal;)*) => {
        /// A gpuring exception class (`Empty` and `Full` are raised by `Queue`, in Python).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(dead_code)]
        pub(crate) enum Class {
            $($class,)*
        }

        /// (name, gpuring bases, built-in bases, docstring) of each class, in order.
        const CLASSES: &[(&str, &[Class], &[&str], &str)] = &[
            $((stringify!($class), &[$(Class::$base),*], &[$($builtin),*], $doc),)*
        ];
    };
}

classes! {
    Error() ["Exception"] "Base class of every gpuring error.";
    Timeout(Error) ["TimeoutError"] "A blocking call gave up at its timeout (nothing was sent or received).";
    Empty(Timeout) ["queue.Empty"] "``Queue.get``: nothing arrived in time (also a ``queue.Empty``, as ``torch.multiprocessing.Queue`` raises).";
    Full(Timeout) ["queue.Full"] "``Queue.put``: no slot or ring room in time (also a ``queue.Full``).";
    PeerDead(Error) [] "Every peer this call waits for has died (noticed within ~30 ms of waiting). A receiver gets it once everything the dead senders published has been received; a sender, when the ring is full and every receiver has died.";
    Disconnected(Error) [] "Every peer left cleanly: for a receiver, every sender left and everything they sent was received (the channel's end, seen at once); for a sender, every receiver left. Not for ever: a peer that attaches later makes the channel work again.";
    SenderGone(Error) [] "GPU channels: the message's sender left or died, and its device memory with it; the message was dropped unread. The next ``recv`` carries on.";
    Lagged(Error) [] "Lagging broadcast channels (``lagging=True``): this receiver fell behind and the sender, which never waits for it, reused the slots of ``missed`` messages before it read them (the exception's ``missed`` attribute). The next ``recv`` goes on with the oldest message still there.";
    Corrupted(Error) [] "A value read from shared memory is impossible (a corrupt segment, or a descriptor that does not match its pool). A bad descriptor is dropped; the next ``recv`` carries on.";
    ShmError(Error) ["OSError"] "A shared-memory segment could not be created or opened: not a gpuring channel, of another owner, of another layout version, and the like.";
    NotFound(ShmError) ["FileNotFoundError"] "No channel of this name exists (within the open timeout).";
    AlreadyExists(ShmError) ["FileExistsError"] "``Channel.create``: a channel (or another object) of this name exists.";
    NoSpace(ShmError) [] "``/dev/shm`` (or memory) cannot hold the slots asked for; checked and reserved at create, never a crash later.";
    AttachError(Error) [] "An endpoint could not attach: the one sender or receiver of an SPSC channel is taken by a live process, or every participant entry is in use.";
    ConfigError(Error) ["ValueError"] "An option is out of range (capacity, slots, slot size, name, max_senders, ready, ...), or the pool table is full (raise ``max_senders``).";
    WrongBackend(ConfigError) [] "The channel keeps its slots elsewhere than asked: ``device=None`` opened a GPU channel, or ``device=N`` a host one.";
    DTypeError(Error) ["TypeError"] "A tensor or array whose element type gpuring does not carry, or an object that is neither a tensor nor an array (no ``__dlpack__``).";
    TooLarge(Error) ["ValueError"] "A tensor spans more bytes than a slot holds (or more dimensions than 8).";
    Closed(Error) ["ValueError"] "The channel, sender, receiver, lease or message was closed (or sent, or released) by this process, and cannot be used any more.";
    CudaError(Error) [] "A CUDA driver call failed, or there is no CUDA driver here.";
    PicklingError(Error) ["pickle.PicklingError"] "``Queue.put`` / ``Sender.send_object``: a part of the object cannot be pickled; nothing was sent (also a ``pickle.PicklingError``).";
}

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Makes the classes (once) and adds them to `module`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    for (class, ty) in CLASSES.iter().zip(types(py)?) {
        module.add(class.0, ty.bind(py))?;
    }
    Ok(())
}

/// The classes, made on first use: `type(name, bases, {"__doc__": ..., "__module__":
/// "gpuring.errors"})`, each after its gpuring bases.
fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let make_type = builtins.getattr("type")?;
        let mut made: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
        for (name, ours, builtin, doc) in CLASSES {
            let mut bases: Vec<Bound<'_, PyAny>> =
                ours.iter().map(|c| made[*c as usize].bind(py).clone().into_any()).collect();
            for b in *builtin {
                bases.push(match b.split_once('.') {
                    Some((module, attr)) => py.import(module)?.getattr(attr)?,
                    None => builtins.getattr(*b)?,
                });
            }
            let dict = PyDict::new(py);
            dict.set_item("__doc__", *doc)?;
            dict.set_item("__module__", "gpuring.errors")?;
            let ty = make_type.call1((*name, PyTuple::new(py, bases)?, dict))?;
            made.push(ty.cast_into::<PyType>()?.unbind());
        }
        Ok(made)
    })
}

/// An error to raise: its class and message (made without the GIL; raised with it).
#[derive(Debug)]
pub(crate) struct Raised {
    pub(crate) class: Class,
    pub(crate) msg: String,
    /// `Lagged`: the messages missed (the exception's `missed` attribute).
    pub(crate) missed: Option<u64>,
}

impl Raised {
    pub(crate) fn new(class: Class, msg: impl Display) -> Self {
        Self { class, msg: msg.to_string(), missed: None }
    }

    /// The Python exception.
    pub(crate) fn into_err(self, py: Python<'_>) -> PyErr {
        let made = types(py).and_then(|types| {
            let class = types[self.class as usize].bind(py);
            let Some(missed) = self.missed else {
                return Ok(PyErr::from_type(class.clone(), (self.msg,)));
            };
            let exc = class.call1((self.msg,))?;
            exc.setattr("missed", missed)?;
            Ok(PyErr::from_value(exc))
        });
        made.unwrap_or_else(|e| e)
    }
}

/// An exception of class `class` saying `msg`.
pub(crate) fn raise(py: Python<'_>, class: Class, msg: impl Display) -> PyErr {
    Raised::new(class, msg).into_err(py)
}

impl<B: gpuring::Backend> ClassOf for gpuring::RequeueError<B> {
    fn class(&self) -> Class {
        match self {
            gpuring::RequeueError::Device(..) => Class::CudaError,
            _ => Class::ConfigError,
        }
    }
}

/// The class that stands for a Rust error.
pub(crate) trait ClassOf: Display {
    fn class(&self) -> Class;

    /// The error and its class, to raise later.
    fn raised(&self) -> Raised {
        Raised::new(self.class(), self)
    }

    /// The Python exception.
    fn err(&self, py: Python<'_>) -> PyErr {
        self.raised().into_err(py)
    }
}

impl ClassOf for ShmError {
    fn class(&self) -> Class {
        match self {
            ShmError::NotFound { .. } => Class::NotFound,
            ShmError::AlreadyExists { .. } => Class::AlreadyExists,
            ShmError::NoSpace { .. } => Class::NoSpace,
            ShmError::InvalidName { .. } => Class::ConfigError,
            ShmError::Corrupted(_) => Class::Corrupted,
            _ => Class::ShmError,
        }
    }
}

impl ClassOf for AttachError {
    fn class(&self) -> Class {
        match self {
            AttachError::Corrupted(_) => Class::Corrupted,
            _ => Class::AttachError,
        }
    }
}

impl ClassOf for CudaError {
    fn class(&self) -> Class {
        Class::CudaError
    }
}

impl<B: Backend> ClassOf for ChannelError<B> {
    fn class(&self) -> Class {
        match self {
            ChannelError::Segment(s) => s.class(),
            ChannelError::Attach(a) => a.class(),
            ChannelError::WrongBackend { .. } => Class::WrongBackend,
            ChannelError::Device(_) => Class::CudaError,
            ChannelError::Corrupted(_) => Class::Corrupted,
            // InvalidCapacity, InvalidPool, InvalidConfig, PoolTableFull, and what comes.
            _ => Class::ConfigError,
        }
    }
}

impl<B: Backend> ClassOf for AcquireTimeoutError<B> {
    fn class(&self) -> Class {
        match self {
            AcquireTimeoutError::Timeout => Class::Timeout,
            AcquireTimeoutError::Corrupted(_) => Class::Corrupted,
            AcquireTimeoutError::Device(_) => Class::CudaError,
            AcquireTimeoutError::PeerDead => Class::PeerDead,
            AcquireTimeoutError::Disconnected => Class::Disconnected,
            _ => Class::Error,
        }
    }
}

impl<B: Backend> ClassOf for SendTimeoutError<B> {
    fn class(&self) -> Class {
        match self {
            SendTimeoutError::Timeout(_) => Class::Timeout,
            SendTimeoutError::TooLarge { .. } => Class::TooLarge,
            SendTimeoutError::Corrupted(_) => Class::Corrupted,
            SendTimeoutError::Device(_) => Class::CudaError,
            SendTimeoutError::PeerDead(_) => Class::PeerDead,
            SendTimeoutError::Disconnected(_) => Class::Disconnected,
            _ => Class::Error,
        }
    }
}

impl<B: Backend> ClassOf for RecvTimeoutError<B> {
    fn class(&self) -> Class {
        match self {
            RecvTimeoutError::Timeout => Class::Timeout,
            RecvTimeoutError::Corrupted(_) => Class::Corrupted,
            // The pool's trouble, in the class of that trouble.
            RecvTimeoutError::Pool(PoolError::Segment(s)) => s.class(),
            RecvTimeoutError::Pool(PoolError::Attach(a)) => a.class(),
            RecvTimeoutError::Device(_) => Class::CudaError,
            RecvTimeoutError::PeerDead => Class::PeerDead,
            RecvTimeoutError::Disconnected => Class::Disconnected,
            RecvTimeoutError::SenderGone => Class::SenderGone,
            RecvTimeoutError::Lagged(_) => Class::Lagged,
            _ => Class::Error,
        }
    }

    fn raised(&self) -> Raised {
        let missed = match self {
            RecvTimeoutError::Lagged(n) => Some(*n),
            _ => None,
        };
        Raised { missed, ..Raised::new(self.class(), self) }
    }
}

// The one-try forms, which a wait's first step (the GIL held) uses: their "nothing now"
// (`Exhausted`, `Full`, `Empty`) means "wait", never raised; the rest as their wait forms.

impl<B: Backend> ClassOf for TryAcquireError<B> {
    fn class(&self) -> Class {
        match self {
            TryAcquireError::Exhausted => Class::Timeout,
            TryAcquireError::Corrupted(_) => Class::Corrupted,
            TryAcquireError::Device(_) => Class::CudaError,
            TryAcquireError::PeerDead => Class::PeerDead,
            TryAcquireError::Disconnected => Class::Disconnected,
            _ => Class::Error,
        }
    }
}

impl<B: Backend> ClassOf for TrySendError<B> {
    fn class(&self) -> Class {
        match self {
            TrySendError::Full(_) => Class::Timeout,
            TrySendError::TooLarge { .. } => Class::TooLarge,
            TrySendError::Corrupted(_) => Class::Corrupted,
            TrySendError::Device(_) => Class::CudaError,
            TrySendError::PeerDead(_) => Class::PeerDead,
            TrySendError::Disconnected(_) => Class::Disconnected,
            _ => Class::Error,
        }
    }
}

impl<B: Backend> ClassOf for TryRecvError<B> {
    fn class(&self) -> Class {
        match self {
            TryRecvError::Empty => Class::Timeout,
            TryRecvError::Corrupted(_) => Class::Corrupted,
            TryRecvError::Pool(PoolError::Segment(s)) => s.class(),
            TryRecvError::Pool(PoolError::Attach(a)) => a.class(),
            TryRecvError::Device(_) => Class::CudaError,
            TryRecvError::PeerDead => Class::PeerDead,
            TryRecvError::Disconnected => Class::Disconnected,
            TryRecvError::SenderGone => Class::SenderGone,
            TryRecvError::Lagged(_) => Class::Lagged,
            _ => Class::Error,
        }
    }

    fn raised(&self) -> Raised {
        let missed = match self {
            TryRecvError::Lagged(n) => Some(*n),
            _ => None,
        };
        Raised { missed, ..Raised::new(self.class(), self) }
    }
}

/// A call on something this process closed.
pub(crate) fn closed(py: Python<'_>, what: &str) -> PyErr {
    raise(py, Class::Closed, format!("the {what} is closed"))
}

/// Extractors of the integer arguments (`from_py_with`): a value that is not a
/// non-negative integer of the argument's range raises `ConfigError` (a `gpuring.Error` and
/// a `ValueError`), named after the argument, rather than the interpreter's bare
/// `OverflowError` or `TypeError`.
macro_rules! uint_args {
    ($($fn_name:ident -> $ty:ty, $what:literal;)*) => {
        $(
            pub(crate) fn $fn_name(obj: &Bound<'_, PyAny>) -> PyResult<$ty> {
                let out_of_range = || {
                    raise(
                        obj.py(),
                        Class::ConfigError,
                        format!(
                            "{}={}: must be an integer in 0..={}",
                            $what,
                            obj.repr().map_or_else(|_| "?".into(), |r| r.to_string()),
                            <$ty>::MAX
                        ),
                    )
                };
                match obj.extract::<i128>() {
                    Ok(v) => <$ty>::try_from(v).map_err(|_| out_of_range()),
                    Err(_) => Err(out_of_range()),
                }
            }
        )*
    };
}

uint_args! {
    capacity_arg -> u64, "capacity";
    slots_arg -> u32, "slots";
    slot_bytes_arg -> u64, "slot_bytes";
    max_senders_arg -> u32, "max_senders";
    spins_arg -> u32, "spins";
    yields_arg -> u32, "yields";
    tag_arg -> u64, "tag";
}

/// The same for arguments that may be `None`.
macro_rules! opt_uint_args {
    ($($fn_name:ident => $inner:ident -> $ty:ty;)*) => {
        $(
            pub(crate) fn $fn_name(obj: &Bound<'_, PyAny>) -> PyResult<Option<$ty>> {
                if obj.is_none() { Ok(None) } else { $inner(obj).map(Some) }
            }
        )*
    };
}

opt_uint_args! {
    opt_max_senders_arg => max_senders_arg -> u32;
    opt_spins_arg => spins_arg -> u32;
    opt_yields_arg => yields_arg -> u32;
}
