"""PyTorch's NCCL all-reduce, the peer of `dist_bench`'s all-reduce: one process a GPU
(torch.multiprocessing), f32 sum in place, the same sizes, timed the same way (CUDA events around 20
back-to-back calls after 5 warm-up calls; the slowest rank's mean). Prints one JSON document.

    python3 bench/dist_peers.py [--quick] [--out FILE.json]

NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the multi-GPU hosts are shared.
"""
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30]
QUICK = [1 << 20, 64 << 20]


def worker(rank, world, sizes, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    out = []
    for nbytes in sizes:
        x = torch.rand(nbytes // 4, device="cuda") * 2 - 1
        for _ in range(5):
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
        dist.barrier()
        iters = 20
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
        e1.record()
        torch.cuda.synchronize()
        out.append((nbytes, e0.elapsed_time(e1) / 1e3 / iters))
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def main():
    quick = "--quick" in sys.argv
    out_path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    world = torch.cuda.device_count()
    sizes = QUICK if quick else SIZES
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, world, sizes, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in range(world)]
    for p in procs:
        p.join(timeout=120)
    rows = []
    for i, nbytes in enumerate(sizes):
        t = max(r[1][i][1] for r in results)
        bus = nbytes * 2 * (world - 1) / world / t / 1e9
        rows.append({"bytes": nbytes, "time_s": t, "bus_gbps": bus})
    doc = {
        "world": world,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "all_reduce": rows,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
