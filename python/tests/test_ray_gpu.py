"""gpuring.ray with CUDA tensors, on the GPU machine (skipped without Ray, torch or a GPU)."""

import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import gpuring.ray as gray  # noqa: E402

gray.register()


@pytest.fixture(scope="module")
def local():
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    gray.cleanup()


@ray.remote(enable_tensor_transport=True, num_gpus=0.25)
class Producer:
    @ray.method(tensor_transport="gpuring")
    def make(self, n, k, slow=False):
        x = torch.empty(n, device="cuda")
        y = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda")
        if slow:
            torch.cuda._sleep(300_000_000)  # GPU time before the writes the result must hold
        x.fill_(k)
        y.fill_(k + 1)
        return {"x": x, "y": y}


@ray.remote(enable_tensor_transport=True, num_gpus=0.25)
class Consumer:
    def check(self, d, k):
        x, y = d["x"], d["y"]
        return (
            x.is_cuda
            and y.dtype == torch.bfloat16
            and bool((x == k).all())
            and bool((y == k + 1).all())
            and tuple(x.shape) == (2 * y.shape[0],)
        )

    def stats(self):
        return gray.stats()


@ray.remote(
    enable_tensor_transport=True,
    num_gpus=0,
    runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ""}},
)
class Blind:
    """An actor that sees no GPU (as one Ray gave another GPU sees not the producer's)."""

    def check(self, d, k):
        return True


def test_cuda_tensors_between_actors_sharing_a_gpu(local):
    p, c = Producer.remote(), Consumer.remote()
    for k, n in enumerate((1024, 5 << 20, 16 << 20)):
        assert ray.get(c.check.remote(p.make.remote(n, k), k))
    assert ray.get(c.stats.remote())["gpuring_recvs"] == 3


def test_the_transfer_waits_for_the_producers_stream(local):
    p, c = Producer.remote(), Consumer.remote()
    assert ray.get(c.check.remote(p.make.remote(4 << 20, 9, True), 9))


def test_a_destination_that_cannot_see_the_gpu_is_told_and_the_source_goes_on(local):
    p, blind, c = Producer.remote(), Blind.remote(), Consumer.remote()
    start = time.monotonic()
    with pytest.raises(ray.exceptions.RayError, match="cannot see"):
        ray.get(blind.check.remote(p.make.remote(1024, 1), 1), timeout=60)
    # The source's send was told, not left waiting for Ray's timeout (60 s).
    assert ray.get(c.check.remote(p.make.remote(1024, 2), 2), timeout=30)
    assert time.monotonic() - start < 30
