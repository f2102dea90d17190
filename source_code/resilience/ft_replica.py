"""One replica group of per-step fault-tolerant training with torchft (here: one process per group).

    python -m source_code.resilience.ft_run          # starts the lighthouse and the replicas
    python -m source_code.resilience.ft_replica --lighthouse http://HOST:29510 --replica 0 --replicas 2

What changes against notebook 05's DDP loop, line by line (``step_once``):
* ``ft_optimizer.zero_grad()`` starts this step's quorum: the group's ``Manager`` asks torchft's
  lighthouse which groups are alive; a group that is behind (a restarted one) receives the
  model and optimizer state from a live peer (over HTTP) during this step: no checkpoint file;
* ``manager.allreduce(grad)``: the gradients averaged over the groups of this step's quorum only
  (a healing group sends zeros and is not counted); if a peer dies in the all-reduce, waiting
  on it records the error instead of raising it. (torchft 0.2's ``DistributedDataParallel``
  calls the same all-reduce from a DDP comm hook, but on that error path its hook fails an
  assert and the survivor's backward raises: ft_ddp_bug.py shows it; so the loop calls
  ``manager.allreduce`` itself, which is the Manager's documented API);
* ``ft_optimizer.step()`` applies the update only if ``manager.should_commit()`` says so: a
  vote among the ranks of *this* group (every rank's all-reduce went well, enough groups in
  the quorum). Each group decides for itself; a group whose all-reduce failed throws the
  step away and computes the same step again with the next quorum.

The group stops once it has ``--steps`` steps and the last ``--together`` steps had every group
in the quorum: after a kill, it goes on until the killed group is back (or fails after
``--deadline`` seconds). ``--kill-at-step N`` (the drill, first attempt only): the process
SIGKILLs itself inside its all-reduce of step N+1 (resilience/faults.py). ``--gate HOST:PORT``:
the first attempts of all groups meet in that store (served by the harness, or by the group
given ``--serve-gate``) before stepping, so that they start together. Every step is logged
(``--log``) for recovery.py to count.
"""
from __future__ import annotations

import datetime
import os
import socket
import time

import torch

from source_code import workload
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, faults


def step_once(manager, model, ft_optimizer, dataset, args):
    """One fault-tolerant step: what the notebook shows."""
    step = manager.current_step()
    x, y = common.part_batch(dataset, step, args.batch_size, args.replicas, args.replica)
    ft_optimizer.zero_grad()               # also starts this step's quorum (and a heal if behind)
    loss = workload.loss_fn(model, x, y)
    loss.backward()
    works = [manager.allreduce(p.grad) for p in model.parameters()]   # mean over the quorum's groups
    for work in works:
        work.wait()                        # a peer's death is recorded here, not raised
    ft_optimizer.step()                    # applied only if this group's should_commit says so
    return step, loss


def build(args):
    os.environ.setdefault("RUST_LOG", "error")     # torchft's Rust side logs every quorum at INFO
    from torchft import Manager, Optimizer, ProcessGroupGloo
    model, optimizer = common.build(args.seed)     # a restarted group starts from scratch ...
    # this group's own store (a group of several processes would share torchrun's)
    store = torch.distributed.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)

    def state_dict():                              # ... and a peer's state replaces it (the heal)
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    timeout = datetime.timedelta(seconds=args.timeout)            # collectives, should_commit, heal
    quorum = datetime.timedelta(seconds=args.quorum_timeout)      # the wait for a quorum
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{args.replica}", rank=0, world_size=1,
                      store_addr=args.host, store_port=store.port, lighthouse_addr=args.lighthouse,
                      hostname=args.host,
                      timeout=timeout, quorum_timeout=quorum, connect_timeout=quorum,
                      init_sync=False)   # every group builds the same weights from the seed
    return model, optimizer, manager, Optimizer(manager, optimizer), store


def time_waits(manager) -> tuple[dict, dict]:
    """Instrumentation, not lesson: wrap the manager's calls so that each adds its seconds to
    the first returned dict (the step loop logs and clears it every step): ``quorum``, the waits
    for the step's quorum (``wait_quorum``, which ``manager.allreduce`` also calls first: the
    lighthouse's answer, the process group reconfigured, and for a healing group the whole state
    received, ``recv_checkpoint`` running to its end in the quorum's thread; a sending group
    only hands its state to its checkpoint server there, whose own thread serves the read: on
    CPU the tensors themselves, torchft copies them only from a GPU); ``allreduce``, the waits on
    the gradients' all-reduce (``work.wait()``: the transfer, and a peer that has not reached its
    all-reduce yet: a healing peer reaches it only once it holds the state); ``commit``, the
    commit vote (``should_commit``; a healing group loads the received state there, a sending
    one then blocks reads from its checkpoint server, ``disallow_checkpoint``). The second dict
    holds moments, for the order of the heal: ``received_t`` (the state received), ``allreduce_done_t`` (the step's
    last all-reduce wait returned) and ``commit_begun_t`` (the vote called); and ``asked_t``,
    when the step asked for its quorum (``start_quorum`` called), for which group asked last."""
    spent, marks = {"quorum": 0.0, "allreduce": 0.0, "commit": 0.0}, {}

    def timed(name, call, mark=None):
        def wrapper(*args, **kwargs):
            begun = time.time()
            if mark == "begun":
                marks[f"{name}_begun_t"] = begun
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] += time.time() - begun
                if mark == "done":
                    marks[f"{name}_done_t"] = time.time()
        return wrapper
    allreduce, transport = manager.allreduce, manager._checkpoint_transport
    receive = transport.recv_checkpoint

    def allreduce_timed(*args, **kwargs):
        work = allreduce(*args, **kwargs)
        work.wait = timed("allreduce", work.wait, mark="done")
        return work

    def receive_marked(*args, **kwargs):
        state = receive(*args, **kwargs)
        marks["received_t"] = time.time()
        return state
    start_quorum = manager.start_quorum

    def start_quorum_marked(*args, **kwargs):
        marks["asked_t"] = time.time()
        return start_quorum(*args, **kwargs)
    manager.start_quorum = start_quorum_marked
    manager.wait_quorum = timed("quorum", manager.wait_quorum)
    manager.should_commit = timed("commit", manager.should_commit, mark="begun")
    manager.allreduce = allreduce_timed
    transport.recv_checkpoint = receive_marked
    return spent, marks


