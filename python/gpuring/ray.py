"""gpuring between Ray actors: a tensor transport for Ray Direct Transport, and streaming
channels. Needs Ray (tested with 2.60) and torch; the rest of gpuring does not.

**The transport.** Tensors an actor method returns stay in that actor; when the result is
passed to a method of another actor, Ray moves them with the method's ``tensor_transport``.
``"gpuring"`` moves them through a gpuring channel between the two processes when both
actors are on one node (CUDA tensors through GPU slots, CPU tensors through host shared
memory), and through Ray's collective transport (``GLOO`` / ``NCCL``, a collective group
of the two actors) when they are not::

    import ray, torch
    import gpuring.ray

    gpuring.ray.register()          # in the driver, before the classes that name it
    ray.init()

    @ray.remote(enable_tensor_transport=True)
    class Trainer:
        @ray.method(tensor_transport="gpuring")
        def weights(self):
            return {"w": torch.randn(1024, 1024), "b": torch.zeros(1024)}

    @ray.remote(enable_tensor_transport=True)
    class Rollout:
        def load(self, weights):
            return float(weights["w"].sum())

    trainer, rollout = Trainer.remote(), Rollout.remote()
    print(ray.get(rollout.load.remote(trainer.weights.remote())))

docs/RAY.md says how each of Ray's calls maps onto gpuring, which path a transfer takes,
and what each path guarantees. A source that dies before or while sending shows in the
method that needed its result as Ray's :class:`ray.exceptions.ActorDiedError` (raised as
:class:`PeerActorDied`, Ray's error wrapping it); channels go with their last user, and
:func:`cleanup` removes those whose actors were all killed.

**Streaming channels.** :func:`channel` joins two actors with a queue they both use, with
no Ray call per item: a :class:`gpuring.Queue` when they share a node, a
``ray.util.queue.Queue`` (Ray's object store, milliseconds an item) when they do not.
Ray starts its workers at niceness 15; on a node whose cores are all busy, give actors that
stream ``runtime_env=gpuring.ray.runtime_env()`` (see :func:`runtime_env`).
"""

import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import ray
from ray.experimental.rdt import CommunicatorMetadata, TensorTransportManager
from ray.experimental.rdt.collective_tensor_transport import CollectiveTransportMetadata

from ._gpuring import clean
from ._queue import Queue
from .errors import CudaError, Disconnected, Empty, Full, PeerDead

__all__ = [
    "TRANSPORT",
    "PeerActorDied",
    "register",
    "channel",
    "ActorChannel",
    "runtime_env",
    "stats",
    "cleanup",
    "GpuringTransport",
]

#: The transport's name in Ray (``tensor_transport="gpuring"``; Ray's names are upper case).
TRANSPORT = "GPURING"

# Every gpuring segment this module makes starts with this.
_PREFIX = "gpuring-ray-"

# How often a waiting send or receive looks whether Ray aborted its transfer (s).
_POLL = 0.05

# How long the owner waits for an actor Ray is still placing before it gives up (s).
_PLACED_WITHIN = 60.0

# The node `_node_of` says of an actor that died.
_DEAD = "dead"

# The fallback the owner of a result names across nodes (None: the collective group of
# the two actors decides).
_fallback: Optional[str] = None


@dataclass
class GpuringTransportMetadata(CollectiveTransportMetadata):
    """What the source tells about a result: Ray's shapes and dtypes, the node it was made
    on, its CUDA device (an ordinal of the source process) and its id (Ray's send is not
    told it). A collective transport's metadata, so that a fallback takes it as its own."""

    node_id: Optional[str] = None
    device_index: Optional[int] = None
    device_uuid: Optional[str] = None
    obj_id: str = ""


@dataclass
class GpuringCommunicatorMetadata(CommunicatorMetadata):
    """Who sends to whom: the two actors (hex ids) and their nodes; across nodes, the
    fallback transport and its metadata; or why the transfer cannot be made."""

    src: str = ""
    dst: str = ""
    src_node: str = ""
    dst_node: str = ""
    fallback: Optional[str] = None
    fallback_meta: Optional[CommunicatorMetadata] = None
    error: Optional[str] = None


