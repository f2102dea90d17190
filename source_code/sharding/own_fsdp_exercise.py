"""Check functions for notebook 09's FSDP-by-hand exercises (solutions: source_code/solutions/nb09_own_fsdp.py).

    from source_code.sharding.own_fsdp_exercise import check_reduce_grad, check_zero3_core
    check_zero3_core(unshard, after_forward)      # the ZeRO-3 core: own_fsdp_core_exercise.py
    check_reduce_grad(reduce_grad)
    check_both(reduce_grad, unshard, after_forward)   # both, in one group of processes

The learner writes ``reduce_grad(flat_grad)`` for a unit trained in bf16 mixed precision:
``flat_grad`` (n,) is this rank's **bf16** gradient of a unit's flattened parameters; it
returns this rank's (c,) chunk of the mean over the N ranks in **fp32**, the ranks' gradients
added in fp32 (FSDP2's ``reduce_dtype=float32``), c = ceil(n / N), the chunk laid out as comm.py
lays out every shard (rank r: elements [r*c, (r+1)*c) of the flat vector padded with zeros to
N*c), zeros where it passes the end, each rank receiving no more than a reduce-scatter delivers it
((N-1) x c elements with a bandwidth-optimal algorithm). comm.py's helper (ZeRO-2's, fp32 in and
out) added in bf16 here and is told so.

A function defined in a notebook cell cannot be pickled, so its source is sent to N real
processes (gloo) and run there with ``torch`` and ``dist`` in scope, on unit sizes that do and
do not divide N, counting what each collective delivers to the rank (``Received``). One line says what is wrong, found by trying the
usual wrong answers.
"""
from __future__ import annotations

import inspect
import textwrap

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from source_code.sharding import comm  # noqa: F401  (its import quiets torch's *_tensor deprecation warning)
from source_code.sharding.own_fsdp_core_exercise import core_on_rank, free_storage, gather  # noqa: F401

SIZES = (12, 1, 7, 10, 301)     # one that divides 3, then ones that do not (padding needed)


class ExerciseFailed(AssertionError):
    """A wrong answer, said in one line."""


# the communication functions whose names a verdict can give (what is allowed is judged by the
# elements received: an all-to-all of the chunks, summed on the rank, receives what a
# reduce-scatter does)
COLLECTIVES = {"reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_single", "all_to_all_single",
               "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce",
               "gather", "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv"}

# c10d op -> (the argument holding the full data, what a rank receives of it: k x (N-1)/N of its
# elements with a bandwidth-optimal algorithm (k = 2 for an all-reduce), or "all" of them)
_RECEIVES = {"allreduce_": (0, 2), "allreduce_coalesced_": (0, 2), "allgather_": (0, 1),
             "_allgather_base_": (0, 1), "allgather_coalesced_": (0, 1),
             "allgather_into_tensor_coalesced_": (0, 1), "reduce_scatter_": (1, 1),
             "_reduce_scatter_base_": (1, 1), "reduce_scatter_tensor_coalesced_": (1, 1),
             "alltoall_": (0, 1), "alltoall_base_": (0, 1), "gather_": (0, 1), "gather_into_tensor_": (0, 1),
             "broadcast_": (0, "all"), "scatter_": (0, "all"), "reduce_": (0, "all"), "recv_": (0, "all"),
             "recv_any_source_": (0, "all")}


def _numel(x) -> int:
    if torch.is_tensor(x):
        return x.numel()
    return sum(_numel(y) for y in x) if isinstance(x, (list, tuple)) else 0


class Received(TorchDispatchMode):
    """``with Received(N) as r: ...``: r.elements, the elements this rank receives from the
    others over every collective it calls (any dtype), r.ops the c10d ops' names."""

    def __init__(self, world_size: int):
        super().__init__()
        self.n, self.elements, self.ops = world_size, 0.0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1].split(".")[0]
        if func.namespace == "c10d" and name in _RECEIVES:
            arg, share = _RECEIVES[name]
            numel = _numel(args[arg])
            self.ops.add(name.strip("_"))
            self.elements += numel if share == "all" else share * (self.n - 1) / self.n * numel
        return func(*args, **(kwargs or {}))