def train(args) -> None:
    log = common.StepLog(args.log)
    dataset = common.task()
    model, optimizer, manager, ft_optimizer, _store = build(args)
    spent, marks = time_waits(manager)
    per_group = args.batch_size // args.replicas
    if args.kill_at_step and args.attempt == 0:
        faults.die_in_torchft_allreduce(manager, args.kill_at_step, log, per_group, args.replica)
    _gate = wait_at_gate(args) if args.gate else None     # kept alive: this group may serve it
    log.write(event="start", replica=args.replica, attempt=args.attempt, pid=os.getpid())
    together, deadline = 0, time.time() + args.deadline
    try:
        while True:
            begun = time.time()
            spent.update(dict.fromkeys(spent, 0.0))
            marks.clear()
            step, loss = step_once(manager, model, ft_optimizer, dataset, args)
            done = manager.current_step()
            committed, everyone = done > step, manager.num_participants() == args.replicas
            together = together + 1 if committed and everyone else 0
            log.write(event="step", replica=args.replica, attempt=args.attempt, before=step, step=done,
                      committed=committed, participants=manager.num_participants(), samples=per_group,
                      used=committed and manager.is_participating(), begun=begun, loss=loss.item(),
                      **{f"{name}_s": seconds for name, seconds in spent.items()}, **marks)
            if args.replica == 0 and committed and done % args.eval_every == 0:
                log.write(event="eval", step=done, eval_loss=common.eval_loss(model, dataset))
            time.sleep(max(0.0, args.step_seconds - (time.time() - begun)))   # a bigger model's compute
            if step == 0 and done > 1:
                log.write(event="healed", replica=args.replica, step=done)
                print(f"replica {args.replica}: back at step {done}, state received from a live peer",
                      flush=True)
            if done >= args.steps and together >= args.together:
                break
            if time.time() > deadline:
                raise LaunchError(f"error: replica {args.replica}: the other groups were not all back in "
                                  f"the quorum within --deadline {args.deadline:.0f} s (step {done})")
        log.write(event="end", replica=args.replica, step=done, digest=common.digest(model, optimizer),
                  eval_loss=common.eval_loss(model, dataset))
        print(f"replica {args.replica}: stopped at step {done}", flush=True)
    finally:
        manager.shutdown(wait=False)


def wait_at_gate(args):
    host, port = args.gate.rsplit(":", 1)
    gate = torch.distributed.TCPStore(host, int(port), is_master=args.serve_gate, wait_for_workers=False,
                                      timeout=datetime.timedelta(seconds=args.deadline))
    gate.set(f"ready/{args.replica}", "1")
    gate.wait([f"ready/{r}" for r in range(args.replicas)])
    return gate


def parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--lighthouse", required=True, help="the lighthouse's address (http://host:port)")
    p.add_argument("--replica", type=nonnegative_int, default=0)
    p.add_argument("--replicas", type=positive_int, default=2)
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--together", type=positive_int, default=5,
                   help="steps with every group in the quorum before stopping (after --steps)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch over all replicas")
    p.add_argument("--step-seconds", type=float, default=0.05,
                   help="least seconds a step takes (stands in for a bigger model's compute)")
    p.add_argument("--kill-at-step", type=nonnegative_int, default=0)
    p.add_argument("--attempt", type=nonnegative_int, default=0)
    p.add_argument("--timeout", type=positive_float, default=5.0, help="collective and commit timeout, s")
    p.add_argument("--quorum-timeout", type=positive_float, default=30.0, help="wait for a quorum, s")
    p.add_argument("--deadline", type=positive_float, default=120.0,
                   help="seconds to wait for every group to be back before failing")
    p.add_argument("--eval-every", type=positive_int, default=1,
                   help="replica 0 logs the eval loss every N steps (inside the step's --step-seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gate", default="", help="host:port of a store where the first attempts meet")
    p.add_argument("--serve-gate", action="store_true", help="this process serves the --gate store")
    p.add_argument("--host", default=socket.gethostname(),
                   help="the name other groups reach this one by (its store, its heal server)")
    p.add_argument("--log", default="", help="JSON-lines file of this replica's events")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.replica >= args.replicas:
        p.error(f"--replica {args.replica} must be below --replicas {args.replicas}")
    if args.batch_size % args.replicas:
        p.error(f"--batch-size {args.batch_size} must divide by --replicas {args.replicas}")
    if args.step_seconds < 0:
        p.error("--step-seconds must be >= 0")
    if args.kill_at_step >= args.steps:
        p.error(f"--kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    torch.set_num_threads(1)
    train(args)
    return 0


if __name__ == "__main__":
    run_main(main)