class _Local:
    """This process's part: the pair queues it opened, the events of results made here,
    aborted transfers, results that came before their receive was asked for, counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues: Dict[str, Queue] = {}
        self.events: Dict[str, Any] = {}
        self.aborted: Dict[str, float] = {}
        self.early: Dict[str, List[Any]] = {}
        self.swept = False
        self.uuids: Optional[List[str]] = None
        self.node: Optional[str] = None
        self.counts = {
            "gpuring_sends": 0,
            "gpuring_recvs": 0,
            "fallback_sends": 0,
            "fallback_recvs": 0,
            "channel_puts": 0,
            "channel_gets": 0,
            "channel_puts_across": 0,
            "channel_gets_across": 0,
        }

    def count(self, what):
        with self.lock:
            self.counts[what] += 1


_local = _Local()
_nodes: Dict[str, str] = {}  # actor id -> node id, in an owner


def register(fallback: Optional[str] = None) -> None:
    """Registers the ``"gpuring"`` tensor transport with Ray: call it in the driver before
    the classes whose methods name it are defined (``ray.method`` checks the name) and
    before their actors are made (Ray registers it on each of them); before or after
    ``ray.init``. ``fallback``: the transport that carries results between actors on different
    nodes, ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA); by default that of the one
    collective group both actors belong to (``ray.experimental.collective
    .create_collective_group``). Calling it again does nothing. Also removes what killed
    actors left in ``/dev/shm`` (:func:`cleanup`)."""
    global _fallback
    import torch
    from ray.experimental.rdt.util import register_tensor_transport, transport_manager_info

    _fallback = fallback.upper() if fallback else None
    if TRANSPORT not in transport_manager_info:
        register_tensor_transport(TRANSPORT, ["cuda", "cpu"], GpuringTransport, torch.Tensor)
    cleanup()


def stats() -> Dict[str, int]:
    """This process's counts so far: the transport's ``gpuring_sends``, ``gpuring_recvs``
    (results through gpuring channels) and ``fallback_sends``, ``fallback_recvs`` (through
    the fallback transport, across nodes); the channels' ``channel_puts``,
    ``channel_gets`` (through gpuring) and ``channel_puts_across``, ``channel_gets_across``
    (through Ray's queue)."""
    with _local.lock:
        return dict(_local.counts)


def cleanup() -> List[str]:
    """Removes the channels and pools of this module that no process has open (left by
    actors that were killed), with what waits in them; returns their names."""
    return [name for name, _ in clean(_PREFIX, queued=True)]


def _node_of(actor) -> str:
    """The node an actor runs on (asked of Ray's control store once per actor; waits while
    Ray is still placing it)."""
    aid = actor._actor_id.hex()
    node = _nodes.get(aid)
    if node is not None:
        return node
    from ray._private import state

    end = time.monotonic() + _PLACED_WITHIN
    while True:
        info = state.actors(aid) or {}
        node = (info.get("Address") or {}).get("NodeID") or ""
        if info.get("State") == "ALIVE" and node.strip("0"):
            _nodes[aid] = node
            return node
        if info.get("State") == "DEAD":
            # Not an error here: the transfer fails as Ray's own do (its task on the dead
            # actor fails, and Ray aborts the other side).
            return _DEAD
        if time.monotonic() > end:
            raise TimeoutError(
                "gpuring.ray: actor %s was not placed within %.0f s" % (aid, _PLACED_WITHIN)
            )
        time.sleep(0.01)


def _here() -> str:
    """This process's node (asked of Ray once: a process does not change nodes)."""
    if _local.node is None:
        _local.node = ray.get_runtime_context().get_node_id()
    return _local.node


def _pair_queue(comm, cuda, src_device, device, kind=None) -> Queue:
    """The pair's queue for CPU (``cuda`` false) or CUDA tensors of the source's GPU
    ``src_device`` (its name says which), opened (or made) here on first use with
    ``device``, this process's GPU (the sender's: where its slots are). ``kind="ctl"``:
    the pair's control queue (host), where a receiver refuses a result."""
    what = kind or ("g%d" % src_device if cuda else "h")
    name = "%s%s-%s-%s" % (_PREFIX, comm.src, comm.dst, what)
    with _local.lock:
        q = _local.queues.get(name)
        if q is None:
            if not _local.swept:
                _local.swept = True
                cleanup()
            q = Queue.open_or_create(
                name,
                capacity=64,
                slots=4,
                device=device if cuda else None,
                max_senders=4,
                large_slots=2,
            )
            _local.queues[name] = q
        return q


def _refuse(comm):
    if comm.error:
        raise RuntimeError("gpuring.ray: " + comm.error.replace("gpuring.ray: ", ""))


def _gpu_uuids():
    """The UUIDs of the GPUs this process sees, by ordinal."""
    if _local.uuids is None:
        import torch

        n = torch.cuda.device_count()
        _local.uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
    return _local.uuids


def _own_gpu() -> int:
    """This actor's GPU as a torch ordinal: the first GPU Ray gave it, found among the GPUs
    this process sees (``CUDA_VISIBLE_DEVICES``, which Ray sets to the actor's own unless
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set); torch's current device where
    Ray gave it none. Not the current device alone: that is per thread, and Ray runs a
    transfer's receive on a thread of its own (where it is 0)."""
    import torch

    ids = [str(i) for i in ray.get_gpu_ids()]
    if ids:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            if ids[0].isdigit() and int(ids[0]) < torch.cuda.device_count():
                return int(ids[0])
        else:
            seen = [v.strip() for v in visible.split(",")]
            if ids[0] in seen:
                return seen.index(ids[0])
    return torch.cuda.current_device()


def _refuse_to_source(comm, obj_id):
    """Tells the source, waiting to send ``obj_id``, that it will not be taken."""
    try:
        _pair_queue(comm, False, None, None, "ctl").put(obj_id, timeout=2.0)
    except (Full, Disconnected, PeerDead):
        pass  # the source gave up first (Ray aborts it otherwise)


def _check_refused(ctl, obj_id):
    while True:
        try:
            refused = ctl.get(block=False)
        except Empty:
            return
        if refused == obj_id:
            raise RuntimeError("gpuring.ray: the destination refused %s (see its error)" % obj_id)


class PeerActorDied(ray.exceptions.ActorDiedError):
    """The other actor of a transfer died: a :class:`ray.exceptions.ActorDiedError`, as
    Ray's own transfers say it."""

    def __init__(self, msg: str, actor_id: Optional[str] = None):
        ray.exceptions.RayActorError.__init__(self, actor_id, msg)
        self._gpuring = (msg, actor_id)

    def __reduce__(self):
        return (PeerActorDied, self._gpuring)


def _check_abort(obj_id, peer, role):
    """Raises if Ray aborted ``obj_id``'s transfer: :class:`PeerActorDied` if the other
    actor, ``peer`` (the ``role`` of it), is dead."""
    with _local.lock:
        if obj_id not in _local.aborted:
            return
    from ray._private import state

    if (state.actors(peer) or {}).get("State") == "DEAD":
        raise PeerActorDied(
            "gpuring.ray: the %s actor %s died before %s went across" % (role, peer, obj_id),
            peer,
        )
    raise RuntimeError(
        "gpuring.ray: Ray aborted the transfer of %s (the %s's side failed)" % (obj_id, role)
    )


class GpuringTransport(TensorTransportManager):
    """Ray's tensor transport through gpuring channels (see the module's doc)."""

    @property
    def tensor_transport_backend(self) -> str:  # type: ignore[override]
        return TRANSPORT

    @staticmethod
    def is_one_sided() -> bool:
        return False

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor) -> bool:
        # Ray registers the transport on every actor made after `register`.
        return True

    def extract_tensor_transport_metadata(self, obj_id, rdt_object):
        meta, kind, index = [], None, None
        for t in rdt_object:
            if kind is None:
                kind, index = t.device.type, t.device.index
            elif (t.device.type, t.device.index) != (kind, index):
                raise ValueError(
                    "gpuring.ray: the tensors of one result must be on one device "
                    "(found %s and %s:%s)" % (t.device, kind, index)
                )
            meta.append((t.shape, t.dtype))
        if kind not in (None, "cpu", "cuda"):
            raise ValueError("gpuring.ray carries CPU and CUDA tensors, not %s" % kind)
        uuid = None
        if kind == "cuda":
            import torch

            # The send (on another thread, on its stream) waits for what this thread's
            # stream wrote.
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(index))
            with _local.lock:
                _local.events[obj_id] = ev
            uuid = _gpu_uuids()[index]
        return GpuringTransportMetadata(
            tensor_meta=meta,
            tensor_device=kind,
            node_id=_here(),
            device_index=index,
            device_uuid=uuid,
            obj_id=obj_id,
        )

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        if src_actor is None:
            raise ValueError(
                "gpuring.ray sends from an actor: the driver's ray.put cannot use it "
                "(pass the tensors to an actor method, or use the object store)"
            )
        comm = GpuringCommunicatorMetadata(
            src=src_actor._actor_id.hex(), dst=dst_actor._actor_id.hex()
        )
        # Ray may call this on a thread of its own, where an exception is only logged and
        # the receive would wait for its timeout: an error travels to both sides instead.
        try:
            comm.src_node, comm.dst_node = _node_of(src_actor), _node_of(dst_actor)
            if comm.src_node != comm.dst_node and _DEAD not in (comm.src_node, comm.dst_node):
                comm.fallback, comm.fallback_meta = _fallback_for(src_actor, dst_actor)
        except Exception as e:
            comm.error = "%s: %s" % (type(e).__name__, e)
        return comm

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        meta, comm = tensor_transport_metadata, communicator_metadata
        _refuse(comm)
        cuda = meta.tensor_device == "cuda"
        obj_id = meta.obj_id
        if cuda:
            import torch

            # This thread's stream (where the copy, or the fallback's send, is ordered)
            # waits for what the method's stream wrote.
            with _local.lock:
                ev = _local.events.get(obj_id)
            if ev is not None:
                torch.cuda.current_stream(meta.device_index).wait_event(ev)
        if comm.fallback:
            _local.count("fallback_sends")
            return _manager(comm.fallback).send_multiple_tensors(tensors, meta, comm.fallback_meta)
        if _here() != comm.src_node:
            raise RuntimeError("gpuring.ray: the source is not on the node its metadata names")
        q = _pair_queue(comm, cuda, meta.device_index, meta.device_index)
        item = (obj_id, list(tensors))
        ctl = None
        while True:
            _check_abort(obj_id, comm.dst, "destination")
            try:
                q.put(item, timeout=_POLL)
                break
            except (Full, Disconnected, PeerDead):
                # No room, or no receiver yet (or it died: Ray aborts us then). A receiver
                # that cannot take the result says so in the pair's control queue.
                ctl = ctl or _pair_queue(comm, False, None, None, "ctl")
                _check_refused(ctl, obj_id)
        _local.count("gpuring_sends")

    def recv_multiple_tensors(
        self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None
    ):
        meta, comm = tensor_transport_metadata, communicator_metadata
        _refuse(comm)
        if comm.fallback:
            _local.count("fallback_recvs")
            return _manager(comm.fallback).recv_multiple_tensors(
                obj_id, meta, comm.fallback_meta, target_buffers
            )
        if _here() != comm.dst_node:
            raise RuntimeError("gpuring.ray: the destination is not on the node its metadata names")
        cuda = meta.tensor_device == "cuda"
        import torch

        if cuda and not _gpu_uuids():
            _refuse_to_source(comm, obj_id)
            raise RuntimeError(
                "gpuring.ray: %s lives on GPU %s, which this actor cannot see (it sees no "
                "GPU): give it one, or take the result elsewhere" % (obj_id, meta.device_uuid)
            )
        # The tensors land on this actor's GPU, read over the link where the source's slots
        # are on another GPU (one this process sees, or one Ray hid from it: CUDA IPC
        # reaches it where the two GPUs reach each other).
        device = _own_gpu() if cuda else None
        q = _pair_queue(comm, cuda, meta.device_index, device)
        # Sends of one pair can reach us in another order than the receives Ray asks for.
        while True:
            with _local.lock:
                tensors = _local.early.pop(obj_id, None)
            if tensors is not None:
                break
            _check_abort(obj_id, comm.src, "source")
            try:
                got, tensors = q.get(timeout=_POLL)
            except Empty:
                continue
            except CudaError as e:
                # This process cannot take the result (its GPU cannot reach the source's, or
                # another CUDA failure): tell the source, which would wait.
                _refuse_to_source(comm, obj_id)
                raise RuntimeError(
                    "gpuring.ray: %s (on GPU %s) cannot be taken here: %s; between GPUs that "
                    'cannot reach each other use tensor_transport="nccl"'
                    % (obj_id, meta.device_uuid, e)
                ) from e
            if got == obj_id:
                break
            with _local.lock:
                if got not in _local.aborted:
                    _local.early[got] = tensors
        if len(tensors) != len(meta.tensor_meta):
            raise RuntimeError(
                "gpuring.ray: %s came with %d tensors, not %d"
                % (obj_id, len(tensors), len(meta.tensor_meta))
            )
        if target_buffers:
            for b, t in zip(target_buffers, tensors):
                b.copy_(t)
            tensors = list(target_buffers)
        if cuda:
            # The copies are ordered on this thread's stream; the method that takes them
            # runs on another thread, maybe on another stream.
            torch.cuda.current_stream(device).synchronize()
        _local.count("gpuring_recvs")
        return tensors

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        with _local.lock:
            _local.events.pop(obj_id, None)

    def abort_transport(self, obj_id, communicator_metadata):
        comm = communicator_metadata
        if comm is not None and comm.fallback:
            fallback = _manager(comm.fallback)
            if fallback.can_abort_transport():
                fallback.abort_transport(obj_id, comm.fallback_meta)
                return
            # Ray's collective transports cannot abort, and Ray kills both actors of a
            # failed transfer of theirs (a collective receive would wait for ever): so
            # does this one for a transfer it handed to them.
            logging.getLogger(__name__).error(
                "gpuring.ray: a transfer through %s failed; this actor ends, as Ray ends "
                "both actors of a failed %s transfer",
                comm.fallback,
                comm.fallback,
            )
            os._exit(1)
        with _local.lock:
            now = time.monotonic()
            _local.aborted[obj_id] = now
            _local.early.pop(obj_id, None)
            for k in [k for k, t in _local.aborted.items() if now - t > 3600]:
                del _local.aborted[k]