def rank_gradient(n: int, rank: int) -> torch.Tensor:
    """The (n,) bf16 gradient rank ``rank`` holds in the check (the same on every process)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + n)).to(torch.bfloat16)


def expected(n: int, world: int, rank: int, divided_in_bf16: bool = False) -> torch.Tensor:
    """This rank's (c,) fp32 chunk of the mean of every rank's gradient, added in fp32, zero-padded
    (``divided_in_bf16``: each gradient divided by N in bf16 before the cast, a typical mistake)."""
    c = -(-n // world)
    if divided_in_bf16:
        mean = sum((rank_gradient(n, k) / world).float() for k in range(world))   # (n,)
    else:
        mean = sum(rank_gradient(n, k).float() for k in range(world)) / world     # (n,)
    padded = torch.cat([mean, mean.new_zeros(c * world - n)])            # (N * c,)
    return padded[rank * c:(rank + 1) * c]


def diagnose(got, n: int, world: int, rank: int, calls, received: float) -> str | None:
    """None when ``got`` is right and this rank received no more elements than a reduce-scatter
    delivers it, (N-1) x c, else what is wrong, one line. ``calls``: the collectives the function
    called; ``received``: the elements it received from the others (``Received``)."""
    c = -(-n // world)
    want = expected(n, world, rank)
    if not torch.is_tensor(got):
        return f"return a tensor of {c} elements, not {type(got).__name__}"
    dtype, got = got.dtype, got.detach().reshape(-1).float()
    if got.numel() == n and n != c:
        return ("you returned all n elements: after the reduction each rank keeps only its own "
                "chunk of the gradient, the part its optimizer shard steps")
    if got.numel() == n // world and n % world:
        return (f"n = {n} does not divide among {world} ranks and your chunk has {got.numel()} "
                f"elements: the last elements of the unit fell off; every shard has ceil(n / N)")
    if got.numel() != c:
        return f"n = {n} on {world} ranks: return {c} elements (every rank's chunk), not {got.numel()}"
    near = lambda a, b: torch.allclose(a, b, rtol=2e-2, atol=2e-2)       # noqa: E731  bf16's rounding
    if near(got, want):
        if dtype != torch.float32:
            return (f"your chunk is {dtype}: the shard's gradient is fp32, like the shard the "
                    "optimizer steps (the master weights)")
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            if torch.allclose(got, expected(n, world, rank, divided_in_bf16=True), rtol=1e-5, atol=1e-6):
                return ("the right chunk, rounded: each gradient was divided by N in bf16 (8 significant "
                        "bits) before it became fp32; cast first, then add and divide")
            return ("the right chunk, rounded: the ranks' bf16 gradients were added in bf16 (8 "
                    "significant bits per sum); they must be added in fp32")
        share = (world - 1) * c                          # what a reduce-scatter delivers a rank
        if received <= share + 1e-6:
            return None
        sent = ", ".join(sorted(calls)) or "nothing the check could see"
        return (f"right numbers, but sent with {sent}: this rank received {received:.0f} elements where "
                f"a collective that delivers each rank only its own chunk of the sum needs {share}")
    if near(got, want * world):
        return "these are the sums over the ranks: the gradient of the global batch is their mean"
    others = [r for r in range(world) if r != rank and near(got, expected(n, world, r))]
    if others:
        return (f"rank {rank} returned rank {others[0]}'s chunk: rank r owns elements "
                "[r*c, (r+1)*c) of the padded vector")
    real = max(0, min(c, n - rank * c))
    if near(got[:real], want[:real]):
        return "the padding past the end of the unit must be zeros (it is stepped like the rest)"
    return (f"n = {n} on {world} ranks: your chunk differs from the mean gradient's chunk by "
            f"{(got - want).abs().max().item():.3g}")


def _no_average_on_gloo(name, args, kwargs) -> None:
    """ReduceOp.AVG is how FSDP2 reduces on NCCL; gloo has it only from torch 2.8 (the exercise
    runs on 2.6 too): say so in one line."""
    if any(getattr(a, "name", None) == "AVG" for a in (*args, *kwargs.values())) \
            and dist.get_backend() == "gloo":
        raise ValueError(f"{name}: ReduceOp.AVG on gloo needs torch 2.8 or newer (NCCL has it, and "
                         f"FSDP2 uses it there) and this exercise runs on torch 2.6 too: reduce "
                         f"with the sum, the mean is yours to take")


class _CheckedDist:
    """torch.distributed for the learner's code, with the sizes of the tensor collectives checked
    first: gloo given mismatched sizes can abort the process instead of raising; ``called``:
    the names of the communication functions called through it."""

    def __init__(self):
        self.called = set()

    def __getattr__(self, name):
        found = getattr(dist, name)
        if name not in COLLECTIVES or not callable(found):
            return found

        def call(*args, **kwargs):
            self.called.add(name)
            _no_average_on_gloo(name, args, kwargs)
            return found(*args, **kwargs)
        return call

    def reduce_scatter_tensor(self, output, input, *args, **kwargs):
        self.called.add("reduce_scatter_tensor")
        _no_average_on_gloo("reduce_scatter_tensor", args, kwargs)
        n = dist.get_world_size()
        if input.numel() != n * output.numel():
            raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements, "
                             f"output {output.numel()}: the input needs N x output")
        return dist.reduce_scatter_tensor(output, input, *args, **kwargs)

    def all_gather_into_tensor(self, output, input, *args, **kwargs):
        self.called.add("all_gather_into_tensor")
        n = dist.get_world_size()
        if output.numel() != n * input.numel():
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, "
                             f"input {input.numel()}: the output needs N x input")
        return dist.all_gather_into_tensor(output, input, *args, **kwargs)


def _run_on_rank(sources: list[tuple[str, str]], core_pairs=()) -> tuple[list, list]:
    """On every rank: each reduce_grad on every size, then each pair of ZeRO-3 core hooks
    (own_fsdp_core_exercise.py); the first problem of each, or None."""
    return _reduce_on_rank(sources), core_on_rank(list(core_pairs))


def _reduce_on_rank(sources: list[tuple[str, str]]) -> list[str | None]:
    rank, world = dist.get_rank(), dist.get_world_size()
    verdicts = []
    for source, name in sources:
        checked = _CheckedDist()
        namespace = {"torch": torch, "dist": checked}
        exec(compile(source, f"<{name}>", "exec"), namespace)
        fn, problem = namespace[name], None
        for n in SIZES:
            counter = Received(world)                     # sees torch.distributed called directly
            checked.called.clear()
            try:
                with counter:
                    got = fn(rank_gradient(n, rank).clone())
                problem = diagnose(got, n, world, rank, checked.called or counter.ops, counter.elements)
            except Exception as err:                      # the learner's bug, in one line
                text = str(err).strip().splitlines()[0] if str(err).strip() else ""
                problem = (f"n = {n} on {world} ranks: reduce-scatter needs an input of N x c "
                           f"elements, {n} is not a multiple of {world}" if n % world else
                           f"n = {n}: your reduce_grad raised {type(err).__name__}: {text}")
            found = [None] * world                        # every rank goes on, or stops, together
            dist.all_gather_object(found, problem)
            problem = next((p for p in found if p), None)
            if problem:
                break
        verdicts.append(problem)
    return verdicts


def source_of(fn) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise ExerciseFailed(f"cannot read the source of {getattr(fn, '__name__', fn)}: define it with "
                             "`def` in a cell (it runs in other processes with torch and dist only)") from None


def all_verdicts(fns=(), core_pairs=(), world_size: int = 3) -> tuple[list, list]:
    """Rank 0's verdicts (None: correct) on each reduce_grad and each (unshard, after_forward),
    all in one group of processes."""
    from source_code.processes import ProcessesFailed, spawn
    sources = [(source_of(fn), fn.__name__) for fn in fns]
    pairs = [((source_of(a), a.__name__), (source_of(b), b.__name__)) for a, b in core_pairs]
    try:
        return spawn(_run_on_rank, world_size, sources, pairs, collective_timeout_s=30, stream=False)[0]
    except ProcessesFailed as err:
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        said = f"a rank failed or waited for the others: {lines[-1][:160]}"
        return [said] * len(fns), [said] * len(core_pairs)


def verdicts(fns, world_size: int = 3) -> list[str | None]:
    """Rank 0's verdict on each reduce_grad (None: correct), all in one group of processes."""
    return all_verdicts(fns, (), world_size)[0]


