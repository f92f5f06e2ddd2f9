"""gpuring.ray between actors on two GPUs of one machine (skipped without Ray, torch or two
GPUs). Ray gives each actor one GPU, in both of its layouts: each actor sees only its own
GPU (Ray's default, ``own``), or every GPU (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES,
``see-both``, each making its own current)."""

import os

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
if torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)

import gpuring.ray as gray  # noqa: E402

gray.register()

SEE_ALL = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}


@pytest.fixture(scope="module")
def two():
    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    gray.cleanup()
    left = [f for f in os.listdir("/dev/shm") if f.startswith("gpuring")]
    assert not left, "left in /dev/shm: %r" % left


def _side(**options):
    """The actor class, with Ray's `options` (a class made here pickles by value: Ray's
    workers cannot import this test module)."""

    @ray.remote(enable_tensor_transport=True, num_gpus=1, **options)
    class Side:
        def __init__(self):
            # The GPU Ray gave this actor, as an ordinal it sees.
            gid, visible = str(ray.get_gpu_ids()[0]), os.environ.get("CUDA_VISIBLE_DEVICES")
            self.gpu = visible.split(",").index(gid) if visible else int(gid)
            torch.cuda.set_device(self.gpu)

        def where(self):
            """This actor's GPU (ordinal, UUID) and how many it sees."""
            uuid = str(torch.cuda.get_device_properties(self.gpu).uuid)
            return self.gpu, uuid, torch.cuda.device_count()

        @ray.method(tensor_transport="gpuring")
        def make(self, n, k, slow=False):
            torch.cuda.set_device(self.gpu)  # per thread: Ray may run methods on another one
            x = torch.empty(n, device="cuda")
            y = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda")
            assert x.get_device() == self.gpu
            if slow:
                torch.cuda._sleep(300_000_000)  # GPU time before the writes the result must hold
            x.fill_(k)
            y.fill_(k + 1)
            return {"x": x, "y": y}

        def check(self, d, k):
            """Where the tensors landed, and whether they hold what the source wrote."""
            x, y = d["x"], d["y"]
            ok = bool((x == k).all()) and bool((y == k + 1).all()) and y.dtype == torch.bfloat16
            return [x.get_device(), y.get_device()], ok

        def put_stream(self, ch, count):
            torch.cuda.set_device(self.gpu)
            for k in range(count):
                ch.put(torch.full((1024,), float(k), device="cuda"))
            torch.cuda.synchronize()

        def get_stream(self, ch, count):
            torch.cuda.set_device(self.gpu)
            devices, bad = set(), 0
            for k in range(count):
                t = ch.get(timeout=60)
                devices.add(t.get_device())
                bad += not bool((t == k).all())
            return sorted(devices), bad

        def stats(self):
            return gray.stats()

    return Side


LAYOUTS = {"own": _side(), "see-both": _side(runtime_env=SEE_ALL)}


@pytest.fixture(params=sorted(LAYOUTS))
def pair(two, request):
    """Two actors, a GPU each (both GPUs: the next test's pair waits for them), in each
    of Ray's layouts."""
    a, b = LAYOUTS[request.param].remote(), LAYOUTS[request.param].remote()
    (_, ua, na), (_, ub, nb) = ray.get([a.where.remote(), b.where.remote()])
    assert ua != ub, "Ray did not give the actors a GPU each"
    assert na == nb == (2 if request.param == "see-both" else 1)
    yield a, b
    ray.kill(a)
    ray.kill(b)


def test_cuda_tensors_between_actors_on_two_gpus(pair):
    a, b = pair
    gb = ray.get(b.where.remote())[0]
    # The first result is written after a slow kernel: B reads it in stream order.
    for k, n in enumerate((1024, 5 << 20, 16 << 20)):
        devices, ok = ray.get(b.check.remote(a.make.remote(n, k, slow=k == 0), k))
        assert ok, "result %d: wrong values" % k
        assert devices == [gb, gb], "result %d landed on %s, not B's GPU %d" % (k, devices, gb)
    assert ray.get(b.stats.remote())["gpuring_recvs"] == 3
    assert ray.get(a.stats.remote())["gpuring_sends"] == 3


def test_a_channel_between_actors_on_two_gpus(pair):
    a, b = pair
    gb = ray.get(b.where.remote())[0]
    ch = gray.channel(a, b, device="cuda")
    got = b.get_stream.remote(ch, 200)
    ray.get(a.put_stream.remote(ch, 200))
    devices, bad = ray.get(got)
    assert bad == 0 and devices == [gb]
    assert ray.get(b.stats.remote())["channel_gets"] == 200