def _manager(name):
    from ray.experimental.rdt.util import get_tensor_transport_manager

    return get_tensor_transport_manager(name)


def _fallback_for(src_actor, dst_actor):
    """The transport (and its metadata) that carries a result between actors of two nodes."""
    from ray.experimental.collective import get_collective_groups

    name = _fallback
    if name is None:
        groups = get_collective_groups([src_actor, dst_actor])
        if len(groups) != 1:
            raise ValueError(
                "gpuring.ray: the two actors are on different nodes, where gpuring does not "
                "reach, and %s collective group holds both: make one "
                '(ray.experimental.collective.create_collective_group([a, b], backend="gloo" '
                'or "nccl")) or name a fallback in gpuring.ray.register(fallback=...)'
                % ("no" if not groups else "more than one")
            )
        name = str(getattr(groups[0].backend, "value", groups[0].backend)).upper()
    return name, _manager(name).get_communicator_metadata(src_actor, dst_actor, name)


class ActorChannel:
    """A queue between two actors (see :func:`channel`): pass it to both (it pickles by
    name) and call :meth:`put` in one, :meth:`get` in the other, as often as they like; no
    Ray call is made per item. Items are what :class:`gpuring.Queue` takes: tensors,
    arrays, any picklable object holding them."""

    def __init__(self, name, device, same_node, ray_queue, options):
        self.name = name
        self.device = device
        self.same_node = same_node
        self._ray_queue = ray_queue
        self._options = options
        self._q = None
        self._warned = False

    def __getstate__(self):
        return {
            "name": self.name,
            "device": self.device,
            "same_node": self.same_node,
            "ray_queue": self._ray_queue,
            "options": self._options,
        }

    def __setstate__(self, s):
        self.__init__(s["name"], s["device"], s["same_node"], s["ray_queue"], s["options"])

    def _queue(self):
        if self._q is None:
            device = self.device
            if device == "cuda":
                device = _own_gpu()
            self._q = Queue.open_or_create(self.name, device=device, **self._options)
        return self._q

    def _across(self):
        if not self._warned:
            self._warned = True
            warnings.warn(
                "gpuring.ray.channel %s: the two actors are on different nodes; items go "
                "through a ray.util.queue.Queue (Ray's object store: milliseconds an item)"
                % self.name,
                stacklevel=3,
            )
        return self._ray_queue

    def put(self, obj: Any, timeout: Optional[float] = None) -> None:
        """Queues ``obj``, waiting up to ``timeout`` s (forever if None) for room."""
        if self.same_node:
            self._queue().put(obj, timeout=timeout)
            _local.count("channel_puts")
        else:
            self._across().put(obj, timeout=timeout)
            _local.count("channel_puts_across")

    def get(self, timeout: Optional[float] = None, copy: bool = True) -> Any:
        """The next item, waiting up to ``timeout`` s (forever if None); raises
        :class:`gpuring.Empty` (a ``queue.Empty``) if none came. ``copy=False`` (same node
        only): zero-copy views that hold their slot until freed."""
        if self.same_node:
            item = self._queue().get(timeout=timeout, copy=copy)
            _local.count("channel_gets")
            return item
        from ray.util.queue import Empty as RayEmpty

        try:
            item = self._across().get(timeout=timeout)
        except RayEmpty as e:
            raise Empty(str(e)) from None
        _local.count("channel_gets_across")
        return item

    def close(self) -> None:
        """Leaves the channel from this process."""
        if self._q is not None:
            self._q.close()
            self._q = None

    def __repr__(self):
        return "ActorChannel(%r, %s)" % (
            self.name,
            "same node" if self.same_node else "across nodes",
        )


