"""Can a process that sees only GPU 1 (CUDA_VISIBLE_DEVICES=1, as Ray gives an actor its GPU)
map memory of GPU 0 made by a process that sees only GPU 0? Driver API through ctypes, on a
machine with two GPUs:

    python scripts/masked-ipc.py legacy   # cuIpcGetMemHandle / cuIpcOpenMemHandle, IPC events
    python scripts/masked-ipc.py legacy-seen  # the same, the importer seeing both GPUs (control)
    python scripts/masked-ipc.py fd       # cuMemCreate, its POSIX fd passed over a Unix socket
    python scripts/masked-ipc.py fabric   # cuMemCreate, a fabric handle (64 bytes, no fd)

The parent starts the exporter (GPU 0 only) and the importer (GPU 1 only) and joins them;
each prints what its driver calls returned. Data: docs/data/h200x2-2026-11-29-ipc-across-visible-masks.txt.
"""

import ctypes
import os
import socket
import subprocess
import sys

cu = ctypes.CDLL("libcuda.so.1")
N = 1 << 18  # u32 words of the legacy allocation
WORD = 0x12345678


def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(s))
        raise SystemExit("%s: error %d %s" % (what, r, s.value))


def ctx():
    """The primary context of this process's GPU (the last one it sees); prints what it sees."""
    ck(cu.cuInit(0), "cuInit")
    n = ctypes.c_int()
    ck(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), n.value - 1), "cuDeviceGet")
    c = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(c), "cuCtxSetCurrent")
    print(
        "%s sees %d GPU(s), CUDA_VISIBLE_DEVICES=%s"
        % (sys.argv[1], n.value, os.environ.get("CUDA_VISIBLE_DEVICES")),
        flush=True,
    )


def recv_exact(sock, n):
    """`n` bytes from the other process (an error if it ended first)."""
    got = b""
    while len(got) < n:
        part = sock.recv(n - len(got))
        if not part:
            raise SystemExit("the exporter gave nothing")
        got += part
    return got


def check_read(ptr, size):
    """Reads the peer's memory to the host and copies it on this GPU; both must hold WORD."""
    out = (ctypes.c_uint32 * 16)()
    ck(cu.cuMemcpyDtoH_v2(out, ptr, 64), "cuMemcpyDtoH")
    print("values right:", list(out) == [WORD] * 16)
    q = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(q), size), "cuMemAlloc (local)")
    ck(cu.cuMemcpyDtoD_v2(q, ptr, size), "cuMemcpyDtoD from the peer")
    ck(cu.cuMemcpyDtoH_v2(out, q, 64), "cuMemcpyDtoH (local)")
    print("device copy from the peer right:", list(out) == [WORD] * 16)


# Legacy CUDA IPC (what gpuring's device pools use).
class Handle(ctypes.Structure):
    _fields_ = [("b", ctypes.c_char * 64)]


def legacy_export(sock):
    ctx()
    p = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(p), N * 4), "cuMemAlloc")
    ck(cu.cuMemsetD32_v2(p, WORD, N), "cuMemsetD32")
    h = Handle()
    ck(cu.cuIpcGetMemHandle(ctypes.byref(h), p), "cuIpcGetMemHandle")
    ev = ctypes.c_void_p()
    ck(cu.cuEventCreate(ctypes.byref(ev), 0x2 | 0x4), "cuEventCreate (no timing, interprocess)")
    ck(cu.cuEventRecord(ev, None), "cuEventRecord")
    eh = Handle()
    ck(cu.cuIpcGetEventHandle(ctypes.byref(eh), ev), "cuIpcGetEventHandle")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    sock.sendall(bytes(h) + bytes(eh))  # (not `h.b`: a c_char field stops at a NUL)
    sock.recv(1)  # the importer is done


def legacy_import(sock):
    ctx()
    got = recv_exact(sock, 128)
    h, e = Handle.from_buffer_copy(got[:64]), Handle.from_buffer_copy(got[64:])
    p = ctypes.c_uint64()
    r = cu.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1)  # LAZY_ENABLE_PEER_ACCESS
    print("cuIpcOpenMemHandle ->", r, flush=True)
    if r == 0:
        check_read(p, N * 4)
    ev = ctypes.c_void_p()
    r = cu.cuIpcOpenEventHandle(ctypes.byref(ev), e)
    print("cuIpcOpenEventHandle ->", r, flush=True)
    sock.send(b"x")


