"""``python -m source_code.gpu_smoke``: the single- and multi-GPU checks, in that order."""
from source_code.errors import run_main
from source_code.gpu_smoke import context_and_experts, memory_precision, multi, single
from source_code.gpu_smoke.harness import main

CHECKS = single.CHECKS + memory_precision.CHECKS + multi.CHECKS + context_and_experts.CHECKS

if __name__ == "__main__":
    run_main(lambda: main(CHECKS))
