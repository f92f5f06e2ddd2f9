"""The GPU path with torch: CUDA tensors between processes. Skipped (visibly) where torch
or a CUDA GPU is missing, as in CI; run on a GPU machine."""

import multiprocessing as mp

import numpy as np
import pytest

import gpuring

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip(
        "the GPU tests need an NVIDIA GPU (torch.cuda.is_available() is False)",
        allow_module_level=True,
    )

import gpu_peers  # noqa: E402  (imports torch)
import peers  # noqa: E402

spawn = mp.get_context("spawn")

# The receiving process's GPU: 0 (the senders' own), and 1 where there are two GPUs (it
# reads GPU 0's slots over the link; every sender here runs on GPU 0).
RX_GPUS = [
    pytest.param(0, id="one-gpu"),
    pytest.param(
        1,
        id="two-gpus",
        marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
    ),
]


def on(obj, device):
    """`obj` with every CUDA tensor in it moved to GPU `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to("cuda:%d" % device) if obj.is_cuda else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(on(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: on(v, device) for k, v in obj.items()}
    return obj


def run(target, *args):
    p = spawn.Process(target=target, args=args)
    p.start()
    return p


def done(p):
    p.join(120)
    assert p.exitcode == 0, "the peer process failed (exit %r)" % p.exitcode


def test_cuda_tensors_across_processes_values_checked(name):
    ch = gpuring.Channel.create(name, slots=4, slot_bytes=1 << 20, device=0)
    rx = ch.receiver()
    p = run(gpu_peers.send_tensors, name, 64)
    opens_after_first = None
    for i in range(64):
        with rx.recv(timeout=60) as msg:
            assert msg.device == 0 and msg.tag == i
            # Both ways to view it: the DLPack protocol, and the shortcut.
            t = torch.from_dlpack(msg) if i % 2 else msg.torch()
            assert t.device == torch.device("cuda", 0)
            assert torch.equal(t, gpu_peers.expected(i)), "message %d" % i
            del t
        if i == 0:
            opens_after_first = gpuring.ipc_opens()
    done(p)
    # The sender's pool was opened once, on first sight: not once per message.
    assert opens_after_first > 0 and gpuring.ipc_opens() == opens_after_first


def test_every_torch_dtype_roundtrips_on_the_gpu(name):
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=4096, device=0)
    tx, rx = ch.sender(), ch.receiver()
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    dtypes += [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    for dt in dtypes:
        src = (torch.arange(60, device="cuda") % 7).to(dt).reshape(3, 4, 5)
        tx.send(src)
        with rx.recv(timeout=5) as msg:
            assert msg.dtype == str(dt).replace("torch.", "")
            got = torch.from_dlpack(msg)
            assert got.dtype == dt and got.shape == src.shape
            assert torch.equal(got.view(torch.uint8), src.view(torch.uint8)), dt


def test_torch_views_are_read_as_their_values(name):
    """`send` reads torch tensors through their own accessors (not DLPack): strided,
    conjugated, negated and 0-d views arrive as the values they show; what gpuring cannot
    carry is refused by name."""
    for device in (0, None):
        where = "cuda" if device == 0 else "cpu"
        ch = gpuring.Channel.create(
            "%s-%s" % (name, where), slots=1, slot_bytes=4096, device=device
        )
        tx, rx = ch.sender(), ch.receiver()
        base = torch.arange(36, dtype=torch.float32, device=where).reshape(6, 6)
        c = torch.complex(base, base + 1)
        neg = c.conj().imag  # a real view carrying torch's lazy negation flag
        assert neg.is_neg()
        assert c.conj().is_conj()
        for view in (
            base[:, ::2],
            base.t(),
            neg,
            base[2, 3],
            base.flip(0),
            c,
            c.conj(),
            c.conj().t(),
        ):
            tx.send(view, timeout=5)
            with rx.recv(timeout=5) as msg:
                got = torch.from_dlpack(msg)
                assert not got.is_conj() and not got.is_neg()
                assert got.shape == view.shape and torch.equal(
                    got.cpu(), view.resolve_conj().resolve_neg().cpu()
                ), view
                del got  # the one slot comes back once its views are gone
        with pytest.raises(gpuring.DTypeError):
            tx.send(
                torch.zeros(4, dtype=torch.int16, device=where).view(torch.complex32), timeout=5
            )
        with pytest.raises(gpuring.TooLarge):
            tx.send(torch.zeros([1] * 9, device=where), timeout=5)
        with pytest.raises(gpuring.Timeout):
            rx.recv(timeout=0)  # nothing refused was sent


@pytest.mark.parametrize("rx_gpu", RX_GPUS)
@pytest.mark.parametrize("ready", ["event", "flag"])
def test_a_slow_kernel_before_send_is_waited_for_on_the_gpu(name, ready, rx_gpu):
    """The sender's copy into the slot runs after a ~0.3 s kernel; the receiver reads at
    once. Ordered by the slot's ready event, it sees the final values every time; the
    control reads without the wait (DLPack stream -1) and sees the slot as it was.

    With ``ready="flag"`` ``recv`` itself returns only once the writes are done: the
    control sees the final values too. (On one GPU the sender gets ``ready`` through the
    pickled channel; a receiver on GPU 1 gets views on GPU 1 of GPU 0's slot.)"""
    rounds = 4
    with torch.cuda.device(rx_gpu):
        ch = gpuring.Channel.create(name, slots=1, slot_bytes=1 << 20, device=rx_gpu, ready=ready)
        assert ch.ready == ready
        rx = ch.receiver()
        if rx_gpu == 0:
            p = run(gpu_peers.send_after_slow_kernel, ch, 2 * rounds)
        else:  # a sender on GPU 0: opened by name
            p = run(gpu_peers.send_after_slow_kernel, name, 2 * rounds, ready)
        stale = 0
        elsewhere = torch.cuda.Stream()
        for k in range(1, 2 * rounds + 1):
            if k % 2:  # ordered: recv and torch.from_dlpack on torch's current stream
                msg = rx.recv(timeout=60)
                t = torch.from_dlpack(msg)
                assert msg.device == rx_gpu and t.device == torch.device("cuda", rx_gpu)
                assert int(t[0].item()) == k and int(t[-1].item()) == k
            else:  # control: received onto another stream, read on this one without a wait
                msg = rx.recv(timeout=60, stream=elsewhere)
                t = torch.from_dlpack(msg.__dlpack__(stream=-1))
                stale += int(t[0].item()) != k
                torch.cuda.synchronize()  # before giving the slot back
            del t
            msg.release()
        done(p)
        if ready == "event":
            assert stale > 0, "the control never saw stale values: the test could not tell"
        else:
            assert stale == 0, "%d reads on another stream saw a slot before its flag" % stale


@pytest.mark.parametrize("rx_gpu", RX_GPUS)
@pytest.mark.parametrize("ready", ["event", "flag"])
def test_a_slot_is_not_written_while_a_reader_still_reads_it(name, ready, rx_gpu):
    """One slot. The receiver queues a slow read (a ~0.3 s kernel, then a sum) of message 1
    and releases it at once; the sender writes message 2 into the same slot. The sum sees
    message 1's values: the sender's stream waited for the release event recorded after
    the read (on GPU 1 where the receiver is there). Control: the same read on a stream
    the message knows nothing of sees message 2's values."""
    with torch.cuda.device(rx_gpu):
        n = 1 << 16
        ch = gpuring.Channel.create(name, slots=1, slot_bytes=4 * n, device=rx_gpu)
        rx = ch.receiver()
        p = run(gpu_peers.send_ones_then_twos, name, n, 4, ready)
        side = torch.cuda.Stream()
        overwritten = 0
        for k in range(4):
            msg = rx.recv(timeout=60)
            t = torch.from_dlpack(msg)
            if k % 2 == 0:  # ordered: the read is queued on the stream the view was made on
                torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                s = t.sum()
                del t
                msg.release()
                assert float(s.item()) == float(n * (k + 1)), (
                    "the slot was overwritten under a read"
                )
            else:  # control: read on another stream, unordered with the release
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                    s = t.sum()
                del t
                msg.release()
                side.synchronize()
                overwritten += float(s.item()) != float(n * (k + 1))
        done(p)
        assert overwritten > 0, (
            "the control's reads were never overwritten: the test could not tell"
        )


@pytest.mark.parametrize("ready", ["event", "flag"])
def test_100k_messages(name, ready):
    count = 100_000
    ch = gpuring.Channel.create(name, capacity=256, slots=64, slot_bytes=64, device=0)
    rx = ch.receiver()
    p = run(gpu_peers.send_numbers, name, count, ready)
    got = torch.empty(count, dtype=torch.int64, device="cuda")
    for i in range(count):
        with rx.recv(timeout=60) as msg:
            got[i] = torch.from_dlpack(msg)[0]
    done(p)
    assert torch.equal(got, torch.arange(count, device="cuda"))


def test_queue_of_cuda_tensors_between_processes(name):
    q = gpuring.Queue(name, slot_bytes=1 << 20, device=0)
    p = run(gpu_peers.put_tensors, q, 50)
    for i in range(50):
        t = q.get(timeout=60)
        assert t.is_cuda and torch.equal(t, gpu_peers.expected(i))
    done(p)
    q.close()


def _until_queued(q, n, within=60.0):
    """Waits until ``n`` items wait in ``q``."""
    import time

    end = time.monotonic() + within
    while q.qsize() < n:
        assert time.monotonic() < end, "the putter did not queue %d items" % n
        time.sleep(0.01)


@pytest.mark.parametrize("ready", ["event", "flag"])
def test_a_prefetching_getter_copies_what_waits_and_hands_it_out_in_order(name, ready):
    """``prefetch=4``: a get that finds tensors waiting behind its item copies them with
    its own (one launch) and hands them out next. Each item was written after a slow
    kernel: every copy is ordered after its item's writes (with events, on the GPU), and
    the values come in the order put, mixed with dicts (taken one by one)."""
    count = 30
    q = gpuring.Queue(name, device=0, slots=16, prefetch=4, ready=ready)
    gone = spawn.Event()
    p = run(gpu_peers.put_after_slow_kernels, q, count, gone, True)
    _until_queued(q, 8)
    took_ahead = 0
    for i in range(count):
        item = q.get(timeout=60)
        took_ahead = max(took_ahead, len(q._ahead))
        if i % 3 == 2:
            assert item["i"] == i
            item = item["t"]
        assert item.is_cuda and torch.equal(item, gpu_peers.expected(i)), i
    gone.set()
    done(p)
    assert took_ahead > 0, "no get found items waiting: the test did not prefetch"
    assert q.qsize() == 0 and not q._ahead
    q.close()


def test_a_prefetched_item_taken_on_another_stream_waits_for_its_copy(name):
    """The copies of items taken ahead are queued on the stream current at the first get;
    a later get on another stream waits for them on the GPU: a slow kernel queued on the
    first stream before that get delays the copies, and the reads on the second stream
    still see every value."""
    q = gpuring.Queue(name, device=0, slots=16, prefetch=4)
    gone = spawn.Event()
    p = run(gpu_peers.put_tensors_then_wait, q, 8, gone)
    _until_queued(q, 8)
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(first):
        # Memory of the size the copies take, poisoned and freed on this stream: the
        # caching allocator hands it to them, so a read that does not wait sees -1.
        torch.full((4 * 16384 // 4,), -1.0, device="cuda")
        torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
        a = q.get(timeout=60)
        assert len(q._ahead) == 3
    with torch.cuda.stream(second):
        rest = [q.get(timeout=60) for _ in range(3)]
        sums = [float(t.sum().item()) for t in rest]
    assert torch.equal(a, gpu_peers.expected(0))
    assert sums == [float(gpu_peers.expected(i).sum().item()) for i in range(1, 4)]
    for i in range(4, 8):
        assert torch.equal(q.get(timeout=60), gpu_peers.expected(i))
    gone.set()
    done(p)
    q.close()


def _the_rest_in_order(q, start, count, gone, putter):
    """Items ``start`` to ``count - 1`` of ``q``, each ``expected(i)``, then nothing more;
    then the putter is let go and ``q`` closed."""
    for i in range(start, count):
        assert torch.equal(q.get(timeout=60), gpu_peers.expected(i)), i
    with pytest.raises(gpuring.Empty):
        q.get(timeout=0.2)
    gone.set()
    done(putter)
    q.close()


@pytest.mark.parametrize("close", [True, False], ids=["close", "exit"])
def test_what_a_getter_took_ahead_goes_back_when_it_closes_or_exits(name, close):
    """A getter process with ``prefetch=4`` takes one item and three ahead, then closes
    the queue (or just exits): the three go back (``Receiver.requeue``), and the next
    getter gets every other item, in order, none lost or twice."""
    count = 8
    q = gpuring.Queue(name, device=0, slots=16, prefetch=4)
    gone = spawn.Event()
    p = run(gpu_peers.put_tensors_then_wait, q, count, gone)
    _until_queued(q, count)
    took = spawn.Queue()
    g = run(gpu_peers.get_one_taking_ahead, q, took, close)
    first, ahead = took.get(timeout=120)
    done(g)
    assert (first, ahead) == (float(gpu_peers.expected(0)[0]), 3)
    _the_rest_in_order(q, 1, count, gone, p)


def test_a_prefetching_getter_gets_every_item_of_a_putter_that_leaves(name):
    """The putter puts 6 items and closes the queue at once: a GPU putter's leave waits
    for its items to be taken and released (its memory goes with it), so the getter,
    taking ahead, gets all six in order while the putter is leaving; then it has left and
    nothing more comes. (The take-ahead that meets the channel's end with an item in hand:
    ``test_a_take_ahead_that_meets_an_error_keeps_the_item_in_hand`` in the host suite.)"""
    count = 6
    q = gpuring.Queue(name, device=0, slots=16, prefetch=4)
    closed, gone = spawn.Event(), spawn.Event()
    p = run(gpu_peers.put_tensors_close_then_wait, q, count, closed, gone)
    for i in range(count):
        assert torch.equal(q.get(timeout=60), gpu_peers.expected(i)), i
    assert closed.wait(60), "the putter's close did not return once its items were taken"
    with pytest.raises(gpuring.Empty):
        q.get(timeout=0.2)
    gone.set()
    done(p)
    q.close()


def test_copies_of_several_messages_in_one_call(name):
    """``gpuring.copies(msgs)``: tensors of each message's shape and dtype, each the
    receiver's own (the slots go back once the messages are released)."""
    ch = gpuring.Channel.create(name, slots=4, slot_bytes=1 << 16, device=0)
    tx, rx = ch.sender(), ch.receiver()
    sent = [
        torch.arange(100, dtype=torch.int32, device="cuda"),
        torch.full((3, 5), 2.5, dtype=torch.float64, device="cuda"),
        torch.ones(7, dtype=torch.bfloat16, device="cuda"),
    ]
    for t in sent:
        tx.send(t)
    msgs = [rx.recv(timeout=10)] + rx.recv_ready(8)
    assert len(msgs) == 3 and rx.recv_ready(8) == []
    made = gpuring.copies(msgs)
    for m in msgs:
        m.release()
    assert tx.free_slots == 4
    for t, c in zip(sent, made):
        assert c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t)
        # torch's own views of one allocation (record_stream reaches it)
        assert c.untyped_storage().data_ptr() == made[0].untyped_storage().data_ptr()
    assert gpuring.copies([]) == []


def test_host_and_device_tensors_cross_into_the_other_kind_of_channel(name):
    gpu = gpuring.Channel.create(name, slots=1, slot_bytes=4096, device=0)
    tx, rx = gpu.sender(), gpu.receiver()
    tx.send(np.arange(10, dtype=np.float32))  # host array into device slots
    with rx.recv(timeout=5) as msg:
        assert torch.equal(torch.from_dlpack(msg).cpu(), torch.arange(10, dtype=torch.float32))
    host = gpuring.Channel.create(name + "-host", slots=1, slot_bytes=4096)
    htx, hrx = host.sender(), host.receiver()
    htx.send(torch.arange(10, device="cuda") * 3)  # device tensor into host slots
    with hrx.recv(timeout=5) as msg:
        assert list(np.from_dlpack(msg)) == [3 * i for i in range(10)]
    with tx.lease((4,), torch.float32) as buf:
        torch.from_dlpack(buf).fill_(2.5)
    with rx.recv(timeout=5) as msg:
        assert torch.from_dlpack(msg).sum().item() == 10.0
    with htx.lease((4,), torch.float32) as buf:  # a host slot as a CPU tensor
        v = buf.torch()
        assert v.device == torch.device("cpu")
        v.fill_(1.5)
        del v
    with hrx.recv(timeout=5) as msg:
        assert list(np.from_dlpack(msg)) == [1.5] * 4


def test_lease_torch_view_orders_the_stream_it_was_made_on(name):
    """``lease.torch()`` is a writable view of the slot. Made while another stream is
    current, its writes go on that stream, and the send makes the ready event wait for
    them: a receiver reading at once sees the values written behind a ~0.3 s kernel.
    Control: the same writes through a bare DLPack capsule (no stream given, so no
    ordering) are not seen."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=1 << 20, device=0)
    tx, rx = ch.sender(), ch.receiver()
    side, reader = torch.cuda.Stream(), torch.cuda.Stream()

    def read():
        with rx.recv(timeout=5, stream=reader) as msg:
            with torch.cuda.stream(reader):
                t = msg.torch()
                total = t.sum().item()
                del t
        return total

    for ordered in (True, False):
        with tx.lease((1024,), torch.float32) as buf:  # leased on torch's current stream
            buf.torch().fill_(1.0)
            with torch.cuda.stream(side):
                v = buf.torch() if ordered else torch.from_dlpack(buf.__dlpack__())
                torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                v.fill_(3.0)
                del v
        got = read()
        torch.cuda.synchronize()
        if ordered:
            assert got == 3072.0, "the send did not wait for the view's stream"
        else:
            assert got == 1024.0, "control: the unordered write was seen (%r)" % got


def test_lease_copy_in_reads_the_source_in_order_of_the_current_stream(name):
    """``lease.copy_in(t)`` while another stream than the lease's is current: the tensor,
    written on that stream behind a ~0.3 s kernel, is copied after those writes (the
    lease's stream waits for the current one). Control: the same copy with the lease's
    own stream current reads the tensor before the slow writes land."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=1 << 20, device=0)
    tx, rx = ch.sender(), ch.receiver()
    side = torch.cuda.Stream()
    for ordered in (True, False):
        src = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        with tx.lease((1024,), torch.float32) as buf:  # leased on the default stream
            with torch.cuda.stream(side):
                torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                src.fill_(3.0)
                if ordered:
                    buf.copy_in(src)
            if not ordered:
                buf.copy_in(src)  # current stream: the lease's, which does not wait for side
        with rx.recv(timeout=5) as msg:
            got = msg.torch().sum().item()
        torch.cuda.synchronize()
        if ordered:
            assert got == 3072.0, "copy_in read the source before its stream's writes"
        else:
            assert got == 1024.0, "control: the unordered copy saw the slow write (%r)" % got


def test_pinned_host_channel_gpu_to_cpu_process(name):
    """GPU process -> this (CPU-side) reader through a host channel pinned by the sender:
    each 54 MB tensor is written after a ~0.3 s kernel, and `send` returns after queueing
    one asynchronous copy (well before the kernel ends: no host wait). The descriptor is
    published only when the copy is done, so every byte read at once is final."""
    count = 6
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=54 << 20)
    rx = ch.receiver()
    took = spawn.Queue()
    p = run(gpu_peers.send_pinned_after_slow_kernel, name, count, took)
    for k in range(1, count + 1):
        with rx.recv(timeout=60) as msg:
            a = np.from_dlpack(msg)
            assert a.nbytes == 54 << 20 and (a == k).all(), "message %d" % k
            del a
    done(p)
    calls = [took.get(timeout=5) for _ in range(count)]
    # The first send waits for nothing; later ones may wait for a free slot.
    assert calls[0] < 0.1, "send waited for the GPU: %.3f s" % calls[0]


@pytest.mark.parametrize("requeue", [False, True], ids=["release", "requeue"])
def test_pinned_receiver_copies_to_the_gpu_non_blocking(name, requeue):
    """CPU process -> GPU through one slot, this receiver pinned: torch sees the slot as
    pinned memory, `.to("cuda", non_blocking=True)` queues a DMA copy behind a ~0.3 s
    kernel, and the message is released at once; the slot goes back only when the copy
    is done (a host function on torch's stream), so the sender, waiting to overwrite it,
    never changes what the copy reads. ``requeue``: the message is given back first (with
    the copy still queued), received again and then released: the requeue waits for the
    stream the reads were queued on, else the sender's next array lands under the copy."""
    count = 6
    ch = gpuring.Channel.create(name, slots=1, slot_bytes=54 << 20)  # keeps the name
    rx = gpuring.Channel.open(name, pinned=True).receiver()
    p = run(gpu_peers.send_filled_arrays, name, count)
    for k in range(1, count + 1):
        msg = rx.recv(timeout=60)
        view = torch.from_dlpack(msg)
        assert view.is_pinned(), "torch does not see the slot as pinned memory"
        torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
        t = view.to("cuda", non_blocking=True)
        del view
        if requeue:
            seq = msg.seq
            rx.requeue(msg)
            msg = rx.recv(timeout=60)
            assert msg.redelivered and msg.seq == seq, "the requeued message came back late"
        msg.release()
        assert t.sum(dtype=torch.int64).item() == k * ((54 << 20) // 4), "message %d" % k
    done(p)
    ch.close()


same = peers.same


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("rx_gpu", RX_GPUS)
def test_a_queue_put_on_gpu_0_gets_on_the_getters_gpu(name, rx_gpu, copy):
    """A Queue whose putter (a child, ``device=0``) and getter (here, opened with
    ``device=rx_gpu``) may be on different GPUs: objects of CUDA and CPU tensors and arrays
    arrive with their CUDA tensors on the getter's GPU, values equal; then objects written
    after a slow kernel are read in stream order."""
    q = gpuring.Queue(name, device=0, slot_bytes=1 << 20, slots=2)
    g = gpuring.Queue.open_or_create(name, device=rx_gpu)
    p = run(gpu_peers.put_gpu_objects, q, 20)
    for i in range(20):
        got = g.get(timeout=60, copy=copy)
        assert got["stamp"][1].device == torch.device("cuda", rx_gpu), i
        assert same(on(gpu_peers.gpu_objects(i), rx_gpu), got), i
        del got
    done(p)
    p = run(gpu_peers.put_after_slow_kernel, q, 3)
    for k in range(1, 4):
        got = g.get(timeout=60, copy=copy)
        assert got["k"] == k and got["x"].device == torch.device("cuda", rx_gpu)
        assert int(got["x"][0].item()) == k and int(got["x"][-1].item()) == k
        assert float(got["y"][0].item()) == k + 0.5 and float(got["y"][-1].item()) == k + 0.5
        del got
    done(p)
    g.close()
    q.close()


@pytest.mark.parametrize("device", [0, None])
def test_queue_objects_of_cuda_cpu_tensors_and_arrays(name, device):
    """CUDA and CPU tensors and numpy arrays in one object, through GPU slots and through
    host slots: each comes back on the device it left from, values equal."""
    q = gpuring.Queue(name, device=device, slot_bytes=1 << 20)
    p = run(gpu_peers.put_gpu_objects, q, 40)
    for i in range(40):
        got = q.get(timeout=60)
        assert same(gpu_peers.gpu_objects(i), got), i
    done(p)
    # Parameters, gradients and a tensor met twice.
    w = torch.nn.Parameter(torch.randn(3, 3, device="cuda"))
    g = torch.ones(2, device="cuda", requires_grad=True)
    q.put({"w": w, "tied": w, "g": g})
    got = q.get(timeout=10)
    assert isinstance(got["w"], torch.nn.Parameter) and got["w"].requires_grad
    assert got["w"] is got["tied"] and torch.equal(got["w"], w)
    assert got["g"].requires_grad and torch.equal(got["g"], g)
    q.close()


def test_a_300_tensor_state_dict_of_500_mb_round_trips_bit_exact(name):
    q = gpuring.Queue(name, device=0)  # default 1 MiB slots: the dict goes as a large item
    p = run(gpu_peers.put_state_dict, q, 2)
    for r in range(2):
        got = q.get(timeout=120)
        assert len(got) == 300
        total = 0
        for k in range(300):
            t = got["layers.%d.weight" % k]
            assert t.device == torch.device("cuda", 0)
            assert torch.equal(t, gpu_peers.state_tensor(k + r)), (r, k)
            total += t.numel() * t.element_size()
        assert total > 500e6
        del got
    done(p)
    q.close()


def test_object_tensors_written_after_a_slow_kernel_are_read_in_stream_order(name):
    q = gpuring.Queue(name, device=0, slots=1)
    p = run(gpu_peers.put_after_slow_kernel, q, 3)
    for k in range(1, 4):
        got = q.get(timeout=60)
        assert got["k"] == k
        assert int(got["x"][0].item()) == k and int(got["x"][-1].item()) == k
        assert float(got["y"][0].item()) == k + 0.5 and float(got["y"][-1].item()) == k + 0.5
    done(p)
    q.close()


@pytest.mark.parametrize(
    "mode",
    [
        [],
        ["--lagging", "--nap", "0.002"],
        ["--separate"],
        ["--no-sync"],
        ["--no-sync", "--separate"],
    ],
)
def test_the_broadcast_example_on_the_gpu(mode):
    """Every worker gets every step (or is told what it missed), values checked at each
    step, or (``--no-sync``) by a total summed on the GPU from reads still queued when each
    message is released: a slot rewritten under one of them changes the total."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "python/examples/broadcast_step.py", "--steps", "500", "--device", "0"]
        + mode,
        cwd=os.path.join(os.path.dirname(__file__), "..", ".."),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    for i in range(4):
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("worker %d:" % i))
        words = line.replace(",", "").split()  # worker i: G steps M missed last L ...
        got, missed, last = int(words[2]), int(words[4]), int(words[7])
        assert got + missed == 500 and last == 499, line
        if "--lagging" not in mode:
            assert missed == 0, line


def test_a_dict_of_70_cuda_tensors_crosses_in_one_message_after_a_slow_kernel(name):
    """A dict of 70 CUDA tensors (odd byte counts, a view 4 bytes into its storage, 3 MB,
    several dtypes: more than one copy launch) goes as one plain tree into another
    process, its tensors written after a ~0.3 s kernel there: every value arrives, the
    copies and the ready signal were ordered after the writes on the GPU."""
    ch = gpuring.Channel.create(name, slots=2, slot_bytes=8 << 20, device=0)
    rx = ch.receiver()
    p = run(gpu_peers.send_many_tensors_after_slow_kernel, name, 3)
    for k in range(3):
        with rx.recv(timeout=60) as msg:
            assert msg.header[:4] == b"GRT1"
            got = msg.object(copy=k % 2 == 0)
        want = gpu_peers.many_tensors(k)
        assert set(got) == set(want)
        for key, t in want.items():
            if torch.is_tensor(t):
                assert got[key].dtype == t.dtype and got[key].shape == t.shape, key
                assert torch.equal(got[key], t), "%s of message %d differs" % (key, k)
            else:
                assert got[key] == t
        del got
    done(p)


@pytest.mark.parametrize("device", [0, None])
def test_plain_trees_of_cuda_and_cpu_tensors_skip_pickle(name, device):
    """A dict and a tuple of CUDA tensors (several: one copy launch into GPU slots),
    a CPU tensor and scalars go as plain trees through GPU slots and through host slots:
    the header says so, and every tensor comes back equal on the device it left from."""
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 20, device=device) as ch:
        tx, rx = ch.sender(), ch.receiver()
        a = torch.arange(4096, device="cuda", dtype=torch.float32)
        b = torch.full((3, 5), 7, device="cuda", dtype=torch.bfloat16)
        objs = [
            {"a": a, "b": b, "tied": a, "cpu": torch.ones(6), "step": 3, "name": "x"},
            (1.5, b, [a * 2, None]),
        ]
        for obj in objs:
            for copy in (True, False):
                tx.send_object(obj)
                with rx.recv(timeout=10) as msg:
                    assert msg.header[:4] == b"GRT1"
                    got = msg.object(copy=copy)
                assert peers.same(obj, got), got
        assert got[2][0].device == torch.device("cuda", 0)
        del got
        import gc

        gc.collect()
        assert tx.free_slots == 2


def test_a_gpu_putter_whose_getter_keeps_views_gets_more_pools(name):
    q = gpuring.Queue(name, slots=2, slot_bytes=1 << 16, device=0)
    finished = spawn.Event()
    p = run(gpu_peers.put_kept, q, 12, finished)
    kept = [q.get(timeout=60, copy=False) for _ in range(12)]  # six pools of two slots
    # Every item was put while the ones before it were kept: none was written under a view.
    torch.cuda.synchronize()
    for i, t in enumerate(kept):
        assert t.is_cuda and torch.equal(t, gpu_peers.expected(i)), "item %d" % i
    del kept, t
    finished.set()
    done(p)
    q.close()
