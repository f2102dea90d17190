"""Runs learners' Accelerate loops on every rank and reports what happened (used by exercises.py).

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.exercise_runner FILE:FUNCTION ...

For every FILE:FUNCTION, in order: a fresh model (seed 0), SGD and a shuffled loader of the
digits (B/N = 32 per process), then FUNCTION(accelerator, model, optimizer, loader, epochs).
Rank 0 prints one line per function: ``exercise: {json}`` with the optimizer steps this rank
took, the batches of the whole loader, accelerator.backward calls, what was prepared, the
Accelerators the function made itself, the largest weight difference between ranks and the
held-out accuracy.
"""
from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from source_code.cli import Parser, positive_int
from source_code.distributed import cleanup, print0, report_device, run_main
from source_code.frameworks import common
from source_code.training import loop

SETTINGS = SimpleNamespace(model="smallcnn", dataset="digits", data_dir="data", seed=0, lr=0.05,
                           momentum=0.9, batch_size=64, workers=0)


def load(spec: str):
    """The function, or one that raises what defining it raised (that function's report says so;
    the others still run)."""
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location(f"learner_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        return getattr(module, name)
    except Exception as exc:
        def failed_to_define(*_):
            raise exc
        return failed_to_define


def weight_spread(model) -> float:
    """Largest difference of any weight between this rank and rank 0 (collective).

    The tensors travel where the process group can carry them (``report_device``): the CPU
    through gloo (Accelerator(cpu=True), our mixed group), this process's GPU through a
    framework's plain NCCL group, which has no CPU backend."""
    if not dist.is_initialized():
        return 0.0
    device = report_device()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(device)
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = (flat - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return diff.item()


def run_one(fn, epochs: int, world_size: int) -> dict:
    from accelerate import Accelerator

    class Counting(Accelerator):
        """The given accelerator: counts what it prepares and its backward and optimizer steps."""
        backward_calls = models = optimizers = steps = 0

        def backward(self, loss, **kwargs):
            Counting.backward_calls += 1
            return super().backward(loss, **kwargs)

        def prepare_model(self, *args, **kwargs):
            Counting.models += 1
            return super().prepare_model(*args, **kwargs)

        def prepare_optimizer(self, *args, **kwargs):
            Counting.optimizers += 1
            prepared = super().prepare_optimizer(*args, **kwargs)
            step = prepared.step

            def counted_step(*a, **k):
                Counting.steps += 1
                return step(*a, **k)

            prepared.step = counted_step
            return prepared

    accelerator = Counting(cpu=True)
    train_set, test_loader = common.datasets(SETTINGS)
    model, optimizer = loop.build(SETTINGS, "cpu")
    steps = [0]
    optimizer.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    loader = DataLoader(train_set, batch_size=loop.per_rank_batch(SETTINGS.batch_size, world_size),
                        shuffle=True, generator=torch.Generator().manual_seed(SETTINGS.seed))
    report = {"todo": False, "error": "", "epochs": epochs, "batches": len(loader) * epochs,
              "world_size": world_size}
    made = []   # Accelerators the function makes itself (the check reads the one it gives)
    given_init = Accelerator.__init__

    def noted_init(self, *args, **kwargs):
        made.append(type(self).__name__)
        given_init(self, *args, **kwargs)

    def trackers_only(self):
        """end_training, a script's last line, is right inside the function too; the process
        group is this launch's, ended after every function's verdict: only trackers finish here."""
        for tracker in self.trackers:
            tracker.finish()

    given_end = Accelerator.end_training
    Accelerator.__init__, Accelerator.end_training = noted_init, trackers_only
    try:
        fn(accelerator, model, optimizer, loader, epochs)
    except NotImplementedError:
        report["todo"] = True
    except Exception as exc:  # reported to the learner, not a crash of the check
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        Accelerator.__init__, Accelerator.end_training = given_init, given_end
    report.update(steps=steps[0], backward_calls=Counting.backward_calls, own_accelerators=len(made),
                  models_prepared=Counting.models > 0, optimizers_prepared=Counting.optimizers > 0,
                  prepared_steps=Counting.steps,
                  weight_diff=weight_spread(model),  # the original module: prepare wraps, not copies
                  accuracy=loop.evaluate(model, test_loader, torch.device("cpu")))
    return report


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=positive_int, default=2)
    p.add_argument("loops", nargs="+", help="FILE:FUNCTION of each loop to run")
    args = p.parse_args(argv)
    job = common.Job()
    fns = [load(spec) for spec in args.loops]
    common.quiet(job.rank)
    torch.set_num_threads(1)
    try:
        for fn in fns:
            print0("exercise: " + json.dumps(run_one(fn, args.epochs, job.world_size)))
    except BaseException:
        cleanup(barrier=False)
        raise
    cleanup()
    return 0


if __name__ == "__main__":
    run_main(main)
