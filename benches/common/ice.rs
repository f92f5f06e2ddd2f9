//! iceoryx2 publish-subscribe as the benchmarks use it: one node per process, services with
//! one publisher and one subscriber, no history, no overflow (a full subscriber buffer makes
//! the publisher retry, as a full gpuring ring makes the sender wait), and event services
//! for a sleeping peer (iceoryx2's idiom: send the sample, then notify the listener).
//!
//! Both processes call the same functions with the same settings (`open_or_create`), so
//! either may come first; [`wait_until`] holds the sender until the other side's port
//! exists, because iceoryx2 delivers a sample only to subscribers connected when it is sent.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::Notifier;
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

/// The service flavour: inter-process, ports used from one thread.
pub type Ipc = ipc::Service;
/// A publish-subscribe service of `T`.
pub type Service<T> = PubSub<Ipc, T, ()>;

/// This process's iceoryx2 node (errors only in its log).
pub fn node() -> Node<Ipc> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new().create::<Ipc>().expect("iceoryx2 node")
}

/// Publish-subscribe service `name` carrying `N` bytes, its subscriber buffering up to
/// `depth` samples.
pub fn array_service<const N: usize>(
    node: &Node<Ipc>,
    name: &str,
    depth: usize,
) -> Service<[u8; N]> {
    settings::<[u8; N]>(node, name, depth)
        .open_or_create()
        .expect("iceoryx2 publish-subscribe service")
}

/// The same carrying a `u64` (acknowledgements).
pub fn u64_service(node: &Node<Ipc>, name: &str, depth: usize) -> Service<u64> {
    settings::<u64>(node, name, depth).open_or_create().expect("iceoryx2 publish-subscribe service")
}

/// The same for a variable-length payload of bytes (`publisher_builder` then sets the
/// largest length with `initial_max_slice_len`).
pub fn slice_service(node: &Node<Ipc>, name: &str, depth: usize) -> Service<[u8]> {
    settings::<[u8]>(node, name, depth)
        .open_or_create()
        .expect("iceoryx2 publish-subscribe service")
}

/// A byte-slice service with up to `subscribers` subscribers (fan-out), each buffering up
/// to `depth` samples.
pub fn fanout_service(
    node: &Node<Ipc>,
    name: &str,
    depth: usize,
    subscribers: usize,
) -> Service<[u8]> {
    settings::<[u8]>(node, name, depth)
        .max_subscribers(subscribers)
        .open_or_create()
        .expect("iceoryx2 publish-subscribe service")
}

fn settings<T: Debug + IceoryxSend + ?Sized>(
    node: &Node<Ipc>,
    name: &str,
    depth: usize,
) -> iceoryx2::service::builder::publish_subscribe::Builder<T, (), Ipc> {
    node.service_builder(&name.try_into().expect("service name"))
        .publish_subscribe::<T>()
        .max_publishers(1)
        .max_subscribers(1)
        .history_size(0)
        .subscriber_max_buffer_size(depth)
        .enable_safe_overflow(false)
}

/// The publisher of `service`: a full subscriber buffer makes it retry, as a full gpuring
/// ring makes a sender wait.
pub fn publisher<T: Debug + ZeroCopySend + 'static>(service: &Service<T>) -> Publisher<Ipc, T, ()> {
    service
        .publisher_builder()
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .expect("iceoryx2 publisher")
}

/// Loans a sample of `size` bytes (at least 16) from `tx` and writes, in place, `seq` at
/// both ends and `ack` at byte 8 (asking the consumer to acknowledge); the rest keeps
/// whatever earlier samples left. Ready to send.
pub fn numbered_sample(
    tx: &Publisher<Ipc, [u8], ()>,
    size: usize,
    seq: u64,
    ack: bool,
) -> iceoryx2::sample_mut::SampleMut<Ipc, [u8], ()> {
    let mut sample = tx.loan_slice_uninit(size).unwrap();
    let bytes = sample.payload_mut();
    for (k, b) in seq.to_le_bytes().iter().enumerate() {
        bytes[k].write(*b);
        bytes[size - 8 + k].write(*b);
    }
    bytes[8].write(u8::from(ack));
    // The producer writes in place, as gpuring's does: the sample lies in iceoryx2's
    // shared-memory data segment, a mapping the kernel zero-filled and that only ever holds
    // bytes (those not written here keep an earlier sample's).
    // SAFETY: so every byte of the sample is initialised, and any byte is a `u8`.
    unsafe { sample.assume_init() }
}

