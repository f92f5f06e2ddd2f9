//! The baselines' peers in the ring benchmarks, carrying the same 384 descriptor bytes: a
//! byte stream (pipe, Unix socket) and iceoryx2 publish-subscribe.

use std::io::{BufReader, Read, Write};

use gpuring::Descriptor;

use super::ice;

/// Bytes of a descriptor.
pub const DESC: usize = size_of::<Descriptor>();
/// The sequence number that stops a peer.
pub const STOP: u64 = u64::MAX;
/// The tag of the last descriptor of a stream (acknowledged).
pub const LAST: u64 = 1;

/// A descriptor carrying `seq`.
pub fn descriptor(seq: u64) -> Descriptor {
    Descriptor { seq, ..Default::default() }
}

/// Reads descriptors and writes each straight back.
pub fn echo(mut r: impl Read, mut w: impl Write) {
    let mut buf = [0u8; DESC];
    while r.read_exact(&mut buf).is_ok() {
        if w.write_all(&buf).and_then(|_| w.flush()).is_err() {
            return;
        }
    }
}

/// Reads a count, then that many descriptors (buffered, as a user would), then acks.
pub fn sink(r: impl Read, mut w: impl Write) {
    let mut r = BufReader::with_capacity(1 << 16, r);
    let mut buf = [0u8; DESC];
    loop {
        let mut n = [0u8; 8];
        if r.read_exact(&mut n).is_err() {
            return;
        }
        for _ in 0..u64::from_le_bytes(n) {
            r.read_exact(&mut buf).unwrap();
        }
        w.write_all(&[1]).unwrap();
        w.flush().unwrap();
    }
}

/// iceoryx2 echo: receives on `{name}-ping`, sends each sample back on `{name}-pong`;
/// `sleep`: waits on its listener between samples and notifies the other side's.
pub fn ice_echo(name: &str, sleep: bool) {
    let side = ice::PingPong::<DESC>::new(name, true, sleep);
    loop {
        let bytes = side.recv();
        if bytemuck::pod_read_unaligned::<Descriptor>(&bytes).seq == STOP {
            return;
        }
        side.send(bytes);
    }
}

/// iceoryx2 sink: receives on `{name}-ping`; a descriptor tagged `LAST` is acknowledged
/// on `{name}-pong`.
pub fn ice_sink(name: &str) {
    let node = ice::node();
    let data = ice::array_service::<DESC>(&node, &format!("{name}-ping"), 1024);
    let ack = ice::u64_service(&node, &format!("{name}-pong"), 4);
    let rx = data.subscriber_builder().create().unwrap();
    let tx = ice::publisher(&ack);
    loop {
        let Some(sample) = rx.receive().unwrap() else {
            std::hint::spin_loop();
            continue;
        };
        let d: Descriptor = bytemuck::pod_read_unaligned(&*sample);
        drop(sample);
        match (d.seq, d.tag) {
            (STOP, _) => return,
            (_, LAST) => {
                tx.send_copy(LAST).unwrap();
            }
            _ => {}
        }
    }
}

/// ipc-channel's peer, in its idiom: makes both channels here and hands the parent its ends
/// through the parent's one-shot server `name`; echoes every descriptor (`echo`) or only
/// the last of a stream.
pub fn ipc_peer(name: String, echo: bool) {
    let (data_tx, data_rx) = ipc_channel::ipc::bytes_channel().unwrap();
    let (back_tx, back_rx) = ipc_channel::ipc::bytes_channel().unwrap();
    let boot = ipc_channel::ipc::IpcSender::connect(name).unwrap();
    boot.send((data_tx, back_rx)).unwrap();
    while let Ok(buf) = data_rx.recv() {
        let d: Descriptor = bytemuck::pod_read_unaligned(&buf);
        if echo || d.tag == LAST {
            back_tx.send(&buf).unwrap();
        }
    }
}
