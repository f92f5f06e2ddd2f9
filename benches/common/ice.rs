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