/// A subscriber's loop: takes items of `size` bytes from `rx`, each with its sequence
/// number at both ends (checked), runs `each` on it, and acknowledges on `ack` (the count
/// so far) an item whose byte 8 is 1; until the empty stop item.
pub fn numbered_subscriber(
    rx: &Subscriber<Ipc, [u8], ()>,
    ack: &Publisher<Ipc, u64, ()>,
    size: usize,
    mut each: impl FnMut(&[u8]),
) {
    let mut expected = 0u64;
    loop {
        let Some(m) = rx.receive().unwrap() else {
            std::hint::spin_loop();
            continue;
        };
        if m.is_empty() {
            return; // the stop item
        }
        each(&m);
        let seq = expected.to_le_bytes();
        assert!(m.len() == size && m[..8] == seq && m[size - 8..] == seq, "bad item");
        expected += 1;
        if m[8] == 1 {
            ack.send_copy(expected).unwrap();
        }
    }
}

/// Waits (spinning) for an acknowledgement on `acks` and returns the count it carries.
pub fn next_ack(acks: &Subscriber<Ipc, u64, ()>) -> u64 {
    loop {
        if let Some(a) = acks.receive().unwrap() {
            return *a;
        }
        std::hint::spin_loop();
    }
}

/// The listener of event service `name` (this process sleeps on it).
pub fn listener(node: &Node<Ipc>, name: &str) -> Listener<Ipc> {
    event(node, name).listener_builder().create().expect("iceoryx2 listener")
}

/// A notifier of event service `name` (wakes the other process).
pub fn notifier(node: &Node<Ipc>, name: &str) -> Notifier<Ipc> {
    event(node, name).notifier_builder().create().expect("iceoryx2 notifier")
}

fn event(node: &Node<Ipc>, name: &str) -> iceoryx2::service::port_factory::event::PortFactory<Ipc> {
    node.service_builder(&name.try_into().expect("service name"))
        .event()
        .max_notifiers(1)
        .max_listeners(1)
        .open_or_create()
        .expect("iceoryx2 event service")
}

/// Spins (politely) until `ready`, failing after 30 s: the other process did not come up.
pub fn wait_until(mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "iceoryx2 peer did not connect within 30 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `service` has a subscriber (the peer's).
pub fn wait_for_subscriber<T: Debug + IceoryxSend + ?Sized>(service: &Service<T>) {
    wait_until(|| service.dynamic_config().number_of_subscribers() > 0);
}

/// One side of a ping-pong of `N`-byte samples over services `{name}-ping` and
/// `{name}-pong` (64 deep): the bench sends pings and receives pongs, the echo (`echo`) the
/// other way round. With `sleep`, each side sleeps on its listener between samples and
/// wakes the other's after sending (iceoryx2's idiom).
pub struct PingPong<const N: usize> {
    /// The service this side publishes on (to wait for the other side's subscriber).
    pub out: Service<[u8; N]>,
    tx: Publisher<Ipc, [u8; N], ()>,
    rx: Subscriber<Ipc, [u8; N], ()>,
    wake: Option<(Listener<Ipc>, Notifier<Ipc>)>,
    _node: Node<Ipc>,
}

impl<const N: usize> PingPong<N> {
    /// This process's side.
    pub fn new(name: &str, echo: bool, sleep: bool) -> Self {
        let node = node();
        let [ping, pong] =
            ["ping", "pong"].map(|s| array_service::<N>(&node, &format!("{name}-{s}"), 64));
        let (out, back) = if echo { (pong, ping) } else { (ping, pong) };
        let (mine, theirs) = if echo { ("ping", "pong") } else { ("pong", "ping") };
        let rx = back.subscriber_builder().create().expect("iceoryx2 subscriber");
        let tx = publisher(&out);
        let wake = sleep.then(|| {
            (
                listener(&node, &format!("{name}-{mine}-ev")),
                notifier(&node, &format!("{name}-{theirs}-ev")),
            )
        });
        Self { out, tx, rx, wake, _node: node }
    }

    /// Sends `bytes`, then wakes the other side if it sleeps.
    pub fn send(&self, bytes: [u8; N]) {
        self.tx.send_copy(bytes).expect("iceoryx2 send");
        if let Some((_, notifier)) = &self.wake {
            notifier.notify().expect("iceoryx2 notify");
        }
    }

    /// The next sample, spinning or sleeping until it comes.
    pub fn recv(&self) -> [u8; N] {
        loop {
            if let Some(sample) = self.rx.receive().expect("iceoryx2 receive") {
                return *sample;
            }
            match &self.wake {
                Some((listener, _)) => {
                    listener.blocking_wait(|_| {}).expect("iceoryx2 wait");
                }
                None => std::hint::spin_loop(),
            }
        }
    }
}
