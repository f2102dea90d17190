"""Which meshes fit, ranked by communication: the planner's search over (pp, dp, tp, ZeRO).

``evaluate(model, cfg, cluster)`` gives one configuration's bytes per GPU (mesh_memory),
bytes on the wire (communication) and the estimated communication time, or the one reason
it cannot run. ``search`` tries every tp (powers of two), pp and ZeRO stage whose product is
the number of GPUs, activation checkpointing only where the plan does not fit without it,
and returns the plans that fit, shortest estimated step first (compute stretched by the
pipeline bubble and by recomputation, plus communication at the cluster's bandwidths), and the
others with their reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from source_code.planner import communication, mesh_memory
from source_code.planner.spec import GB, PRECISIONS, Cluster, Config, Model

NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
         "activations": "activations", "buffers": "gathered blocks"}
# the variant of each ZeRO stage that the memory (mesh_memory) and the traffic (communication)
# both assume, for m micro-batches per step
ZERO_VARIANTS = {
    0: "DDP: full gradients accumulated over the micro-batches, one all-reduce per step",
    1: "ZeRO-1: full gradients accumulated over the micro-batches, one reduce-scatter per step",
    2: "ZeRO-2: 1/dp of the gradients kept, a reduce-scatter after every micro-batch "
       "(DeepSpeed's ZeRO-2)",
    3: "ZeRO-3 (FSDP2): 1/dp of everything, an all-gather before every forward and backward "
       "and a reduce-scatter after every micro-batch",
}
PIPELINE_ZERO_NOTE = ("DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1: with {m} "
                      "micro-batches per step it would reduce-scatter the gradients {m} times"
                      "{gathers} instead of once")


@dataclass
class Plan:
    cfg: Config
    memory: dict = field(default_factory=dict)
    comm: list = field(default_factory=list)
    comm_s: float = 0.0
    compute_s: float = 0.0      # the model's FLOPs of a step / (GPUs x tflops)
    reason: str = ""            # empty: it fits

    @property
    def step_s(self) -> float:
        """Estimated step: compute (+1/3 recomputed with checkpointing), stretched by the
        pipeline bubble, plus communication (none of it overlapped: an upper bound)."""
        work = self.compute_s * (4 / 3 if self.cfg.checkpointing else 1)
        return work / (1 - self.bubble) + self.comm_s

    @property
    def fits(self) -> bool:
        return not self.reason

    @property
    def bubble(self) -> float:
        """Idle fraction of a pipeline step, (p - 1) / (m + p - 1)."""
        p, m = self.cfg.pp, self.cfg.micro_batches
        return (p - 1) / (m + p - 1)

    def totals(self) -> dict:
        return communication.totals(self.comm)

    @property
    def notes(self) -> list[str]:
        """What a framework would say about this plan (empty: nothing)."""
        cfg = self.cfg
        if cfg.pp > 1 and cfg.dp > 1 and cfg.zero >= 2:
            gathers = (f" (and all-gather the parameters {2 * cfg.micro_batches} times)"
                       if cfg.zero == 3 else "")
            return [PIPELINE_ZERO_NOTE.format(m=cfg.micro_batches, gathers=gathers)]
        return []


def structural_reason(model: Model, cfg: Config, cluster: Cluster) -> str:
    """Why the mesh itself cannot be built, or ""."""
    if model.heads % cfg.tp:
        return f"{model.heads} heads do not divide among tp={cfg.tp}"
    if cfg.tp > cluster.gpus_per_node:
        return (f"tp={cfg.tp} spans nodes ({cluster.gpus_per_node} GPUs each): TP all-reduces "
                "activations in every block, it needs the links inside a node")
    if cfg.pp > model.layers:
        return f"pp={cfg.pp} > {model.layers} layers"
    batch = cfg.global_batch or cfg.dp * cfg.micro_batch
    if batch % (cfg.dp * cfg.micro_batch):
        return f"global batch {batch} is not a multiple of dp x micro-batch = {cfg.dp * cfg.micro_batch}"
    if cfg.pp > 1 and cfg.micro_batches < cfg.pp:
        return (f"{cfg.micro_batches} micro-batch(es) for {cfg.pp} stages: the pipeline would "
                "stand idle most of the step")
    return ""


def evaluate(model: Model, cfg: Config, cluster: Cluster, precision: str = "bf16") -> Plan:
    plan = Plan(cfg)
    plan.reason = structural_reason(model, cfg, cluster)
    if plan.reason:
        return plan
    plan.memory = mesh_memory.per_gpu(model, cfg, precision)
    plan.comm = communication.per_step(model, cfg, cluster.gpus_per_node, precision)
    plan.comm_s = communication.seconds(plan.comm, cluster)
    tokens = (cfg.global_batch or cfg.dp * cfg.micro_batch) * model.seq
    plan.compute_s = model.flops_per_token() * tokens / (cluster.gpus * cluster.tflops * 1e12)
    limit = cluster.usable * cluster.gpu_mem_gb * GB
    if plan.memory["total"] > limit:
        big = max(NAMES, key=lambda k: plan.memory[k])
        plan.reason = (f"needs {plan.memory['total'] / GB:.1f} GB per GPU > {limit / GB:.1f} GB usable "
                       f"({NAMES[big]} {plan.memory[big] / GB:.1f} GB)")
    return plan


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def candidates(model: Model, cluster: Cluster, micro_batch: int = 1, global_batch: int = 0):
    """Every (tp, pp, dp, zero) with tp * pp * dp = the GPUs; ZeRO > 0 only when dp > 1."""
    for tp in _powers(cluster.gpus):
        for pp in [p for p in range(1, cluster.gpus // tp + 1) if (cluster.gpus // tp) % p == 0]:
            dp = cluster.gpus // (tp * pp)
            if tp * pp * dp != cluster.gpus:
                continue
            for zero in (range(4) if dp > 1 else [0]):
                yield Config(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch,
                             global_batch=global_batch)


def search(model: Model, cluster: Cluster, micro_batch: int = 1, global_batch: int = 0,
           precision: str = "bf16") -> tuple[list[Plan], list[Plan]]:
    """(plans that fit, fastest communication first; plans that do not, each with its reason)."""
    fit, fail = [], []
    for cfg in candidates(model, cluster, micro_batch, global_batch):
        plan = evaluate(model, cfg, cluster, precision)
        if not plan.fits and plan.memory:       # too big: try again with checkpointing
            again = evaluate(model, replace(cfg, checkpointing=True), cluster, precision)
            plan = again if again.fits else replace(plan, reason=plan.reason + "; with checkpointing "
                                                    + again.reason.split(" > ")[0].replace("needs ", ""))
        (fit if plan.fits else fail).append(plan)
    fit.sort(key=lambda p: (round(p.step_s, 3), p.comm_s, p.memory["total"]))
    return fit, fail


def describe_memory(plan: Plan) -> str:
    m = plan.memory
    return (f"{m['total'] / GB:.1f} GB/GPU = params {m['params'] / GB:.1f} + grads {m['grads'] / GB:.1f}"
            f" + optimizer {m['optimizer'] / GB:.1f} + activations {m['activations'] / GB:.1f}"
            + (f" + gathered {m['buffers'] / GB:.1f}" if m["buffers"] else ""))


def activations_both_ways(model: Model, cfg: Config, precision: str = "bf16") -> str:
    """The busiest stage's activations without and with checkpointing, in GB."""
    off, on = (mesh_memory.activation_bytes(model, replace(cfg, checkpointing=c), 0,
                                            PRECISIONS[precision]) for c in (False, True))
    return f"activations {off / GB:.1f} GB without checkpointing, {on / GB:.1f} GB with"


def describe_comm(plan: Plan) -> str:
    t = plan.totals()
    kinds = ", ".join(f"{k} {t[k] / GB:.2f}" for k in communication.KINDS if t[k])
    return (f"{t['total'] / GB:.2f} GB/step sent per GPU ({kinds or 'none'}); intra-node "
            f"{t['intra'] / GB:.2f}, inter-node {t['inter'] / GB:.2f}; ~{plan.comm_s:.2f} s; "
            f"step ~{plan.step_s:.1f} s (compute {plan.compute_s:.1f} s)")