# Virtual memory management: cuMemCreate, exported as a POSIX fd or a fabric handle.
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compression", ctypes.c_ubyte),
        ("rdma", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class Prop(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("location", Loc),
        ("win32", ctypes.c_void_p),
        ("flags", AllocFlags),
    ]


class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]


def kind():
    return 8 if sys.argv[2] == "fabric" else 1  # CU_MEM_HANDLE_TYPE_FABRIC, _POSIX_FILE_DESCRIPTOR


def mapped(h, size):
    """`h` mapped into this process, readable and writable by its GPU: (address, the
    cuMemSetAccess result)."""
    ptr = ctypes.c_uint64()
    z = ctypes.c_uint64(0)
    ck(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), z, z), "cuMemAddressReserve")
    ck(cu.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h, z), "cuMemMap")
    a = Access()
    a.location.type, a.location.id, a.flags = 1, 0, 3  # this process's GPU, read-write
    return ptr, cu.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(a), ctypes.c_size_t(1))


def vmm_export(sock):
    ctx()
    p = Prop()
    p.type, p.handle_types = 1, kind()  # pinned
    p.location.type, p.location.id = 1, 0  # this process's GPU
    g = ctypes.c_size_t()
    ck(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
    size = g.value
    h = ctypes.c_uint64()
    ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_uint64(0)), "cuMemCreate")
    ptr, r = mapped(h, size)
    ck(r, "cuMemSetAccess (exporter)")
    ck(cu.cuMemsetD32_v2(ptr, WORD, size // 4), "cuMemsetD32")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    if kind() == 8:
        blob = (ctypes.c_ubyte * 64)()
        ck(cu.cuMemExportToShareableHandle(blob, h, 8, ctypes.c_uint64(0)), "export (fabric)")
        sock.sendall(str(size).encode().ljust(16) + bytes(blob))
    else:
        fd = ctypes.c_int()
        ck(cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_uint64(0)), "export (fd)")
        socket.send_fds(sock, [str(size).encode()], [fd.value])
    sock.recv(1)  # the importer is done


def vmm_import(sock):
    ctx()
    h = ctypes.c_uint64()
    if kind() == 8:
        msg = recv_exact(sock, 80)
        size = int(msg[:16])
        blob = (ctypes.c_ubyte * 64).from_buffer_copy(msg[16:80])
        r = cu.cuMemImportFromShareableHandle(ctypes.byref(h), blob, 8)
    else:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
        if not fds:
            raise SystemExit("the exporter gave nothing")
        size = int(msg)
        r = cu.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fds[0]), 1)
    print("cuMemImportFromShareableHandle ->", r, flush=True)
    if r == 0:
        ptr, r = mapped(h, size)
        print("cuMemSetAccess for this GPU ->", r, flush=True)
        if r == 0:
            check_read(ptr, size)
    sock.send(b"x")


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("legacy", "legacy-seen", "fd", "fabric"):
        s1, s2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        procs = []
        seen = "0,1" if sys.argv[1] == "legacy-seen" else "1"  # the importer uses the last
        how = "legacy" if sys.argv[1] == "legacy-seen" else sys.argv[1]
        for role, gpu, s in (("exporter", "0", s1), ("importer", seen, s2)):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            args = [sys.executable, __file__, role, how, str(s.fileno())]
            procs.append(subprocess.Popen(args, env=env, pass_fds=[s.fileno()]))
        s1.close()
        s2.close()
        print("exporter exit", procs[0].wait(), "importer exit", procs[1].wait())
        return
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    role, how, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sock = socket.socket(fileno=fd)
    run = {
        ("exporter", "legacy"): legacy_export,
        ("importer", "legacy"): legacy_import,
        ("exporter", "fd"): vmm_export,
        ("importer", "fd"): vmm_import,
        ("exporter", "fabric"): vmm_export,
        ("importer", "fabric"): vmm_import,
    }[(role, how)]
    run(sock)


if __name__ == "__main__":
    main()