def channel(
    a,
    b,
    *,
    device: Any = None,
    maxsize: int = 0,
    slots: int = 8,
    slot_bytes: int = 1 << 20,
    prefetch: int = 4,
) -> ActorChannel:
    """A channel from actor ``a`` to actor ``b`` (called where both handles are, e.g. the
    driver; it asks Ray which node each is on). On one node, a :class:`gpuring.Queue`
    that either actor makes on first use: ``device=None`` carries tensors in host shared
    memory, ``device="cuda"`` (or an ordinal) in slots on each putter's GPU (``"cuda"``:
    the GPU Ray gave the actor; a getter on another GPU gets its copies there). Across nodes,
    a ``ray.util.queue.Queue`` (made here) carries them, and the first use warns.
    ``maxsize``, ``slots``, ``slot_bytes``, ``prefetch`` (on one node): as for
    :class:`gpuring.Queue`; ``b`` is the channel's one getter, so by default its ``get``
    of a GPU tensor takes up to 3 more that wait behind it and copies them in one launch
    (``prefetch=1``: one copy per ``get``). On a node whose cores are all busy, start both
    actors with ``runtime_env=`` :func:`runtime_env`."""
    same = _node_of(a) == _node_of(b)
    name = "%s%s-%s-ch%d" % (
        _PREFIX,
        a._actor_id.hex()[:12],
        b._actor_id.hex()[:12],
        _next_channel(),
    )
    ray_queue = None
    if not same:
        from ray.util.queue import Queue as RayQueue

        ray_queue = RayQueue(maxsize=maxsize)
    options = {
        "maxsize": maxsize,
        "slots": slots,
        "slot_bytes": slot_bytes,
        "large_slots": 2,
        "prefetch": prefetch,
    }
    return ActorChannel(name, device, same, ray_queue, options)


