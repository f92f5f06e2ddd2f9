"""Two GPUs of one machine: the sender's slots on GPU 0, the receiver on GPU 1 reading them
over the link (peer access). Skipped (visibly) without torch or without two GPUs, as in
CI and on a one-GPU machine."""

import multiprocessing as mp

import pytest

import gpuring

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if torch.cuda.device_count() < 2:
    pytest.skip(
        "the two-GPU tests need two NVIDIA GPUs (torch.cuda.device_count() is %d)"
        % torch.cuda.device_count(),
        allow_module_level=True,
    )

import gpu_peers  # noqa: E402  (imports torch)
import peers  # noqa: E402

spawn = mp.get_context("spawn")

RX = 1  # the receiving process's GPU; every sender here runs on GPU 0


def run(target, *args):
    p = spawn.Process(target=target, args=args)
    p.start()
    return p


def done(p):
    p.join(120)
    assert p.exitcode == 0, "the peer process failed (exit %r)" % p.exitcode


def on(obj, device):
    """`obj` with every CUDA tensor in it moved to GPU `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to("cuda:%d" % device) if obj.is_cuda else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(on(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: on(v, device) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("ready", ["event", "flag"])
def test_the_other_gpu_reads_a_slot_after_the_senders_slow_writes(name, ready):
    """Sender on GPU 0: a ~0.3 s kernel, then the tensor's fill, then `send` (its copy into
    the slot queued after both). Receiver on GPU 1: the message is a view on GPU 1 of GPU
    0's slot, ordered on GPU 1's current stream after the sender's copy, so every ordered
    read sees the final values. Control (events): received onto another stream and read
    without the wait, it sees the slot as it was."""
    rounds = 4
    with torch.cuda.device(RX):
        ch = gpuring.Channel.create(name, slots=1, slot_bytes=1 << 20, device=RX, ready=ready)
        rx = ch.receiver()
        p = run(gpu_peers.send_after_slow_kernel, name, 2 * rounds, ready)
        stale = 0
        elsewhere = torch.cuda.Stream()
        for k in range(1, 2 * rounds + 1):
            if k % 2:
                msg = rx.recv(timeout=60)
                assert msg.device == RX
                t = torch.from_dlpack(msg)
                assert t.device == torch.device("cuda", RX)
                assert int(t[0].item()) == k and int(t[-1].item()) == k
            else:
                msg = rx.recv(timeout=60, stream=elsewhere)
                t = torch.from_dlpack(msg.__dlpack__(stream=-1))
                stale += int(t[0].item()) != k
                torch.cuda.synchronize()
            del t
            msg.release()
        done(p)
    if ready == "event":
        assert stale > 0, "the control never saw stale values: the test could not tell"
    else:
        assert stale == 0, "%d reads on another stream saw a slot before its flag" % stale


@pytest.mark.parametrize("ready", ["event", "flag"])
def test_a_slot_is_not_rewritten_while_the_other_gpu_still_reads_it(name, ready):
    """One slot on GPU 0. The receiver on GPU 1 queues a slow read of message 1 (a ~0.3 s
    kernel, then a sum) and releases it at once; the sender then writes message 2 into
    the same slot. The sum sees message 1: GPU 0's copy waited for the release recorded on
    GPU 1 after the read. Control: the same read on a stream the message knows nothing of
    sees message 2."""
    n = 1 << 16
    with torch.cuda.device(RX):
        ch = gpuring.Channel.create(name, slots=1, slot_bytes=4 * n, device=RX)
        rx = ch.receiver()
        p = run(gpu_peers.send_ones_then_twos, name, n, 4, ready)
        side = torch.cuda.Stream()
        overwritten = 0
        for k in range(4):
            msg = rx.recv(timeout=60)
            t = torch.from_dlpack(msg)
            if k % 2 == 0:
                torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                s = t.sum()
                del t
                msg.release()
                assert float(s.item()) == float(n * (k + 1)), "the slot was rewritten under a read"
            else:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    torch.cuda._sleep(gpu_peers.SLOW_CYCLES)
                    s = t.sum()
                del t
                msg.release()
                side.synchronize()
                overwritten += float(s.item()) != float(n * (k + 1))
        done(p)
    assert overwritten > 0, "the control's reads were never overwritten: the test could not tell"


@pytest.mark.parametrize("copy", [True, False])
def test_a_queue_put_on_gpu_0_gets_on_gpu_1(name, copy):
    """A Queue whose putter (a child, `device=0`) and getter (here, opened with
    `device=1`) are on different GPUs: objects of CUDA and CPU tensors and arrays arrive
    with their CUDA tensors on the getter's GPU, values equal; then objects written after a
    slow kernel are read in stream order."""
    q = gpuring.Queue(name, device=0, slot_bytes=1 << 20, slots=2)
    g = gpuring.Queue.open_or_create(name, device=RX)
    p = run(gpu_peers.put_gpu_objects, q, 20)
    for i in range(20):
        got = g.get(timeout=60, copy=copy)
        assert got["stamp"][1].device == torch.device("cuda", RX), i
        assert peers.same(on(gpu_peers.gpu_objects(i), RX), got), i
        del got
    done(p)
    p = run(gpu_peers.put_after_slow_kernel, q, 3)
    for k in range(1, 4):
        got = g.get(timeout=60, copy=copy)
        assert got["k"] == k and got["x"].device == torch.device("cuda", RX)
        assert int(got["x"][0].item()) == k and int(got["x"][-1].item()) == k
        assert float(got["y"][0].item()) == k + 0.5 and float(got["y"][-1].item()) == k + 0.5
        del got
    done(p)
    g.close()
    q.close()
