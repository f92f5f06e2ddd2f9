// One launch that copies several tensors into one GPU slot (or out of it): the copies of a
// message's CUDA tensors, where a driver copy or a torch launch per tensor costs 5-8 µs of
// CPU each. Compiled to PTX by scripts/gather-ptx.sh (nvcc on the GPU machine); the PTX
// is checked in beside this file and loaded by python/src/gather.rs.
//
// The table travels by value in the launch's parameters (no device memory to fill first):
// at most GATHER_MAX parts a launch. Block row y copies part y; a part's bytes are spread
// over the row's blocks and threads, 16 bytes at a time where both ends and the length
// are 16-byte aligned (slot offsets are 256-aligned; torch's allocations are 512-aligned),
// else a byte at a time.

#define GATHER_MAX 64

struct Part {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long n;
};

struct Table {
    Part p[GATHER_MAX];
};

extern "C" __global__ void gpuring_gather(Table t) {
    const Part p = t.p[blockIdx.y];
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    if (((p.src | p.dst | p.n) & 15ull) == 0) {
        const uint4* s = (const uint4*)p.src;
        uint4* d = (uint4*)p.dst;
        const unsigned long long m = p.n >> 4;
        for (unsigned long long k = first; k < m; k += step) {
            d[k] = s[k];
        }
    } else {
        const unsigned char* s = (const unsigned char*)p.src;
        unsigned char* d = (unsigned char*)p.dst;
        for (unsigned long long k = first; k < p.n; k += step) {
            d[k] = s[k];
        }
    }
}
