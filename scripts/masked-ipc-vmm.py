"""Can a process that sees only GPU 1 import (cuMemImportFromShareableHandle, a POSIX fd
passed over a Unix socket) and read memory made by cuMemCreate on GPU 0 in a process that
sees only GPU 0? Driver API through ctypes. No argument: a POSIX fd; `fabric`: a fabric
handle (64 bytes, no fd), where the driver offers it."""
import ctypes, os, socket, subprocess, sys

cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(s))
        raise SystemExit("%s: error %d %s" % (what, r, s.value))

class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure):
    _fields_ = [("compression", ctypes.c_ubyte), ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location", Loc), ("win32", ctypes.c_void_p), ("flags", Flags)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

def ctx():
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    c = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev), "retain")
    ck(cu.cuCtxSetCurrent(c), "setcurrent")

KIND = 8 if "fabric" in sys.argv else 1  # CU_MEM_HANDLE_TYPE_FABRIC or _POSIX_FILE_DESCRIPTOR


def prop():
    p = Prop()
    p.type, p.handle_types = 1, KIND  # PINNED
    p.location.type, p.location.id = 1, 0  # DEVICE, ordinal 0 (this process's only GPU)
    return p

def mapped(h, size):
    ptr = ctypes.c_uint64()
    ck(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)), "reserve")
    ck(cu.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_uint64(0)), "cuMemMap")
    a = Access(); a.location.type, a.location.id, a.flags = 1, 0, 3
    r = cu.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(a), ctypes.c_size_t(1))
    return ptr, r

role = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in ("export", "import") else "parent"
if role == "export":
    sock = socket.socket(fileno=int(sys.argv[2]))
    ctx()
    p = prop()
    g = ctypes.c_size_t()
    ck(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
    size = g.value
    h = ctypes.c_uint64()
    ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_uint64(0)), "cuMemCreate")
    ptr, r = mapped(h, size)
    ck(r, "setaccess (exporter)")
    ck(cu.cuMemsetD32_v2(ptr, 0x12345678, size // 4), "memset")
    ck(cu.cuCtxSynchronize(), "sync")
    if KIND == 8:
        blob = (ctypes.c_ubyte * 64)()
        ck(cu.cuMemExportToShareableHandle(blob, h, 8, ctypes.c_uint64(0)), "export (fabric)")
        sock.send(str(size).encode().ljust(16) + bytes(blob))
    else:
        fd = ctypes.c_int()
        ck(cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_uint64(0)), "export")
        socket.send_fds(sock, [str(size).encode()], [fd.value])
    sock.recv(1)  # the importer is done
elif role == "import":
    sock = socket.socket(fileno=int(sys.argv[2]))
    ctx()
    h = ctypes.c_uint64()
    if KIND == 8:
        msg = sock.recv(80)
        size = int(msg[:16])
        blob = (ctypes.c_ubyte * 64).from_buffer_copy(msg[16:80])
        r = cu.cuMemImportFromShareableHandle(ctypes.byref(h), blob, 8)
    else:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
        size = int(msg)
        r = cu.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fds[0]), 1)
    print("cuMemImportFromShareableHandle ->", r, flush=True)
    if r == 0:
        ptr, r = mapped(h, size)
        print("cuMemSetAccess for this GPU ->", r, flush=True)
        if r == 0:
            out = (ctypes.c_uint32 * 16)()
            ck(cu.cuMemcpyDtoH_v2(out, ptr, 64), "DtoH")
            print("values right:", list(out) == [0x12345678] * 16)
            q = ctypes.c_uint64()
            ck(cu.cuMemAlloc_v2(ctypes.byref(q), size), "alloc local")
            ck(cu.cuMemcpyDtoD_v2(q, ptr, size), "DtoD from the peer")
            ck(cu.cuMemcpyDtoH_v2(out, q, 64), "DtoH local")
            print("device copy from the peer right:", list(out) == [0x12345678] * 16)
    sock.send(b"x")
else:
    s1, s2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env0 = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    env1 = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
    extra = sys.argv[1:]
    a = subprocess.Popen([sys.executable, __file__, "export", str(s1.fileno())] + extra, env=env0, pass_fds=[s1.fileno()])
    b = subprocess.Popen([sys.executable, __file__, "import", str(s2.fileno())] + extra, env=env1, pass_fds=[s2.fileno()])
    print("exporter exit", a.wait(), "importer exit", b.wait())
