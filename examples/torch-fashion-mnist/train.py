#!/usr/bin/env python3
"""Train a small Fashion-MNIST classifier with PyTorch's
DistributedDataParallel over gloo, one process per lent machine.

The lender's node gives each worker torchrun's contract (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): rank 0's
address is a tunnel to its machine, so the all-reduce of every step's
gradients crosses the job's tunnels. Each rank trains on its shard of
the training set; rank 0 evaluates on the test set and saves the model
to $DM_OUTPUT_DIR/model.pt.

By hand, on one machine:  python3 train.py --data /usr/share/datasets/fashion-mnist
"""

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import fmnist_torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("DM_DATA_DIR", "/usr/share/datasets/fashion-mnist"),
                   help="directory with the four Fashion-MNIST IDX files (default: $DM_DATA_DIR)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=128, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(int(os.environ.get("DM_CORES", 1)))
    torch.manual_seed(args.seed)  # every rank starts from the same weights
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        print("rank %d of %d: joined, master %s:%s" % (rank, world, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
              flush=True)

    x, y, tx, ty = fmnist_torch.load(args.data)
    x, y = x[rank::world], y[rank::world]  # this rank's shard
    net = fmnist_torch.model()
    ddp = DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = len(x) // args.batch
    total = steps_per_epoch * args.epochs
    g = torch.Generator().manual_seed(args.seed + rank)
    start, step = time.time(), 0
    fmnist_torch.report(0, total, force=True)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=g)
        correct = 0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad()
            out = ddp(x[idx])
            loss = loss_fn(out, y[idx])
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            step += 1
            correct += (out.argmax(1) == y[idx]).sum().item()
            fmnist_torch.report(step, total, loss=loss.item())
        acc = correct / (steps_per_epoch * args.batch)
        print("rank %d epoch %d: loss %.4f, train accuracy %.4f, %d steps in %.1fs" %
              (rank, epoch + 1, loss.item(), acc, step, time.time() - start), flush=True)

    # DDP keeps every rank's weights equal: each says so with a digest.
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in net.state_dict().values())).hexdigest()
    print("rank %d: weights sha256 %s" % (rank, digest[:16]), flush=True)
    if rank == 0:
        with torch.no_grad():
            test_acc = (net(tx).argmax(1) == ty).float().mean().item()
        print("test accuracy %.4f after %d steps of %d workers in %.1fs" % (test_acc, step, world, time.time() - start),
              flush=True)
        fmnist_torch.report(step, total, loss=loss.item(), eval_accuracy=test_acc, force=True)
        out_dir = os.environ.get("DM_OUTPUT_DIR")
        if out_dir:
            torch.save(net.state_dict(), os.path.join(out_dir, "model.pt"))
    else:
        fmnist_torch.report(step, total, loss=loss.item(), force=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