def runtime_env(base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A ``runtime_env`` for actors that stream through a :func:`channel`: ``base`` (not
    changed) with ``RAY_worker_niceness=0`` added to its ``env_vars``::

        @ray.remote(num_gpus=0.5, runtime_env=gpuring.ray.runtime_env())
        class Producer: ...

        Consumer.options(runtime_env=gpuring.ray.runtime_env({"pip": [...]})).remote()

    Ray's workers lower their own priority to niceness 15 as they start (Ray's
    ``worker_niceness``, so that busy workers yield to Ray's own processes); with this
    variable they keep the raylet's niceness (no privilege needed: Ray's job supervisor
    starts its actor this way). On a node whose every core is busy with work of normal
    priority, a channel's two ends at niceness 15 get a small share of the CPU and stream
    many times slower than at niceness 0; with cores to spare it makes no consistent
    difference (docs/RAY.md, "Actors that stream, on a busy node"). Ray's processes then
    share the CPU with these actors on equal terms: give it to the actors that stream, not
    to every actor."""
    env = dict(base or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars["RAY_worker_niceness"] = "0"
    env["env_vars"] = env_vars
    return env


_made = [0]


def _next_channel():
    with _local.lock:
        _made[0] += 1
        return (os.getpid() << 16) + _made[0]
