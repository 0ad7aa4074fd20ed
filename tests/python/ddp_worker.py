"""One worker of test_ddp.py: trains the same tiny model twice from the same
start, once with DDP's own gloo allreduce and once through giftd (the gift
comm hook on DDP, or with argv[4] == "reducer" gift.torch.GiftReducer
without DDP), and saves both final parameter sets to argv[1].

    ddp_worker.py OUT COMM STEPS [ddp|reducer]"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import gift.torch  # noqa: E402


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.LayerNorm(64), nn.Linear(64, 256),
                         nn.Tanh(), nn.Linear(256, 128), nn.Tanh(), nn.Linear(128, 4))


def train(ddp, steps, rank, seed=1, reducer=None):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed * 100 + rank)
    for _ in range(steps):
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        if reducer is not None:
            reducer.synchronize()
        opt.step()


def main():
    out, comm, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "ddp"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()

    ref = DDP(make_model(), bucket_cap_mb=0.1)
    train(ref, steps, rank)

    model = make_model()
    policy = gift.torch.Policy.from_comm(comm, refresh=2, min_numel=8192)
    if mode == "reducer":
        state = gift.torch.GiftReducer(model, policy=policy)
        train(model, steps, rank, reducer=state)
    else:
        state = gift.torch.GiftState(model, policy=policy)
        ddp = DDP(model, bucket_cap_mb=0.1)
        ddp.register_comm_hook(state, gift.torch.comm_hook)
        train(ddp, steps, rank)
    stats = state.stats()
    torch.save({"ref": {k: v.detach().clone() for k, v in ref.module.state_dict().items()},
                "gift": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "steps": state.step, "stats": stats,
                "geometry": [t.name for t in state.tensors if t.geometry]}, out)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
