"""The host path with numpy: no GPU needed (these run in CI)."""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import peers
import pytest

import gpuring
from gpuring import _queue

spawn = mp.get_context("spawn")

NUMPY_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def test_send_recv_roundtrip_every_numpy_dtype(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=4096)
    tx, rx = ch.sender(), ch.receiver()
    for dt in NUMPY_DTYPES:
        a = (np.arange(24) % 5).astype(dt).reshape(2, 3, 4)
        tx.send(a, tag=7)
        with rx.recv(timeout=1) as msg:
            assert (msg.shape, msg.dtype, msg.tag, msg.nbytes) == ((2, 3, 4), dt, 7, a.nbytes)
            b = np.from_dlpack(msg)
            assert b.dtype == a.dtype and b.shape == a.shape
            assert np.array_equal(a, b)
    assert sorted(gpuring.dtypes()) == sorted(
        NUMPY_DTYPES + ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
    )


def test_message_is_a_view_of_the_slot_and_the_slot_returns_after_every_view(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    tx.send(np.arange(4, dtype=np.int64))
    msg = rx.recv(timeout=1)
    view = np.from_dlpack(msg)
    msg.release()
    assert msg.released
    # The one slot is still held by the view: the sender cannot lease it.
    with pytest.raises(gpuring.Timeout):
        tx.send(np.zeros(4, dtype=np.int64), timeout=0.05)
    assert list(view) == [0, 1, 2, 3]
    del view
    tx.send(np.ones(4, dtype=np.int64), timeout=1)
    with rx.recv(timeout=1) as msg:
        assert list(np.from_dlpack(msg)) == [1, 1, 1, 1]
    with pytest.raises(gpuring.Closed):
        np.from_dlpack(msg)


def test_lease_fills_in_place_and_sends_on_exit_or_gives_back_on_error(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=1024)
    tx, rx = ch.sender(), ch.receiver()
    with tx.lease((4, 4), np.float32, tag=3) as buf:
        assert (buf.shape, buf.dtype, buf.nbytes) == ((4, 4), "float32", 64)
        np.from_dlpack(buf)[:] = 2.5
    with rx.recv(timeout=1) as msg:
        assert msg.tag == 3 and float(np.from_dlpack(msg).sum()) == 40.0
    with pytest.raises(RuntimeError):
        with tx.lease(8, "uint8") as buf:
            raise RuntimeError("abandon")
    assert buf.done
    assert tx.free_slots == 1  # the lease went back unsent
    with pytest.raises(gpuring.Timeout):
        rx.recv(timeout=0)
    with pytest.raises(gpuring.Closed):
        buf.send()


def test_non_contiguous_input_is_made_contiguous(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=1024)
    tx, rx = ch.sender(), ch.receiver()
    a = np.arange(36, dtype=np.int32).reshape(6, 6)
    for view in (a[:, ::2], a.T, a[::-1]):
        tx.send(view)
        with rx.recv(timeout=1) as msg:
            assert np.array_equal(np.from_dlpack(msg), view)


def test_readonly_and_zero_sized_arrays(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=1024)
    tx, rx = ch.sender(), ch.receiver()
    ro = np.frombuffer(b"\x01\x02\x03\x04", dtype=np.uint8)
    assert not ro.flags.writeable
    tx.send(ro)
    with rx.recv(timeout=1) as msg:
        assert list(np.from_dlpack(msg)) == [1, 2, 3, 4]
    tx.send(np.zeros((0, 3), dtype=np.float64))
    with rx.recv(timeout=1) as msg:
        assert msg.shape == (0, 3) and np.from_dlpack(msg).size == 0


def test_bad_input_raises_the_named_exception(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    with pytest.raises(gpuring.DTypeError):
        tx.send(np.array(["a", "b"]))  # no DLPack dtype for strings
    with pytest.raises(gpuring.DTypeError):
        tx.send([1, 2, 3])  # not a tensor or array
    with pytest.raises(TypeError):  # DTypeError is a TypeError
        tx.lease((2,), "float128")
    with pytest.raises(gpuring.TooLarge):
        tx.send(np.zeros(65, dtype=np.uint8))
    with pytest.raises(ValueError):  # TooLarge is a ValueError
        tx.lease((9,), "float64")
    with pytest.raises(gpuring.ConfigError):
        gpuring.Channel.create(name + "-x", capacity=3)
    with pytest.raises(gpuring.ConfigError):
        rx.recv(timeout=-1)
    # A name that is not a channel: a ring, an unrelated file, a name nobody made.
    with open("/dev/shm/" + name + "-junk", "wb") as f:
        f.write(b"not a gpuring segment" * 100)
    try:
        with pytest.raises(gpuring.ShmError):
            gpuring.Channel.open(name + "-junk", timeout=0)
    finally:
        os.unlink("/dev/shm/" + name + "-junk")
    with pytest.raises(gpuring.NotFound):
        gpuring.Channel.open(name + "-nobody", timeout=0)
    with pytest.raises(FileNotFoundError):
        gpuring.Channel.open(name + "-nobody", timeout=0.05)
    with pytest.raises(gpuring.AlreadyExists):
        gpuring.Channel.create(name)
    with pytest.raises(gpuring.AttachError):
        ch.receiver()  # SPSC: the one receiver is taken
    # Everything still works after all that, and nothing sent was lost.
    tx.send(np.arange(8, dtype=np.uint8))
    with rx.recv(timeout=1) as msg:
        assert list(np.from_dlpack(msg)) == list(range(8))


def test_closed_endpoints_raise_closed(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    tx.close()
    rx.close()
    ch.close()
    assert tx.closed and rx.closed and ch.closed
    with pytest.raises(gpuring.Closed):
        tx.send(np.zeros(1))
    with pytest.raises(gpuring.Closed):
        rx.recv(timeout=0)
    with pytest.raises(gpuring.Closed):
        ch.sender()


def test_timeouts_wait_about_as_long_as_asked(name):
    ch = gpuring.Channel.create(name, capacity=2, slots=4, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    t0 = time.monotonic()
    with pytest.raises(gpuring.Timeout):
        rx.recv(timeout=0.2)
    assert 0.19 <= time.monotonic() - t0 < 2.0
    tx.send(np.zeros(2), timeout=0)
    tx.send(np.zeros(2), timeout=0)
    with pytest.raises(TimeoutError):  # the ring (capacity 2) is full
        tx.send(np.zeros(2), timeout=0.1)
    assert tx.free_slots == 2  # the failed send gave its slot back
    for _ in range(2):  # a channel with messages queued outlives its users: drain it
        rx.recv(timeout=1).release()


def test_disconnected_once_every_sender_left_and_iteration_ends(name):
    ch = gpuring.Channel.create(name, slots=4, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    for i in range(3):
        tx.send(np.full(2, i, dtype=np.int8))
    tx.close()
    got = [int(np.from_dlpack(m)[0]) for m in rx]
    assert got == [0, 1, 2]
    with pytest.raises(gpuring.Disconnected):
        rx.recv(timeout=1)


def test_54mb_arrays_between_two_processes_every_byte_checked(name):
    count = 6
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64 << 20)
    rx = ch.receiver()
    p = spawn.Process(target=peers.send_big, args=(name, count))
    p.start()
    try:
        for i in range(count):
            with rx.recv(timeout=60) as msg:
                assert msg.tag == i and msg.shape == peers.BIG_SHAPE and msg.nbytes == 53_913_600
                got = np.from_dlpack(msg)
                assert np.array_equal(got.view(np.uint32), peers.big_array(i).view(np.uint32))
        with pytest.raises(gpuring.Disconnected):
            rx.recv(timeout=30)
    finally:
        p.join(30)
    assert p.exitcode == 0


def test_exactly_once_over_10k_messages_mpmc_2x2(name):
    per_producer = 5000
    ch = gpuring.Channel.create(name, capacity=64, slots=16, slot_bytes=64, mpmc=True)
    results = spawn.Queue()
    attached = spawn.Barrier(4)  # no peer starts before all four have their endpoints
    consumers = [
        spawn.Process(target=peers.receive_numbered, args=(name, results, 120, attached))
        for _ in range(2)
    ]
    producers = [
        spawn.Process(target=peers.send_numbered, args=(name, k, per_producer, attached))
        for k in range(2)
    ]
    for p in consumers + producers:
        p.start()
    each = [results.get(timeout=180), results.get(timeout=180)]
    for p in consumers + producers:
        p.join(30)
        assert p.exitcode == 0
    ch.close()
    got = each[0] + each[1]
    # Exactly once: every message of each producer, none twice, none lost.
    assert len(got) == 2 * per_producer
    assert sorted(got) == [(k, i) for k in range(2) for i in range(per_producer)]
    # And each consumer saw each producer's messages in the order they were sent.
    for mine in each:
        for k in range(2):
            seq = [i for (p, i) in mine if p == k]
            assert seq == sorted(seq)


def test_peer_dead_after_the_sender_is_killed(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    rx = ch.receiver()
    ready = spawn.Event()
    p = spawn.Process(target=peers.send_then_hang, args=(name, ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    # What was sent before the kill arrives; then PeerDead.
    with rx.recv(timeout=5) as msg:
        assert list(np.from_dlpack(msg)) == [9, 9, 9, 9]
    with pytest.raises(gpuring.PeerDead):
        rx.recv(timeout=5)


def _consumer(script, name):
    """Runs `script` (Python source) in a new interpreter with the channel's name as its
    argument; its stdin and stdout are pipes to the test."""
    return subprocess.Popen(
        [sys.executable, "-c", script, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("redeliver", [True, False])
def test_a_message_held_by_a_killed_consumer_goes_to_the_next_one(name, redeliver):
    # A consumer takes message 0 and is SIGKILLed holding it. By default the next consumer
    # gets it again, marked, before message 1; with redeliver=False it is dropped.
    ch = gpuring.Channel.create(name, slots=4, slot_bytes=64, redeliver=redeliver)
    assert ch.redelivers is redeliver
    tx = ch.sender()
    for i in range(2):
        tx.send(np.full(2, i, dtype=np.int8), tag=i)
    consumer = (
        "import sys, gpuring\n"
        "rx = gpuring.Channel.open(sys.argv[1], timeout=10).receiver()\n"
        "msg = rx.recv(timeout=10)\n"
        "print(msg.tag, msg.redelivered, flush=True)\n"
        "sys.stdin.readline()\n"
    )
    c = _consumer(consumer, name)
    assert c.stdout.readline() == "0 False\n"
    os.kill(c.pid, signal.SIGKILL)
    c.wait(10)
    rx = ch.receiver()
    got = []
    for _ in range(2 if redeliver else 1):
        with rx.recv(timeout=5) as msg:
            got.append((msg.tag, msg.redelivered, int(np.from_dlpack(msg)[0])))
    assert got == ([(0, True, 0), (1, False, 1)] if redeliver else [(1, False, 1)])
    with pytest.raises(gpuring.Timeout):
        rx.recv(timeout=0)


def test_a_view_held_at_exit_after_the_producer_was_killed_leaves_nothing(name):
    # The consumer is the channel's last user and exits holding a numpy view of a message
    # whose producer was SIGKILLed. Before, the producer's pool stayed in /dev/shm (the
    # name fixture checks): the channel's last one out left a pool still mapped by the view.
    ready = spawn.Event()
    p = spawn.Process(target=peers.produce_then_die, args=(name, [5], ready))
    p.start()
    assert ready.wait(30)
    consumer = (
        "import sys, numpy as np, gpuring\n"
        "ch = gpuring.Channel.open(sys.argv[1], timeout=10)\n"
        "rx = ch.receiver()\n"
        "msg = rx.recv(timeout=10)\n"
        "view = np.from_dlpack(msg)\n"
        "print(int(view[0]), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(int(view[0]), flush=True)\n"
    )
    c = _consumer(consumer, name)
    assert c.stdout.readline() == "5\n"
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    out, _ = c.communicate("go\n", timeout=30)
    assert (out, c.returncode) == ("5\n", 0)


def test_a_producer_killed_then_restarted_gets_its_channel_back(name):
    # The first producer makes the channel, sends 3 and is killed before any consumer came.
    for values in ([0, 1, 2], [3, 4]):
        ready = spawn.Event()
        p = spawn.Process(target=peers.produce_then_die, args=(name, values, ready))
        p.start()
        assert ready.wait(30)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        # The dead producer's channel, with its messages: `create` cannot have the name.
        with pytest.raises(gpuring.AlreadyExists):
            gpuring.Channel.create(name, slots=8, slot_bytes=64)
    # A consumer (started late, or restarted) gets everything both producers sent.
    ch = gpuring.Channel.open_or_create(name, slots=8, slot_bytes=64)
    rx = ch.receiver()
    got = []
    while True:
        try:
            with rx.recv(timeout=5) as msg:
                got.append(int(np.from_dlpack(msg)[0]))
        except gpuring.PeerDead:  # every sender died, and all they sent was received
            break
    assert sorted(got) == [0, 1, 2, 3, 4]
    rx.close()
    ch.close()


def test_defaults_and_bad_integers(name):
    # Open gives up by default, as in Rust (1 s), rather than waiting for ever.
    t = time.monotonic()
    with pytest.raises(gpuring.NotFound):
        gpuring.Channel.open(name + "-typo")
    assert time.monotonic() - t < 5
    # Out-of-range integers are gpuring errors that name the argument.
    for kwargs in ({"capacity": -1}, {"slots": 2**40}, {"slot_bytes": -5}, {"max_senders": -1}):
        with pytest.raises(gpuring.ConfigError, match=next(iter(kwargs))):
            gpuring.Channel.create(name, **kwargs)
    with pytest.raises(gpuring.ConfigError, match="ready"):
        gpuring.Channel.create(name, ready="flag")  # host channels have no ready signal
    # The defaults (8 slots of 1 MiB, as in Rust) and their limit, which names the fix.
    ch = gpuring.Channel.create(name)
    assert (ch.capacity, ch.slots, ch.slot_bytes) == (256, 8, 1 << 20)
    tx = ch.sender()
    with pytest.raises(gpuring.TooLarge, match="slot_bytes"):
        tx.send(np.zeros(2 << 20, dtype=np.uint8))
    with pytest.raises(gpuring.ConfigError, match="tag"):
        tx.send(np.zeros(1), tag=-1)
    with pytest.raises(gpuring.ConfigError, match="spins"):
        ch.receiver(spins=-1)
    tx.close()
    ch.close()


def test_peer_dead_after_the_receiver_is_killed(name):
    ch = gpuring.Channel.create(name, capacity=2, slots=4, slot_bytes=64)
    tx = ch.sender()
    ready = spawn.Event()
    p = spawn.Process(target=peers.receive_then_hang, args=(name, ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    tx.send(np.zeros(1), timeout=1)
    tx.send(np.zeros(1), timeout=1)
    with pytest.raises(gpuring.PeerDead):  # the ring is full and its reader died
        tx.send(np.zeros(1), timeout=5)
    # Nothing sent was lost: a new receiver takes the dead one's role and gets both.
    rx = ch.receiver()
    for _ in range(2):
        rx.recv(timeout=1).release()


def test_blocking_recv_releases_the_gil(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    ticks = []

    def ticker():
        for _ in range(20):
            ticks.append(time.monotonic())
            time.sleep(0.01)
        tx.send(np.ones(1))

    t = threading.Thread(target=ticker)
    t.start()
    with rx.recv(timeout=10) as msg:  # blocks in Rust while the thread runs and sends
        assert np.from_dlpack(msg)[0] == 1
    t.join()
    assert len(ticks) == 20


def test_ctrl_c_interrupts_a_blocked_recv(name):
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=64)
    script = os.path.join(os.path.dirname(__file__), "peers.py")
    child = subprocess.Popen([sys.executable, script, name], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "blocking"
        time.sleep(0.5)  # well inside recv(), asleep in its first 2 s slice
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        code = child.wait(10)
        took = time.monotonic() - t0
    finally:
        child.kill()
        child.wait()
    assert code == 3, "the child did not see KeyboardInterrupt (exit %r)" % code
    print("KeyboardInterrupt after %.0f ms" % (took * 1000))
    # The signal ends the slice's sleep (EINTR); at the slice's end it would take 1.5 s.
    assert took < 1.0
    ch.close()


def test_a_signal_handler_runs_during_a_blocked_recv_which_then_goes_on(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    handled = []
    before = signal.signal(signal.SIGUSR1, lambda *_: handled.append(time.monotonic()))
    main = threading.main_thread().ident
    sent = []

    def poke_then_send():
        time.sleep(0.5)  # the main thread asleep in recv()'s first 2 s slice
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGUSR1)
        time.sleep(0.5)
        tx.send(np.full(1, 7.0))

    t = threading.Thread(target=poke_then_send)
    try:
        t.start()
        with rx.recv(timeout=10) as msg:  # the handler runs in it; the wait goes on
            assert np.from_dlpack(msg)[0] == 7.0
        t.join()
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert len(handled) == 1, handled
    # Run when the signal interrupted the sleep, not at the slice's end (1.5 s later).
    assert handled[0] - sent[0] < 0.4, handled[0] - sent[0]
    ch.close()


def test_channels_pickle_by_name_and_open_in_a_child(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    again = pickle.loads(pickle.dumps(ch))
    assert (again.name, again.slot_bytes, again.device) == (ch.name, 64, None)
    rx = again.receiver()
    tx = ch.sender()
    tx.send(np.arange(3, dtype=np.uint16))
    with rx.recv(timeout=1) as msg:
        assert list(np.from_dlpack(msg)) == [0, 1, 2]


def test_ready_is_for_gpu_channels_and_takes_event_or_flag(name):
    """`ready=` says how a GPU channel's senders signal; on a host channel, or with a name
    it does not know, it is refused before anything is made (no CUDA needed to say so)."""
    for bad in ("flag", "event"):
        with pytest.raises(ValueError, match="GPU channels"):
            gpuring.Channel.create(name, slots=1, slot_bytes=64, ready=bad)
    with pytest.raises(ValueError, match="expected"):
        gpuring.Channel.create(name, slots=1, slot_bytes=64, device=0, ready="flags")
    assert not [f for f in os.listdir("/dev/shm") if name in f], "a refused create made a segment"
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=64)
    assert ch.ready is None
    with pytest.raises(ValueError, match="GPU channels"):
        gpuring.Channel.open(name, timeout=0, ready="flag")
    again = pickle.loads(pickle.dumps(ch))
    assert again.ready is None and again.device is None


def test_queue_between_processes(name):
    q = gpuring.Queue(name, slot_bytes=4096)
    p = spawn.Process(target=peers.put_queue, args=(q, 200))
    p.start()
    got = [q.get(timeout=60) for _ in range(200)]
    p.join(30)
    assert p.exitcode == 0
    assert [int(a[0]) for a in got] == list(range(200))
    assert all(a.dtype == np.int16 and a.shape == (16,) for a in got)
    with pytest.raises(gpuring.Empty):
        q.get(timeout=0.05)
    import queue

    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(np.ones(3))
    view = q.get(copy=False)
    assert list(view) == [1.0, 1.0, 1.0]
    del view
    q.close()


def test_wait_policy_arguments(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(spins=0, yields=0), ch.receiver(spins=1_000_000, yields=0)
    t0 = time.monotonic()
    with pytest.raises(gpuring.Timeout):
        rx.recv(timeout=0.05)  # spins, then gives up in time all the same
    assert time.monotonic() - t0 < 2.0
    tx.send(np.arange(2, dtype=np.uint8))
    with rx.recv(timeout=1) as msg:
        assert list(np.from_dlpack(msg)) == [0, 1]
    with pytest.raises(gpuring.ConfigError):  # a gpuring error, not a bare OverflowError
        ch.receiver(spins=-1)


def test_a_timeout_holds_while_another_thread_waits_on_the_same_receiver(name):
    """One receiver, two threads: one blocks in recv() (holding the receiver's lock
    through its 2 s slices); the other's recv(timeout=0.3) gives up in about 0.3 s, not
    at the end of the first one's slice."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    got = []
    blocked = threading.Thread(target=lambda: got.append(rx.recv(timeout=10)))
    blocked.start()
    time.sleep(0.1)  # the thread is inside its first slice
    t0 = time.monotonic()
    with pytest.raises(gpuring.Timeout):
        rx.recv(timeout=0.3)
    took = time.monotonic() - t0
    tx.send(np.ones(1))
    blocked.join(10)
    assert len(got) == 1
    got[0].release()
    assert 0.3 <= took < 1.0, took


def test_a_thread_blocked_in_recv_does_not_stall_the_others(name):
    """One receiver, two threads: while one blocks in recv() (its wait holds the
    receiver's lock through each slice, without the GIL), the other's recv(timeout=0) answers
    at once instead of waiting for that lock with the GIL held (which stalled every
    Python thread for up to a slice per call)."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    got = []
    blocked = threading.Thread(target=lambda: got.append(rx.recv(timeout=5)))
    blocked.start()
    time.sleep(0.1)  # the thread is inside its wait
    longest = 0.0
    for _ in range(40):  # over some 400 ms: several of the blocked thread's slices
        t0 = time.monotonic()
        with pytest.raises(gpuring.Timeout):
            rx.recv(timeout=0)
        longest = max(longest, time.monotonic() - t0)
        time.sleep(0.01)
    tx.send(np.ones(1))
    blocked.join(10)
    assert len(got) == 1
    got[0].release()
    print("the longest recv(timeout=0) took %.2f ms" % (longest * 1000))
    assert longest < 0.02, "a call waited for the other thread's slice (%.0f ms)" % (longest * 1000)


def test_the_default_queue_and_channel_fit_a_64_mb_dev_shm():
    """A container's /dev/shm is 64 MB unless it is started with --shm-size: the defaults
    fit it. Run in a mount namespace of its own with a 64 MB tmpfs on /dev/shm
    (``unshare -Urm``); skipped, saying why, where that cannot be made."""
    code = (
        "import os, numpy as np, gpuring\n"
        "st = os.statvfs('/dev/shm'); assert st.f_blocks * st.f_frsize <= 64 << 20\n"
        "q = gpuring.Queue()\n"
        "q.put(np.arange(1000, dtype=np.int32))\n"
        "assert list(q.get(timeout=5)[:3]) == [0, 1, 2]\n"
        "ch = gpuring.Channel.create('small-shm-default')\n"
        "tx, rx = ch.sender(), ch.receiver()\n"
        "tx.send(np.ones(4))\n"
        "rx.recv(timeout=5).release()\n"
        "q.close()\n"
        "print('fits')\n"
    )
    script = 'mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 97; exec "$0" -c "$1"'
    try:
        run = subprocess.run(
            ["unshare", "-Urm", "sh", "-c", script, sys.executable, code],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        pytest.skip("no `unshare` here")
    if run.returncode == 97:
        pytest.skip("cannot mount a tmpfs in a user namespace here")
    assert run.returncode == 0 and "fits" in run.stdout, run.stderr


same = peers.same


def test_queue_carries_objects_that_hold_arrays_between_processes(name):
    q = gpuring.Queue(name, slot_bytes=1 << 16)
    p = spawn.Process(target=peers.put_objects, args=(q, 100))
    p.start()
    got = [q.get(timeout=60) for _ in range(100)]
    p.join(30)
    assert p.exitcode == 0
    for i, g in enumerate(got):
        assert same(peers.objects(i), g), (i, g)
    # Each array's bytes went through the slot, not the pickle: the pickle of a
    # 4x6 float32 array would hold its 96 bytes.
    a = np.arange(1 << 14, dtype=np.uint8)
    q.put((a, 1))
    back = q.get(timeout=5)
    assert same((a, 1), back)
    q.close()


def test_an_array_met_twice_comes_back_as_one(name):
    q = gpuring.Queue(name)
    a = np.ones(5)
    q.put({"w": a, "tied": a, "other": a.copy()})
    got = q.get(timeout=5)
    assert got["w"] is got["tied"] and got["other"] is not got["w"]
    assert same(got["w"], a)
    q.close()


def test_items_larger_than_a_slot_go_through_a_second_channel(name):
    q = gpuring.Queue(name, slot_bytes=1 << 20)  # 1 MiB slots, whatever the first item
    big = np.random.default_rng(1).random(700_000)  # 5.6 MB
    state = {"layer%d.w" % i: np.full((64, 64), i, dtype=np.float32) for i in range(300)}
    p = spawn.Process(target=peers.put_queue_items, args=(q, [big, state, (7, big), "after"]))
    p.start()
    assert same(q.get(timeout=60), big)
    assert same(q.get(timeout=60), state)
    assert same(q.get(timeout=60), (7, big))
    assert q.get(timeout=60) == "after"
    p.join(30)
    assert p.exitcode == 0
    q.close()


def test_a_putter_whose_first_item_is_large_gets_slots_of_its_size(name):
    """Without a slot_bytes, a putter's first array of 5.6 MB gives it slots of 8 MiB:
    that item and the next go as one message each (no second channel); a later 20 MB
    one, past those slots, goes the large-item way."""
    q = gpuring.Queue(name)
    big = np.random.default_rng(2).random(700_000)  # 5.6 MB

    def seconds():
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(name + ".big"))

    q.put(big)
    q.put(big[:10])
    assert q._tx.slot_bytes == 8 << 20 and seconds() == []
    assert same(q.get(timeout=5), big) and same(q.get(timeout=5), big[:10])
    huge = np.arange(2_500_000, dtype=np.float64)  # 20 MB
    q.put(huge)
    assert seconds() != [], "past the putter's slots: a second channel"
    assert same(q.get(timeout=5), huge)
    q.close()


def test_what_cannot_be_sent_raises_before_anything_is_queued(name):
    q = gpuring.Queue(name, slot_bytes=4096)
    with pytest.raises(gpuring.PicklingError) as e:
        q.put((np.ones(3), lambda: 1))
    assert isinstance(e.value, pickle.PicklingError)
    assert q.qsize() == 0 and q.empty()
    q.put((np.ones(3), "fine"))
    assert same(q.get(timeout=5), (np.ones(3), "fine"))
    q.close()


def test_qsize_empty_full(name):
    q = gpuring.Queue(name, maxsize=4, slot_bytes=4096)
    assert (q.qsize(), q.empty(), q.full()) == (0, True, False)
    for i in range(4):
        q.put({"i": i})
    assert (q.qsize(), q.empty(), q.full()) == (4, False, True)
    assert q.get(timeout=5) == {"i": 0}
    assert (q.qsize(), q.full()) == (3, False)
    while not q.empty():
        q.get(timeout=5)
    q.close()


def test_simple_queue_in_a_spawned_child(name):
    q = gpuring.SimpleQueue(name, slot_bytes=1 << 16)
    p = spawn.Process(target=peers.put_objects, args=(q, 10))
    p.start()
    got = [q.get() for _ in range(10)]
    p.join(30)
    assert p.exitcode == 0
    assert all(same(peers.objects(i), g) for i, g in enumerate(got))
    assert q.empty()
    q.close()


def test_send_object_views_hold_the_slot_until_freed(name):
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 16) as ch:
        tx, rx = ch.sender(), ch.receiver()
        obj = {"a": np.arange(10.0), "b": [np.zeros((2, 2), dtype=np.int8)], "n": 3}
        tx.send_object(obj)
        assert len(ch) == 1
        msg = rx.recv(timeout=5)
        views = msg.object()  # zero-copy: views of the slot
        msg.release()
        assert same(views, obj) and tx.free_slots == 1
        del views
        import gc

        gc.collect()
        assert tx.free_slots == 2
        tx.send_object(obj)
        with rx.recv(timeout=5) as msg:
            copies = msg.object(copy=True)
        assert same(copies, obj) and tx.free_slots == 2


def test_headers_travel_beside_the_payload(name):
    with gpuring.Channel.create(name, slots=2, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        tx.send(np.ones(4), header=b"frame 17")
        with rx.recv(timeout=5) as msg:
            assert msg.header == b"frame 17"
            with pytest.raises(gpuring.Corrupted):
                msg.object()  # a header that is not an object message's
        with tx.lease((2,), "float64") as lease:
            lease.header = b"x" * gpuring.SLOT_HEADER_SIZE
            with pytest.raises(gpuring.TooLarge):
                lease.header = b"x" * (gpuring.SLOT_HEADER_SIZE + 1)
            np.from_dlpack(lease)[:] = 2
        with rx.recv(timeout=5) as msg:
            assert msg.header == b"x" * gpuring.SLOT_HEADER_SIZE
        with pytest.raises(gpuring.TooLarge):
            tx.send(np.ones(4), header=b"y" * 5000)
        assert tx.free_slots == 2
        tx.send(np.ones(1))
        with rx.recv(timeout=5) as msg:
            assert msg.header == b""


def test_forged_object_messages_are_corrupted(name):
    import struct

    def blob(skeleton, table):
        return struct.pack("<I", len(skeleton)) + skeleton + pickle.dumps(table)

    ref = pickle.dumps(0)  # not a reference: a plain 0 (fine), used with tables below
    cases = [
        b"GRO2" + struct.pack("<I", 1000),  # a pickle longer than the header
        b"GRO2\x01",  # cut short
        b"GRS2" + struct.pack("<QQ", 10, 1 << 40),  # spilled outside the slot
        b"GRO2" + blob(ref, "not a list"),
        b"GRO2" + blob(ref, [(0, -5, np.dtype("f4"), (1,))]),  # a bad offset
        b"GRO2" + blob(ref, [(0, 0, np.dtype("f4"), (1 << 20,))]),  # past the payload
        b"GRO2" + blob(ref, [(7,)]),  # an unknown kind
    ]
    with gpuring.Channel.create(name, slots=1, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        for h in cases:
            tx.send(np.zeros(16, dtype=np.uint8), header=h)
            with rx.recv(timeout=5) as msg:
                with pytest.raises(gpuring.Corrupted):
                    msg.object()
        assert tx.free_slots == 1


def test_sending_a_lease_through_send_sends_it_as_it_is(name):
    with gpuring.Channel.create(name, slots=2, slot_bytes=4096, mpmc=True) as ch:
        tx, rx = ch.sender(), ch.receiver()
        lease = tx.lease((4,), "float32", tag=5)
        np.from_dlpack(lease)[:] = 7
        tx.send(lease, header=b"h")  # not a copy into a second slot: the lease itself
        assert lease.done and tx.free_slots == 1
        with rx.recv(timeout=5) as msg:
            assert (msg.tag, msg.header) == (5, b"h") and (np.from_dlpack(msg) == 7).all()
        with pytest.raises(gpuring.Closed):
            tx.send(lease)  # sent already
        other = ch.sender()
        theirs = other.lease((1,), "uint8")
        with pytest.raises(gpuring.ConfigError):
            tx.send(theirs)
        theirs.cancel()
        other.close()
        assert tx.free_slots == 2 and len(ch) == 0


def test_copy_in_many_places_each_part_or_none(name):
    """``Lease.copy_in_many`` copies each (array, offset) where asked (a non-contiguous
    one made contiguous); a part past the lease raises TooLarge before anything is copied."""
    a = np.arange(6, dtype=np.int32)
    b = np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2]
    with gpuring.Channel.create(name, slots=1, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        lease = tx.lease((64,), "uint8")
        np.from_dlpack(lease)[:] = 255
        with pytest.raises(gpuring.TooLarge):
            lease.copy_in_many([(a, 0), (b, 60)])
        assert (np.from_dlpack(lease) == 255).all(), "a refused call copied something"
        lease.copy_in_many([(a, 8), (b, 40)])
        lease.send()
        with rx.recv(timeout=5) as msg:
            got = np.from_dlpack(msg)
            assert (got[8:32].view(np.int32) == a).all()
            assert (got[40:46] == b.ravel()).all()
            assert (got[:8] == 255).all() and (got[32:40] == 255).all()


def test_numpy_trees_travel_without_pickle(name):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    cases = [
        (1.5, a),
        {"obs": a, "mask": a > 3, "step": 17, "none": None, "s": "x", "b": b"\x00"},
        [a[:, ::2], [np.zeros(0, dtype=np.int8), (np.array(2.0),)]],
        {"tied": a, "again": a, "other": a.copy()},
    ]
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 16) as ch:
        tx, rx = ch.sender(), ch.receiver()
        for obj in cases:
            for copy in (True, False):
                tx.send_object(obj)
                with rx.recv(timeout=5) as msg:
                    assert msg.header[:4] == b"GRT1", obj
                    got = msg.object(copy=copy)
                assert same(obj, got), (obj, got)
        assert got["tied"] is got["again"] and got["other"] is not got["tied"]
        # What a tree does not take still goes, pickled.
        for obj in ([np.array([object()]), 1], (a, np.float32(1.0))):
            tx.send_object(obj)
            with rx.recv(timeout=5) as msg:
                assert msg.header[:4] != b"GRT1"
                got = msg.object(copy=True)
            assert type(got) is type(obj) and len(got) == len(obj)
        del got
        import gc

        gc.collect()
        assert tx.free_slots == 2


def test_forged_numpy_tree_nodes_are_corrupted(name):
    import struct

    def array_node(code, off, dims):
        return (
            bytes([12, code])
            + struct.pack("<Q", off)
            + bytes([len(dims)])
            + b"".join(struct.pack("<Q", d) for d in dims)
        )

    with gpuring.Channel.create(name, slots=1, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        tx.send_object((np.ones(4, dtype=np.float32),))
        with rx.recv(timeout=5) as msg:
            code = msg.header[4 + 1 + 4 + 1]  # GRT1, tuple tag, count, array tag
        cases = [
            b"GRT1" + array_node(200, 0, (4,)),  # an unknown dtype
            b"GRT1" + array_node(code, 4096, (1,)),  # outside the payload
            b"GRT1" + array_node(code, 0, (1 << 62,)),  # a shape past the payload
            b"GRT1" + array_node(code, 0, (1,) * 40),  # too many dims
            b"GRT1" + array_node(code, 0, (4,))[:-3],  # cut short
        ]
        for h in cases:
            tx.send(np.zeros(1024, dtype=np.uint8), header=h)
            with rx.recv(timeout=5) as msg:
                with pytest.raises(gpuring.Corrupted):
                    msg.object()
        assert tx.free_slots == 1


def test_a_forked_child_reads_qsize_and_puts_objects(name):
    fork = mp.get_context("fork")
    q = gpuring.Queue(name, slot_bytes=1 << 16)
    q.put(np.ones(2))
    out = fork.Queue()
    p = fork.Process(target=peers.qsize_then_put, args=(q, out))
    p.start()
    assert out.get(timeout=30) == 1
    p.join(30)
    assert p.exitcode == 0
    assert same(q.get(timeout=5), np.ones(2))
    assert same(q.get(timeout=5), ("from the child", np.arange(3)))
    assert q.empty()
    q.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_dropping_inherited_endpoints_leaves_the_parents_channel(name):
    """A child made by ``os.fork`` holds copies of the parent's channel, sender, receiver
    and a received message; collecting them there acts on nothing the parent owns: the
    parent's endpoints keep working and the channel stays open to others."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=64)
    tx, rx = ch.sender(), ch.receiver()
    tx.send(np.arange(4, dtype=np.int32))
    held = rx.recv(timeout=5)
    pid = os.fork()
    if pid == 0:  # the child: drop every copy, then leave without running the parent's exit
        code = 0
        try:
            del ch, tx, rx, held
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert list(np.from_dlpack(held)) == [0, 1, 2, 3]
    held.release()
    tx.send(np.full(4, 7, dtype=np.int32), timeout=5)
    with rx.recv(timeout=5) as msg:
        assert list(np.from_dlpack(msg)) == [7, 7, 7, 7]
    other = gpuring.Channel.open(name)  # still there by name
    with pytest.raises(gpuring.AttachError):
        other.receiver()  # the parent's receiver still holds the SPSC role
    other.close()


def test_broadcast_every_receiver_gets_every_message_in_order(name):
    n = 2000
    ch = gpuring.Channel.create(name, broadcast=True, capacity=16, slots=4, slot_bytes=64)
    assert ch.broadcast and not ch.lagging
    tx = ch.sender()
    results = spawn.Queue()
    attached = spawn.Barrier(5)
    receivers = [
        spawn.Process(target=peers.receive_broadcast, args=(name, results, attached))
        for _ in range(4)
    ]
    for p in receivers:
        p.start()
    attached.wait(60)
    for i in range(n):
        tx.send(np.array([i], dtype=np.int64))
    tx.close()
    each = [results.get(timeout=120) for _ in receivers]
    for p in receivers:
        p.join(30)
        assert p.exitcode == 0
    ch.close()
    assert all(got == list(range(n)) and missed == 0 for got, missed in each)


def test_a_lagging_broadcast_receiver_is_told_how_many_it_missed(name):
    with pytest.raises(gpuring.ConfigError, match="broadcast"):
        gpuring.Channel.create(name, lagging=True)
    ch = gpuring.Channel.create(name, broadcast=True, lagging=True, slots=2, slot_bytes=64)
    assert ch.lagging and gpuring.Channel.open(name).lagging
    tx, rx = ch.sender(), ch.receiver()
    for i in range(5):
        tx.send(np.array([i], dtype=np.int64))  # never waits: rx holds nothing
    with pytest.raises(gpuring.Lagged) as lag:
        rx.recv(timeout=1)
    assert lag.value.missed == 3 and "missed 3" in str(lag.value)
    held = rx.recv(timeout=1)
    assert int(np.from_dlpack(held)[0]) == 3
    # A message held is never taken back: the sender reuses the other slot, and the
    # receiver, still holding 3, misses 4 and gets the newest.
    for i in range(5, 8):
        tx.send(np.array([i], dtype=np.int64))
    with pytest.raises(gpuring.Lagged) as lag:
        rx.recv(timeout=1)
    assert lag.value.missed == 3
    assert int(np.from_dlpack(held)[0]) == 3, "the held message is intact"
    with rx.recv(timeout=1) as msg:
        assert int(np.from_dlpack(msg)[0]) == 7
    held.release()
    tx.close()
    with pytest.raises(gpuring.Disconnected):
        rx.recv(timeout=1)


def test_the_broadcast_example_reaches_every_worker(name):
    out = subprocess.run(
        [sys.executable, "python/examples/broadcast_step.py", "--steps", "300"],
        cwd=os.path.join(os.path.dirname(__file__), "..", ".."),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    for i in range(4):
        assert "worker %d: 300 steps, 0 missed, last 299" % i in out.stdout, out.stdout


def test_clean_removes_what_a_killed_producer_left_and_never_what_is_in_use(name):
    ready = spawn.Event()
    p = spawn.Process(target=peers.produce_then_die, args=(name, [1, 2], ready))
    p.start()
    assert ready.wait(30)
    mine = lambda: sorted(f for f in os.listdir("/dev/shm") if f.startswith(name))  # noqa: E731
    # In use: nothing goes, even with queued=True.
    assert gpuring.clean(name, queued=True) == []
    assert mine()
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    # Left by a crash with two messages waiting: kept unless queued=True; a dry run says
    # what would go and removes nothing.
    assert gpuring.clean(name) == []
    would = gpuring.clean(name, queued=True, dry_run=True)
    assert (name, "queued") in would and any(w == "orphaned-pool" for _, w in would), would
    assert mine()
    removed = gpuring.clean(name, queued=True)
    assert sorted(removed) == sorted(would)
    assert mine() == []
    # Other names are not touched.
    assert gpuring.clean(name + "-none") == []


def test_queue_open_or_create_meets_by_name(name):
    a = gpuring.Queue.open_or_create(name, slots=2, large_slots=1)
    b = gpuring.Queue.open_or_create(name)  # opens a's channel
    a.put({"x": np.arange(5), "n": 3})
    got = b.get(timeout=5)
    assert list(got["x"]) == [0, 1, 2, 3, 4] and got["n"] == 3
    # An item larger than a slot goes through its size class's channel (1 slot here).
    big = np.arange(300_000, dtype=np.int64)  # 2.4 MB > 1 MiB
    a.put(big)
    assert np.array_equal(b.get(timeout=5), big)
    with pytest.raises(ValueError):
        gpuring.Queue.open_or_create(name, large_slots=0)
    a.close()
    b.close()


def test_a_putter_whose_getter_keeps_items_gets_more_slots_rather_than_waiting(name):
    q = gpuring.Queue(name, slots=2, slot_bytes=4096)
    kept = []
    for i in range(16):  # views kept: each pair of items holds a pool of 2 slots
        q.put(np.full(16, i, dtype=np.int32), timeout=5)
        kept.append(q.get(timeout=5, copy=False))
    assert [int(a[0]) for a in kept] == list(range(16))
    assert all((a == i).all() for i, a in enumerate(kept)), "no slot was written under a view"
    pools = q._txs.all
    assert len(pools) == 8 and all(s.held_slots == 2 for s in pools)
    # At the cap (8 pools) a put waits for a slot, as before.
    with pytest.raises(gpuring.Full):
        q.put(np.zeros(16, dtype=np.int32), timeout=0.1)
    del kept[:3]  # two slots of the first pool, one of the second
    q.put(np.full(16, 99, dtype=np.int32), timeout=5)
    assert int(q.get(timeout=5)[0]) == 99
    # A getter that copies holds no slot for long: no more pools.
    kept.clear()
    for i in range(99):
        q.put(np.full(16, i, dtype=np.int32), timeout=5)
        if i % 3 == 2:
            assert [int(q.get(timeout=5)[0]) for _ in range(3)] == [i - 2, i - 1, i]
    assert len(q._txs.all) == 8 and all(s.held_slots == 0 for s in q._txs.all)
    q.close()


def test_a_putter_running_ahead_of_a_getter_that_keeps_items_gets_more_slots(name):
    # The putter is ahead: when it finds no free slot, the getter has not taken (let alone
    # kept) them yet. It waits a little at a time and looks again.
    q = gpuring.Queue(name, slots=2, slot_bytes=4096)
    finished = spawn.Event()
    p = spawn.Process(target=peers.put_kept, args=(q, 12, finished))
    p.start()
    kept = [q.get(timeout=60, copy=False) for _ in range(12)]
    assert [int(a[0]) for a in kept] == list(range(12))
    assert all((a == i).all() for i, a in enumerate(kept)), "no slot was written under a view"
    del kept
    finished.set()
    p.join(30)
    assert p.exitcode == 0
    q.close()


def test_a_putter_adds_pools_only_for_items_kept_not_for_items_queued(name):
    q = gpuring.Queue(name, slots=2, slot_bytes=4096)
    for i in range(2):
        q.put(np.full(16, i, dtype=np.int32), timeout=5)
    # Both slots in the ring, not yet taken: the getters lag, more slots would only queue more.
    with pytest.raises(gpuring.Full):
        q.put(np.zeros(16, dtype=np.int32), timeout=0.1)
    assert len(q._txs.all) == 1
    first = q.get(timeout=5, copy=False)  # one held, one queued: half, not more
    with pytest.raises(gpuring.Full):
        q.put(np.zeros(16, dtype=np.int32), timeout=0.1)
    assert len(q._txs.all) == 1
    second = q.get(timeout=5, copy=False)  # both held: a second pool
    q.put(np.full(16, 2, dtype=np.int32), timeout=5)
    assert len(q._txs.all) == 2
    assert [int(first[0]), int(second[0]), int(q.get(timeout=5)[0])] == [0, 1, 2]
    q.close()


def test_recv_ready_takes_what_waits_without_waiting(name):
    ch = gpuring.Channel.create(name, slots=8, slot_bytes=4096)
    tx, rx = ch.sender(), ch.receiver()
    for i in range(5):
        tx.send(np.full(16, i, dtype=np.int64))
    first = rx.recv_ready(3)
    assert [int(np.from_dlpack(m)[0]) for m in first] == [0, 1, 2]
    rest = rx.recv_ready(10)
    assert [int(np.from_dlpack(m)[0]) for m in rest] == [3, 4]
    assert rx.recv_ready(10) == [] and rx.recv_ready(0) == []
    for m in first + rest:
        m.release()
    assert tx.free_slots == 8
    tx.send(np.zeros(1))
    with rx.recv(timeout=5) as m, pytest.raises(gpuring.DTypeError, match="GPU messages"):
        gpuring.copies([m])
    tx.close()
    # What a take-ahead meets after messages is raised by the next receive, once.
    gc.collect()
    with pytest.raises(gpuring.Disconnected):
        rx.recv_ready(4)
    ch.close()


def test_an_end_met_after_messages_taken_ahead_is_raised_by_the_next_receive(name):
    ch = gpuring.Channel.create(name, slots=8, slot_bytes=4096)
    tx, rx = ch.sender(), ch.receiver()
    for i in range(2):
        tx.send(np.full(4, i))
    tx.close()
    got = rx.recv_ready(8)
    assert len(got) == 2
    with pytest.raises(gpuring.Disconnected):
        rx.recv(timeout=5)
    del got
    assert list(rx) == []  # the iteration ends there too
    ch.close()


def test_queue_prefetch_is_checked_and_host_items_come_one_by_one(name):
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="prefetch"):
            gpuring.Queue(name + "-bad", prefetch=bad)
    q = gpuring.Queue(name, prefetch=4)
    for i in range(6):
        q.put(np.full(8, i) if i % 2 else {"i": i})
    got = [q.get(timeout=5) for _ in range(6)]
    assert [int(g[0]) if i % 2 else g["i"] for i, g in enumerate(got)] == list(range(6))
    assert not q._ahead  # take-ahead copies GPU tensors only
    q.close()


class _GpuItem:
    """What ``Queue._take`` reads of a message that carries a GPU tensor (its take-ahead is
    for GPU items only; its error paths are exercised here with stand-ins)."""

    tag, device, released = _queue._TORCH, 0, False

    def __init__(self, value):
        self.value = value

    def torch(self):
        return self

    def clone(self):
        return ("copy", self.value)

    def release(self):
        self.released = True


class _FailingAhead:
    """A receiver whose take-ahead meets ``error`` at once."""

    def __init__(self, error):
        self.error = error

    def recv_ready(self, most):
        raise self.error


@pytest.mark.parametrize("error", [gpuring.Disconnected, gpuring.PeerDead, gpuring.Corrupted])
def test_a_take_ahead_that_meets_an_error_keeps_the_item_in_hand(name, error):
    """``Queue(prefetch=N)``: the channel's end (or a dead putter) met behind an item means
    nothing more waits, and the item is returned; another error is raised by the get that
    reaches it, after the item, and once."""
    q = gpuring.Queue(name, prefetch=4)
    for i in range(2):
        q.put(np.full(1, i))
    assert int(q.get(timeout=5)[0]) == 0  # q._rx: the receiver the gets use
    rx, q._rx = q._rx, _FailingAhead(error("met taking ahead"))
    item = _GpuItem(7)
    assert q._take(item, True) == ("copy", 7) and item.released
    if error is gpuring.Corrupted:
        with pytest.raises(gpuring.Corrupted, match="met taking ahead"):
            q.get(timeout=5)
    assert not q._ahead
    q._rx = rx
    assert int(q.get(timeout=5)[0]) == 1  # the queue goes on
    q.close()


def test_a_requeued_message_goes_to_the_next_receive_first_marked(name):
    ch = gpuring.Channel.create(name, slots=8, slot_bytes=4096, mpmc=True)
    tx, a, b = ch.sender(), ch.receiver(), ch.receiver()
    for i in range(4):
        tx.send(np.full(16, i, dtype=np.int64))
    first, second = a.recv(timeout=5), a.recv(timeout=5)
    view = np.from_dlpack(second)
    with pytest.raises(BufferError, match="views"):
        a.requeue(second)  # a view of it is alive: nothing changes
    assert not second.released
    del view
    a.requeue(second)
    a.requeue(first)
    assert first.released and second.released
    # b gets them before what is queued (in slot order), marked, values whole.
    got = []
    for _ in range(4):
        with b.recv(timeout=5) as m:
            got.append((int(np.from_dlpack(m)[0]), m.redelivered))
    assert got == [(0, True), (1, True), (2, False), (3, False)]
    assert tx.free_slots == 8
    # Another receiver's message: refused, still held by it.
    tx.send(np.zeros(4))
    m = b.recv(timeout=5)
    with pytest.raises(gpuring.ConfigError, match="another receiver"):
        a.requeue(m)
    assert not m.released
    m.release()
    with pytest.raises(gpuring.Closed):
        a.requeue(m)
    ch.close()


def test_a_channel_without_redelivery_refuses_a_requeue(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=4096, redeliver=False)
    tx, rx = ch.sender(), ch.receiver()
    tx.send(np.ones(4))
    m = rx.recv(timeout=5)
    with pytest.raises(gpuring.ConfigError, match="does not deliver messages again"):
        rx.requeue(m)
    assert not m.released and tx.free_slots == 1
    m.release()
    assert tx.free_slots == 2
    ch.close()
