"""The plain DDP training of source_code/training/ddp.py, written for PyTorch Lightning.

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.lightning_train
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.lightning_train --strategy model-parallel
    srun --ntasks-per-node=2 python -m source_code.frameworks.lightning_train     # Slurm starts the ranks

--strategy ddp: Lightning's DDPStrategy (gloo on CPU, NCCL on GPUs).
--strategy model-parallel: ModelParallelStrategy(data_parallel_size=N, tensor_parallel_size=1)
    with fully_shard (FSDP2) applied in configure_model: sharded parameters, on CPU too.
--strategy fsdp: Lightning's FSDPStrategy; it needs GPUs (on CPU: a one-line error).
Lightning forms the process group itself from torchrun's or Slurm's variables; devices x
num_nodes must equal the world size, so they are read from the launcher, never typed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from source_code import torch_versions
from source_code.distributed import all_reduce_mean, print0, run_main
from source_code.errors import LaunchError
from source_code.frameworks import common
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.lightning_train"
STRATEGIES = ("ddp", "model-parallel", "fsdp")


def make_module(args):
    import lightning as L

    class Classifier(L.LightningModule):
        """The plain script's model, loss and optimizer; Lightning runs the loop."""

        def __init__(self):
            super().__init__()
            self.model, _ = loop.build(args, "cpu")  # same seed, same initial weights on every rank
            self.losses = []

        def configure_model(self):  # called once the process group and the mesh exist
            if args.strategy == "model-parallel":
                from torch.distributed.fsdp import fully_shard
                fully_shard(self.model, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.losses.append(loss.item())
            self.trained_on = self.device  # after fit, Lightning moves a DDP model back to the CPU
            return loss  # Lightning calls zero_grad, backward (gradients averaged) and step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=args.lr, momentum=args.momentum)

    return Classifier()


def make_trainer(args, job):
    import lightning as L
    if args.strategy == "model-parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy
        strategy = ModelParallelStrategy(data_parallel_size=job.world_size, tensor_parallel_size=1)
    else:
        strategy = args.strategy
    return L.Trainer(
        accelerator="gpu" if job.device_type == "cuda" else "cpu", strategy=strategy,
        devices=job.local_world_size, num_nodes=job.num_nodes,  # product = world size
        max_epochs=args.epochs, limit_train_batches=args.max_steps or None,
        use_distributed_sampler=False,  # our loader already has the plain script's sampler
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0)


def train(args, job) -> dict:
    import lightning  # noqa: F401  (6-11 s; it sets up its loggers, which quiet() then tones down)
    common.quiet(job.rank)
    train_set, test_loader = common.datasets(args)
    module = make_module(args)
    trainer = make_trainer(args, job)
    loader = common.sharded_loader(train_set, args, job.rank, job.world_size, job.device_type)
    common.say(job, f"lightning {args.strategy}: {len(train_set)} examples, world_size={job.world_size} "
           f"({job.num_nodes} node(s) x {job.local_world_size}), launched by {job.launcher}")
    timer = loop.Timer()
    trainer.fit(module, train_dataloaders=loader)
    seconds = timer.seconds
    steps = trainer.global_step
    per_epoch = max(len(module.losses) // args.epochs, 1)
    loss = all_reduce_mean(sum(module.losses[-per_epoch:]) / per_epoch)
    # every rank evaluates where it trained: a sharded model's forward all-gathers its parameters
    device = module.trained_on
    module.model.to(device)  # Lightning's DDP teardown left it on the CPU; no-op for sharded ones
    accuracy = loop.evaluate(module.model, test_loader, device)
    if args.save_weights:
        state = common.full_state_dict(module.model)
        if job.rank == 0:
            torch.save(state, args.save_weights)
    print0(common.summary(job.world_size, args.epochs, accuracy, seconds, steps, loss, device))
    return {"accuracy": accuracy}


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    args = parser.parse_args(argv)
    common.check(args)
    job = common.Job()
    job.check_batch(args.batch_size)
    if args.strategy == "fsdp" and job.device_type != "cuda":
        raise LaunchError("error: Lightning's FSDPStrategy needs GPUs; on CPU use --strategy "
                          "model-parallel (fully_shard through ModelParallelStrategy)")
    if args.strategy == "model-parallel":
        torch_versions.require("fsdp2", job.device_type)   # fully_shard inside Lightning: the same limits
    return common.run(train, args, job)


if __name__ == "__main__":
    run_main(main)