def core_verdicts(pairs, world_size: int = 3) -> list[str | None]:
    """Rank 0's verdict on each (unshard, after_forward) pair (None: correct)."""
    return all_verdicts((), pairs, world_size)[1]


def _todo(*fns) -> bool:
    for fn in fns:
        try:
            if "raise NotImplementedError" in inspect.getsource(fn):
                return True
        except (OSError, TypeError):
            pass
    return False


def say(problem, done: bool, correct: str, quiet: bool, strict: bool) -> bool:
    """Print the verdict in one line (nothing with ``quiet``); True when right."""
    if problem is None:
        if not quiet:
            print(correct)
        return True
    if not quiet:
        print(f"not yet: {problem}" if done else problem)
    if strict:
        raise ExerciseFailed(problem)
    return False


REDUCE_OK = ("correct: the mean gradient's chunk on {n} ranks, added in fp32, for unit sizes that "
             "do and do not divide among them, each rank receiving only its chunk")
CORE_OK = ("correct: on {n} ranks every unit's full parameters existed while its forward and its "
           "backward computed and at no other time, and the weights equal one process")
TODO = "not done yet: replace the TODO (raise NotImplementedError) with your code"


def check_zero3_core(unshard, after_forward, world_size: int = 3, strict: bool = False,
                     quiet: bool = False) -> bool:
    """Your two forward hooks inside own_fsdp.Unit on ``world_size`` processes, a model of the
    check's own, two steps. Prints one line (nothing with ``quiet``); True when right."""
    if _todo(unshard, after_forward):
        return say(TODO, False, "", quiet, strict)
    try:
        problem = core_verdicts([(unshard, after_forward)], world_size)[0]
    except ExerciseFailed as failed:
        problem = str(failed)
    return say(problem, True, CORE_OK.format(n=world_size), quiet, strict)


