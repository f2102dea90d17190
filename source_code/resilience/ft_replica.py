"""One replica group of per-step fault-tolerant training with torchft (here: one process per group).

    python -m source_code.resilience.ft_run          # starts the lighthouse and the replicas
    python -m source_code.resilience.ft_replica --lighthouse http://127.0.0.1:PORT --replica 0

What changes against notebook 05's DDP loop, line by line:
* a ``Manager`` per replica group talks to the lighthouse: before every step it asks who is
  alive (the quorum); a group that is behind (a restarted one) receives the model and optimizer
  state from a live peer over HTTP before it steps: no checkpoint file is read;
* ``torchft.DistributedDataParallel`` averages the gradients over the groups in this step's
  quorum only; a group that died mid-step makes the all-reduce fail instead of hang;
* ``torchft.Optimizer.step`` applies the update only when every group in the quorum says the
  step went well (``should_commit``): a failed step is thrown away, not half-applied.

``--kill-at-step N`` (the fault drill): on the first attempt the process SIGKILLs itself right
after committing step N, as a node failure would end it. ``--gate`` makes the first attempt of
every group wait until all have their manager up, so that they start stepping together.
"""
from __future__ import annotations

import datetime
import os
import signal
import time

import torch

from source_code import workload
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.errors import run_main
from source_code.resilience import common


def train(args) -> None:
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    log = common.StepLog(args.log)
    dataset = common.task()
    model, optimizer = common.build(args.seed)     # a restarted group starts from scratch ...
    # this group's own store (a group of several processes would share torchrun's)
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict():                              # ... and a peer's state replaces it (the heal)
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    seconds = datetime.timedelta(seconds=args.timeout)
    manager = Manager(pg=ProcessGroupGloo(timeout=seconds), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{args.replica}", rank=0, world_size=1,
                      store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=args.lighthouse,
                      timeout=seconds, quorum_timeout=seconds * 4, connect_timeout=seconds * 4)
    ddp = DistributedDataParallel(manager, model)
    ft_optimizer = Optimizer(manager, optimizer)
    if args.gate:
        wait_at_gate(args)
    log.write(event="start", replica=args.replica, attempt=args.attempt, pid=os.getpid())
    try:
        while True:
            step = manager.current_step()
            started = time.time()
            x, y = common.part_batch(dataset, step, args.batch_size, args.replicas, args.replica)
            ft_optimizer.zero_grad()               # also starts this step's quorum
            loss = workload.loss_fn(ddp, x, y)
            loss.backward()                        # gradients averaged over the quorum's groups
            ft_optimizer.step()                    # applied only if every group commits
            time.sleep(max(0.0, args.step_seconds - (time.time() - started)))  # a bigger model's compute
            done = manager.current_step()
            log.write(event="step", replica=args.replica, attempt=args.attempt, before=step,
                      step=done, committed=done > step, participants=manager.num_participants(),
                      loss=loss.item(), digest=common.digest(model, optimizer))
            if done == args.steps and done > step:     # the loss where the restart run ends
                log.write(event="at_steps", replica=args.replica, step=done,
                          eval_loss=common.eval_loss(model, dataset))
            if step == 0 and done > 1:
                print(f"replica {args.replica}: joined at step {done}, state received from a peer",
                      flush=True)
            if args.kill_at_step and args.attempt == 0 and done == args.kill_at_step:
                log.write(event="kill", replica=args.replica, step=done)
                print(f"replica {args.replica}: killed after step {done} (SIGKILL)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            # stop together: enough steps, and every group back in the quorum
            if done >= args.steps and manager.num_participants() == args.replicas or done >= 4 * args.steps:
                break
        log.write(event="end", replica=args.replica, step=manager.current_step(),
                  digest=common.digest(model, optimizer), eval_loss=common.eval_loss(model, dataset))
        print(f"replica {args.replica}: stopped at step {manager.current_step()}", flush=True)
    finally:
        manager.shutdown(wait=False)


def wait_at_gate(args) -> None:
    host, port = args.gate.rsplit(":", 1)
    gate = torch.distributed.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                      timeout=datetime.timedelta(seconds=120))
    gate.set(f"ready/{args.replica}", "1")
    gate.wait([f"ready/{r}" for r in range(args.replicas)])


def parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--lighthouse", required=True, help="the lighthouse's address (http://host:port)")
    p.add_argument("--replica", type=nonnegative_int, default=0)
    p.add_argument("--replicas", type=positive_int, default=2)
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch over all replicas")
    p.add_argument("--step-seconds", type=float, default=0.05,
                   help="least seconds a step takes (stands in for a bigger model's compute)")
    p.add_argument("--kill-at-step", type=nonnegative_int, default=0)
    p.add_argument("--attempt", type=nonnegative_int, default=0)
    p.add_argument("--timeout", type=positive_float, default=5.0, help="collective timeout, s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gate", default="", help="host:port of a store where the first attempts meet")
    p.add_argument("--log", default="", help="JSON-lines file of this replica's events")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.replica >= args.replicas:
        parser().error(f"--replica {args.replica} must be below --replicas {args.replicas}")
    if args.batch_size % args.replicas:
        parser().error(f"--batch-size {args.batch_size} must divide by --replicas {args.replicas}")
    if args.step_seconds < 0:
        parser().error("--step-seconds must be >= 0")
    torch.set_num_threads(1)
    train(args)
    return 0


if __name__ == "__main__":
    run_main(main)
