"""gpuring.ray on a local Ray cluster of two simulated nodes (CPU tensors; the GPU tests are
in test_gpu.py's Ray part). Skipped when Ray or torch is missing: `.ci/run` installs both
into a venv of its own for this file."""

import os
import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

import gpuring  # noqa: E402
import gpuring.ray as gray  # noqa: E402

# Before the classes below: `ray.method(tensor_transport="gpuring")` checks the name.
gray.register()

NODE_A = {"node_a": 1}
NODE_B = {"node_b": 1}


def _ours():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("gpuring-ray-"))


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 6, "resources": {"node_a": 100}, "include_dashboard": False},
    )
    c.add_node(num_cpus=4, resources={"node_b": 100})
    ray.init(address=c.address, include_dashboard=False)
    yield c
    ray.shutdown()
    c.shutdown()
    gray.cleanup()
    assert _ours() == [], "left in /dev/shm: %r" % _ours()


@ray.remote(enable_tensor_transport=True, num_cpus=0)
class Producer:
    @ray.method(tensor_transport="gpuring")
    def make(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(n, generator=g), "i": torch.arange(n, dtype=torch.int64)}

    @ray.method(tensor_transport="gpuring")
    def state_dict(self, count, n):
        return {"w%d" % k: torch.full((n,), float(k)) for k in range(count)}

    def stats(self):
        return gray.stats()

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def pid(self):
        return os.getpid()

    def break_gloo_send(self):
        """Makes this actor's Gloo sends fail (a transfer failing while both actors live)."""
        from ray.experimental.rdt.collective_tensor_transport import GLOOTensorTransport

        def fail(*args, **kwargs):
            raise RuntimeError("a Gloo send made to fail")

        GLOOTensorTransport.send_multiple_tensors = fail

    def put_many(self, ch, count, n):
        for k in range(count):
            ch.put((k, torch.full((n,), float(k))))
        return count


@ray.remote(enable_tensor_transport=True, num_cpus=0)
class Consumer:
    def node(self):
        return ray.get_runtime_context().get_node_id()

    def checksum(self, d):
        return {k: float(v.double().sum()) for k, v in d.items()}

    def stats(self):
        return gray.stats()

    def niceness(self):
        return os.getpriority(os.PRIO_PROCESS, 0)

    def get_many(self, ch, count, n):
        bad = 0
        for k in range(count):
            j, t = ch.get(timeout=30)
            if j != k or t.shape != (n,) or not bool((t == float(k)).all()):
                bad += 1
        return bad


