"""Predict what a training strategy costs before running it: memory per rank (memory.py).

    python -m source_code.planner.memory --params 124e6 --world-size 8
"""