def check_both(reduce_grad, unshard, after_forward, world_size: int = 3, strict: bool = False,
               quiet: bool = False) -> bool:
    """Both exercises in one group of processes (what the notebook's reference cell runs)."""
    reduce_v, core_v = all_verdicts([reduce_grad], [(unshard, after_forward)], world_size)
    ok = [say(reduce_v[0], True, REDUCE_OK.format(n=world_size), quiet, strict),
          say(core_v[0], True, CORE_OK.format(n=world_size), quiet, strict)]
    return all(ok)


_REDUCE_PASSED = []      # set by check_reduce_grad alone, when a learner's reduce_grad passed it


def reduce_grad_passed() -> bool:
    """True once check_reduce_grad has passed a function in this process (not check_both's
    reference run): the notebook shows the lesson's gradient hooks only then."""
    return bool(_REDUCE_PASSED)


def check_reduce_grad(fn, world_size: int = 3, strict: bool = False, quiet: bool = False) -> bool:
    """Your ``reduce_grad(flat_grad)`` on ``world_size`` processes, on sizes that do and do not
    divide it. Prints one line (nothing with ``quiet``); True when right."""
    if _todo(fn):
        return say(TODO, False, "", quiet, strict)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    if any(name in source for name in ("reduce_scatter_mean", "source_code")):
        return say("write it with torch.distributed's collectives, not the course's helpers", True, "", quiet, strict)
    try:
        problem = verdicts([fn], world_size)[0]
    except ExerciseFailed as failed:
        problem = str(failed)
    passed = say(problem, True, REDUCE_OK.format(n=world_size), quiet, strict)
    if passed:
        _REDUCE_PASSED.append(fn)
    return passed
