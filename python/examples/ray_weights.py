"""A trainer actor sends its weights (a state dict) to N rollout actors through gpuring's Ray
tensor transport, and each rollout streams its results back through a gpuring.ray.channel.

    python python/examples/ray_weights.py                  # one node; on GPU 0 if there is one
    python python/examples/ray_weights.py --two-nodes      # a second (simulated) node
    python python/examples/ray_weights.py --all-gpus       # the actors spread over every GPU

On one node every transfer goes through gpuring. With ``--all-gpus`` the actors get a share
of the node's GPUs each and see every GPU (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``),
so weights and results cross between GPUs through gpuring too (docs/RAY.md). With
``--two-nodes`` (CPU tensors) the rollouts of the second node get the same weights, with
the same code, through Ray's Gloo transport (the actors form a Gloo collective group) and
stream back through a Ray queue: each actor's counters at the end say which path its
transfers took.
"""

import argparse
import os
import time

import ray
import torch

import gpuring.ray

gpuring.ray.register()  # before the classes whose methods name the transport


def model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    ).to(device)


def own(device):
    """``device``, or with ``"gpu"`` the GPU Ray gave this actor (one it sees)."""
    return "cuda:%d" % int(ray.get_gpu_ids()[0]) if device == "gpu" else device


# Two threads: `collect` reads the rollouts' results while `weights` serves each step.
@ray.remote(enable_tensor_transport=True, max_concurrency=2)
class Trainer:
    def __init__(self, device):
        self.net = model(own(device))

    @ray.method(tensor_transport="gpuring")
    def weights(self, step):
        with torch.no_grad():
            for p in self.net.parameters():
                p.add_(0.001 * step)  # stands for a training step
        return self.net.state_dict()

    def collect(self, channels, steps):
        """The rollouts' results, one per rollout and step, through the channels."""
        # Step by step, as the rollouts send them (each rollout has a few slots only).
        got = [[float(ch.get(timeout=60).sum()) for ch in channels] for _ in range(steps)]
        return [list(col) for col in zip(*got)]

    def stats(self):
        return gpuring.ray.stats()


@ray.remote(enable_tensor_transport=True)
class Rollout:
    def __init__(self, device):
        self.device = own(device)
        self.net = model(self.device)
        self.out = None

    def connect(self, channel):
        self.out = channel

    def step(self, weights, step):
        self.net.load_state_dict(weights)
        obs = torch.ones(64, 1024, device=self.device)
        with torch.no_grad():
            act = self.net(obs)
        self.out.put(act)  # to the trainer, no Ray call
        return float(act.sum())

    def where(self):
        node = ray.get_runtime_context().get_node_id()[:8]
        return node + (", %s" % self.device if self.device != "cpu" else "")

    def stats(self):
        return gpuring.ray.stats()


def counts(actor):
    """The actor's gpuring.ray counters that are not zero."""
    return {k: v for k, v in ray.get(actor.stats.remote()).items() if v}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--two-nodes", action="store_true")
    ap.add_argument("--all-gpus", action="store_true")
    args = ap.parse_args()
    if args.all_gpus:  # every actor started from here sees every GPU
        os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    cluster = None
    if args.two_nodes:
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 8, "resources": {"a": 100}, "include_dashboard": False},
        )
        cluster.add_node(num_cpus=8, resources={"b": 100})
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=args.rollouts + 2, include_dashboard=False, log_to_driver=False)
    gpu = torch.cuda.is_available() and not args.two_nodes
    device = ("gpu" if args.all_gpus else "cuda") if gpu else "cpu"
    gpus = torch.cuda.device_count() if args.all_gpus else 1
    # A fractional GPU must fit on one GPU: so many actors to a GPU that all fit.
    share = 1 / -(-(args.rollouts + 1) // gpus) if gpu else 0
    # Half the rollouts on the second node, if there is one.
    place = [
        {"a": 1} if not args.two_nodes or k < args.rollouts // 2 else {"b": 1}
        for k in range(args.rollouts)
    ]
    trainer = Trainer.options(
        num_gpus=share, resources={"a": 1} if args.two_nodes else None
    ).remote(device)
    rollouts = [
        Rollout.options(num_gpus=share, resources=place[k] if args.two_nodes else None).remote(
            device
        )
        for k in range(args.rollouts)
    ]
    if args.two_nodes:
        from ray.experimental.collective import create_collective_group

        create_collective_group([trainer, *rollouts], backend="gloo")
    channels = [gpuring.ray.channel(r, trainer, device="cuda" if gpu else None) for r in rollouts]
    ray.get([r.connect.remote(ch) for r, ch in zip(rollouts, channels)])
    collected = trainer.collect.remote(channels, args.steps)

    sums, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ref = trainer.weights.remote(step)
        sums.append(ray.get([r.step.remote(ref, step) for r in rollouts]))
        times.append(time.perf_counter() - t0)
        del ref
    streamed = ray.get(collected)
    agree = all(len(set(round(s, 3) for s in row)) == 1 for row in sums)
    back = all(
        abs(streamed[k][s] - sums[s][k]) < 1e-3 * abs(sums[s][k]) + 1e-3
        for k in range(args.rollouts)
        for s in range(args.steps)
    )
    print(
        "%d steps, weights to %d rollouts on %s: median %.1f ms a step; rollouts agree: %s; "
        "results streamed back: %s"
        % (
            args.steps,
            args.rollouts,
            "%d GPUs" % gpus if args.all_gpus else device,
            1e3 * sorted(times)[len(times) // 2],
            agree,
            back,
        )
    )
    for k, r in enumerate(rollouts):
        print("rollout %d on node %s: %s" % (k, ray.get(r.where.remote()), counts(r)))
    print("trainer: %s" % counts(trainer))
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    gpuring.ray.cleanup()
    if not (agree and back):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
