"""Can a process that sees only GPU 1 (CUDA_VISIBLE_DEVICES=1) open a CUDA IPC memory handle
of memory on GPU 0 (exported by a process that sees only GPU 0), and an IPC event handle?
Driver API through ctypes; run with no argument (parent)."""
import ctypes, os, subprocess, sys

cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(s))
        raise SystemExit("%s: error %d %s" % (what, r, s.value))

class H(ctypes.Structure):
    _fields_ = [("b", ctypes.c_char * 64)]

def ctx():
    ck(cu.cuInit(0), "cuInit")
    n = ctypes.c_int()
    ck(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    c = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev), "retain")
    ck(cu.cuCtxSetCurrent(c), "setcurrent")
    return n.value

N = 1 << 18
role = sys.argv[1] if len(sys.argv) > 1 else "parent"
if role == "export":
    print("exporter sees", ctx(), "GPU(s), CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    p = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(p), N * 4), "alloc")
    ck(cu.cuMemsetD32_v2(p, 0x12345678, N), "memset")
    h = H()
    ck(cu.cuIpcGetMemHandle(ctypes.byref(h), p), "cuIpcGetMemHandle")
    ev = ctypes.c_void_p()
    ck(cu.cuEventCreate(ctypes.byref(ev), 0x2 | 0x4), "event (disable timing, interprocess)")
    ck(cu.cuEventRecord(ev, None), "record")
    eh = H()
    ck(cu.cuIpcGetEventHandle(ctypes.byref(eh), ev), "cuIpcGetEventHandle")
    ck(cu.cuCtxSynchronize(), "sync")
    sys.stdout.buffer.write(b"H" + h.b.hex().encode() + b" " + eh.b.hex().encode() + b"\n")
    sys.stdout.flush()
    sys.stdin.readline()  # wait for the importer
elif role == "import":
    mh, eh = sys.argv[2], sys.argv[3]
    print("importer sees", ctx(), "GPU(s), CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    h = H(); h.b = bytes.fromhex(mh)
    p = ctypes.c_uint64()
    r = cu.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1)  # LAZY_ENABLE_PEER_ACCESS
    print("cuIpcOpenMemHandle ->", r, flush=True)
    if r == 0:
        out = (ctypes.c_uint32 * N)()
        ck(cu.cuMemcpyDtoH_v2(out, p, N * 4), "DtoH")
        print("values right:", all(v == 0x12345678 for v in out[:1000]) and out[N - 1] == 0x12345678)
        # a kernel-free device copy on this GPU from the peer's memory
        q = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(q), N * 4), "alloc local")
        ck(cu.cuMemcpyDtoD_v2(q, p, N * 4), "DtoD from the peer")
        out2 = (ctypes.c_uint32 * 4)()
        ck(cu.cuMemcpyDtoH_v2(out2, q, 16), "DtoH local")
        print("device copy from the peer right:", list(out2) == [0x12345678] * 4)
    e = H(); e.b = bytes.fromhex(eh)
    ev = ctypes.c_void_p()
    r = cu.cuIpcOpenEventHandle(ctypes.byref(ev), e)
    print("cuIpcOpenEventHandle ->", r)
    if r == 0:
        print("cuStreamWaitEvent ->", cu.cuStreamWaitEvent(None, ev, 0), "sync ->", cu.cuCtxSynchronize())
else:
    env0 = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    env1 = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
    a = subprocess.Popen([sys.executable, __file__, "export"], env=env0, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    line = a.stdout.readline()
    print(line.decode().strip())
    line = a.stdout.readline().decode().strip()
    mh, eh = line[1:].split()
    b = subprocess.run([sys.executable, __file__, "import", mh, eh], env=env1)
    a.stdin.write(b"\n"); a.stdin.flush(); a.wait()
    print("importer exit", b.returncode)
