#!/usr/bin/env python3
"""Train a small Fashion-MNIST classifier with PyTorch's
DistributedDataParallel over gloo, one process per lent machine.

The lender's node gives each worker torchrun's contract (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): rank 0's
address is a tunnel to its machine, so the all-reduce of every step's
gradients crosses the job's tunnels. Each rank trains on its shard of
the training set; rank 0 evaluates on the test set and saves the model
to $DM_OUTPUT_DIR/model.pt, with result.json (its examples/s, the figure
`make bench-gpu` compares).

It trains on a GPU when it sees one (--device auto; a 1-GPU job's worker
sees its GPU) and over NCCL when every rank does.

By hand, on one machine:  python3 train.py --data /usr/share/datasets/fashion-mnist
"""

import argparse
import hashlib
import json
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
    p.add_argument("--model", choices=sorted(fmnist_torch.MODELS), default="mlp")
    p.add_argument("--steps-per-epoch", type=int, default=0,
                   help="steps an epoch (default: one pass over this rank's shard; more wraps around it)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU when torch sees one (CUDA_VISIBLE_DEVICES), else the CPU")
    p.add_argument("--out", default=os.environ.get("DM_OUTPUT_DIR", ""),
                   help="where model.pt and result.json go (default: $DM_OUTPUT_DIR; none when empty)")
    args = p.parse_args()
    t_start = time.time()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(int(os.environ.get("DM_CORES", 1)))
    torch.manual_seed(args.seed)  # every rank starts from the same weights
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world)
        print("rank %d of %d: joined, master %s:%s" % (rank, world, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
              flush=True)

    x, y, tx, ty = fmnist_torch.load(args.data)
    x, y = x[rank::world].to(device), y[rank::world].to(device)  # this rank's shard
    tx, ty = tx.to(device), ty.to(device)
    net = fmnist_torch.MODELS[args.model]().to(device)
    print("rank %d: model %s on %s (torch %s)" % (rank, args.model, device, torch.__version__), flush=True)
    ddp = DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = args.steps_per_epoch or len(x) // args.batch
    total = steps_per_epoch * args.epochs
    g = torch.Generator().manual_seed(args.seed + rank)
    start, step, first_step = time.time(), 0, None
    fmnist_torch.report(0, total, force=True)
    for epoch in range(args.epochs):
        order = torch.cat([torch.randperm(len(x), generator=g)
                           for _ in range(-(-steps_per_epoch * args.batch // len(x)))]).to(device)
        correct = 0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad()
            out = ddp(x[idx])
            loss = loss_fn(out, y[idx])
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            step += 1
            correct += (out.argmax(1) == y[idx]).sum()  # on the device: no wait for the step each step
            if first_step is None:
                first_step = time.time() - t_start
            fmnist_torch.report(step, total, loss=loss)
        acc = correct.item() / (steps_per_epoch * args.batch)
        print("rank %d epoch %d: loss %.4f, train accuracy %.4f, %d steps in %.1fs" %
              (rank, epoch + 1, loss.item(), acc, step, time.time() - start), flush=True)
    train_s = time.time() - start  # .item() above waited for the last step

    # DDP keeps every rank's weights equal: each says so with a digest.
    digest = hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in net.state_dict().values())).hexdigest()
    print("rank %d: weights sha256 %s" % (rank, digest[:16]), flush=True)
    if rank == 0:
        with torch.no_grad():
            # In chunks: a conv net's activations for the whole test set
            # would take gigabytes.
            test_acc = sum((net(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum().item()
                           for i in range(0, len(tx), 1000)) / len(tx)
        print("test accuracy %.4f after %d steps of %d workers in %.1fs" % (test_acc, step, world, time.time() - start),
              flush=True)
        fmnist_torch.report(step, total, loss=loss.item(), eval_accuracy=test_acc, force=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            torch.save(net.state_dict(), os.path.join(args.out, "model.pt"))
            result = {"framework": "torch", "torch": torch.__version__, "device": str(device), "model": args.model,
                      "workers": world, "epochs": args.epochs, "steps_per_epoch": steps_per_epoch,
                      "global_batch_size": args.batch * world, "test_accuracy": round(test_acc, 4),
                      "fit_seconds": round(train_s, 3), "first_step_seconds": round(first_step or 0.0, 3),
                      "examples_per_s": round(step * args.batch * world / train_s, 1) if train_s > 0 else 0.0}
            tmp = os.path.join(args.out, "result.json.tmp")
            with open(tmp, "w") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, os.path.join(args.out, "result.json"))
    else:
        fmnist_torch.report(step, total, loss=loss.item(), force=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
