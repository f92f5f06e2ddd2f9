"""The torch row of the pinned-slot bench (issue 16): a 54 MB CUDA tensor handed from a GPU
process to a CPU process the way people do without gpuring, `t.cpu()` then a
`multiprocessing.Queue` (spawn). The consumer touches the first and last element of each
tensor, as the gpuring bench's sink does. Prints items/s and GB/s (median of 5 rounds).

    /opt/torch/.venv/bin/python3 scripts/pinned-torch.py [items_per_round]
"""
import multiprocessing as mp
import statistics
import sys
import time

BYTES = 54 << 20


def consumer(q, done):
    import torch  # noqa: F401  (unpickles tensors)
    acc = 0
    while True:
        t = q.get()
        if t is None:
            break
        acc ^= int(t[0]) ^ int(t[-1])
        done.put(1)


def main():
    import torch
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(maxsize=4), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, done))
    p.start()
    src = torch.full((BYTES,), 7, dtype=torch.uint8, device="cuda")
    for _ in range(4):  # warm-up
        q.put(src.cpu())
        done.get()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            q.put(src.cpu())
        for _ in range(n):
            done.get()
        rounds.append(n / (time.perf_counter() - t0))
    q.put(None)
    p.join()
    rate = statistics.median(rounds)
    print(f"torch_cpu_then_mp_queue 54MB: {rate:.1f} items/s, {rate * BYTES / 1e9:.2f} GB/s "
          f"(median of 5 rounds of {n}; rounds {', '.join(f'{r:.1f}' for r in rounds)})")


if __name__ == "__main__":
    main()