def _expected(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    return {
        "x": float(x.double().sum()),
        "i": float(torch.arange(n, dtype=torch.int64).double().sum()),
    }


def _pair(res_a, res_b):
    return Producer.options(resources=res_a).remote(), Consumer.options(resources=res_b).remote()


def test_same_node_tensors_go_through_gpuring(cluster):
    p, c = _pair(NODE_A, NODE_A)
    for seed in range(5):
        got = ray.get(c.checksum.remote(p.make.remote(1000, seed)))
        assert got == pytest.approx(_expected(1000, seed))
    ps, cs = ray.get([p.stats.remote(), c.stats.remote()])
    assert ps["gpuring_sends"] == 5 and ps["fallback_sends"] == 0, ps
    assert cs["gpuring_recvs"] == 5 and cs["fallback_recvs"] == 0, cs


def test_a_state_dict_larger_than_a_slot_goes_in_one_message(cluster):
    p, c = _pair(NODE_A, NODE_A)
    # 300 tensors of 16 KB: 4.9 MB, beyond the 1 MiB slots.
    got = ray.get(c.checksum.remote(p.state_dict.remote(300, 4096)))
    assert got == {"w%d" % k: 4096.0 * k for k in range(300)}
    assert ray.get(c.stats.remote())["gpuring_recvs"] == 1


def test_one_result_to_several_actors_on_the_node(cluster):
    p = Producer.options(resources=NODE_A).remote()
    cs = [Consumer.options(resources=NODE_A).remote() for _ in range(3)]
    ref = p.make.remote(5000, 7)
    got = ray.get([c.checksum.remote(ref) for c in cs])
    assert all(g == pytest.approx(_expected(5000, 7)) for g in got)
    assert ray.get(p.stats.remote())["gpuring_sends"] == 3


def test_across_nodes_the_collective_group_carries_them(cluster):
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    p, c = _pair(NODE_A, NODE_B)
    assert ray.get(p.node.remote()) != ray.get(c.node.remote())
    group = create_collective_group([p, c], backend="gloo")
    try:
        got = ray.get(c.checksum.remote(p.make.remote(1000, 3)))
        assert got == pytest.approx(_expected(1000, 3))
        ps, cs = ray.get([p.stats.remote(), c.stats.remote()])
        assert ps["fallback_sends"] == 1 and ps["gpuring_sends"] == 0, ps
        assert cs["fallback_recvs"] == 1 and cs["gpuring_recvs"] == 0, cs
    finally:
        destroy_collective_group(group)


def test_across_nodes_a_killed_source_is_an_error_not_a_hang(cluster):
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    p, c = _pair(NODE_A, NODE_B)
    group = create_collective_group([p, c], backend="gloo")
    try:
        ref = p.make.remote(1000, 1)
        ray.get(p.stats.remote())
        ray.kill(p)
        start = time.monotonic()
        with pytest.raises(ray.exceptions.RayError):
            ray.get(c.checksum.remote(ref), timeout=120)
        assert time.monotonic() - start < 90
    finally:
        _destroy(destroy_collective_group, group)


def test_across_nodes_a_failed_send_ends_both_actors_as_ray_does(cluster):
    """Ray's collective transports cannot abort, so Ray kills both actors of a failed
    transfer of theirs (the receive would wait for ever). The fallback does the same for
    the transfers it hands them: here the source's Gloo send fails while both live."""
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    p, c = _pair(NODE_A, NODE_B)
    group = create_collective_group([p, c], backend="gloo")
    try:
        ray.get(p.break_gloo_send.remote())
        start = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(c.checksum.remote(p.make.remote(1000, 1)), timeout=60)
        assert time.monotonic() - start < 45
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(p.stats.remote(), timeout=30)
    finally:
        _destroy(destroy_collective_group, group)


def _destroy(destroy, group):
    try:
        destroy(group)
    except Exception:  # Ray may have destroyed it with the failed transfer
        pass


def test_across_nodes_without_a_group_says_what_to_do(cluster):
    p, c = _pair(NODE_A, NODE_B)
    with pytest.raises(Exception, match="different nodes"):
        ray.get(c.checksum.remote(p.make.remote(10, 1)), timeout=60)


def test_a_dead_source_is_an_error_not_a_hang(cluster):
    p, c = _pair(NODE_A, NODE_A)
    ref = p.make.remote(1000, 1)
    ray.get(p.stats.remote())  # the result exists
    ray.kill(p)
    start = time.monotonic()
    # Ray's actor error, as its own transfers say it (gpuring.ray.PeerActorDied).
    with pytest.raises(ray.exceptions.ActorDiedError, match="source actor .* died"):
        ray.get(c.checksum.remote(ref), timeout=120)
    assert time.monotonic() - start < 90
    # The consumer is still of use.
    p2 = Producer.options(resources=NODE_A).remote()
    assert ray.get(c.checksum.remote(p2.make.remote(100, 2))) == pytest.approx(_expected(100, 2))


def test_a_source_whose_destination_died_goes_on(cluster):
    p, c = _pair(NODE_A, NODE_A)
    ray.get([p.stats.remote(), c.stats.remote()])
    ref = p.make.remote(1000, 1)
    ray.kill(c)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(c.checksum.remote(ref), timeout=60)
    c2 = Consumer.options(resources=NODE_A).remote()
    assert ray.get(c2.checksum.remote(p.make.remote(100, 4)), timeout=120) == pytest.approx(
        _expected(100, 4)
    )


def test_a_channel_on_one_node_streams_through_gpuring(cluster):
    p, c = _pair(NODE_A, NODE_A)
    ch = gray.channel(p, c)
    assert ch.same_node
    n, count = 256, 2000
    sent = p.put_many.remote(ch, count, n)
    assert ray.get(c.get_many.remote(ch, count, n), timeout=120) == 0
    assert ray.get(sent) == count
    ps, cs = ray.get([p.stats.remote(), c.stats.remote()])
    assert ps["channel_puts"] == count and cs["channel_gets"] == count
    assert ps["channel_puts_across"] == 0 and cs["channel_gets_across"] == 0


def test_streaming_actors_keep_the_nodes_niceness(cluster):
    # Ray's workers renice themselves to 15; gpuring.ray.runtime_env() keeps them at the
    # raylet's (this process's, which started it), and a channel between two such actors
    # streams as any other.
    here = os.getpriority(os.PRIO_PROCESS, 0)
    env = gray.runtime_env()
    p = Producer.options(resources=NODE_A, runtime_env=env).remote()
    c = Consumer.options(resources=NODE_A, runtime_env=env).remote()
    default = Consumer.options(resources=NODE_A).remote()
    assert ray.get(default.niceness.remote()) == min(here + 15, 19)
    assert ray.get(c.niceness.remote()) == here
    ch = gray.channel(p, c)
    sent = p.put_many.remote(ch, 500, 64)
    assert ray.get(c.get_many.remote(ch, 500, 64), timeout=120) == 0
    assert ray.get(sent) == 500


def test_runtime_env_adds_the_variable_and_keeps_the_rest():
    base = {"env_vars": {"A": "1"}, "pip": ["x"]}
    env = gray.runtime_env(base)
    assert env == {"env_vars": {"A": "1", "RAY_worker_niceness": "0"}, "pip": ["x"]}
    assert base == {"env_vars": {"A": "1"}, "pip": ["x"]}  # not changed
    assert gray.runtime_env() == {"env_vars": {"RAY_worker_niceness": "0"}}
    assert gray.runtime_env({"env_vars": None}) == {"env_vars": {"RAY_worker_niceness": "0"}}


def test_a_channel_across_nodes_goes_through_ray(cluster):
    p, c = _pair(NODE_A, NODE_B)
    ch = gray.channel(p, c)
    assert not ch.same_node
    sent = p.put_many.remote(ch, 20, 64)
    assert ray.get(c.get_many.remote(ch, 20, 64), timeout=120) == 0
    ray.get(sent)
    ps, cs = ray.get([p.stats.remote(), c.stats.remote()])
    assert ps["channel_puts_across"] == 20 and ps["channel_puts"] == 0
    assert cs["channel_gets_across"] == 20 and cs["channel_gets"] == 0


def test_killed_actors_leave_nothing_after_cleanup(cluster):
    p, c = _pair(NODE_A, NODE_A)
    ray.get(c.checksum.remote(p.make.remote(1000, 5)))
    pid = ray.get(p.pid.remote())
    mine = [f for f in _ours() if p._actor_id.hex() in f]
    assert mine, "the pair's channel exists while both live"
    ray.kill(p)
    ray.kill(c)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    # Both processes are gone; what they left is removed by cleanup (register does it too).
    deadline = time.monotonic() + 30
    while [f for f in _ours() if p._actor_id.hex() in f] and time.monotonic() < deadline:
        gpuring.clean("gpuring-ray-", queued=True)
        time.sleep(0.2)
    assert [f for f in _ours() if p._actor_id.hex() in f] == []


def test_the_example_runs_on_two_nodes():
    """python/examples/ray_weights.py --two-nodes: its own cluster; exits 1 if the rollouts
    disagree or their results did not come back."""
    import subprocess
    import sys

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "ray_weights.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run(
        [sys.executable, example, "--two-nodes", "--rollouts", "2", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rollouts agree: True; results streamed back: True" in r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("rollout ")]
    # One rollout per node: the first through gpuring, the second through the fallback.
    assert "'gpuring_recvs': 3" in lines[0] and "'fallback_recvs': 3" in lines[1], lines


@pytest.mark.parametrize(
    "ids, visible, count, want",
    [
        (["1"], "1", 1, 0),  # Ray's default: the actor sees only its GPU, as ordinal 0
        (["5"], "3,5", 2, 1),  # a node-wide CUDA_VISIBLE_DEVICES: its place in that list
        ([1], None, 2, 1),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the id itself
        ([], None, 2, 7),  # no GPU from Ray: the current device (7 here)
        (["9"], "0,1", 2, 7),  # an id this process cannot see: the current device
    ],
)
def test_the_gpu_a_receive_lands_on(monkeypatch, ids, visible, count, want):
    """The GPU Ray gave the actor, as an ordinal this process sees (not the receiving
    thread's current device, which Ray's receive thread leaves at 0)."""
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ids)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 7)
    assert gray._own_gpu() == want
