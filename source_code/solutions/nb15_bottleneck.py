"""Reference solution of notebook 15's exercise: the slow run's bottleneck and its fix
(tests/test_profiling_exercise.py runs the check with it and with typical wrong answers).

The profile: ``enumerate(DataLoader)`` holds most of each step (its total time), and the
convolutions that top the table are called hundreds of times per step: the "decoding" of every
sample inside the DataLoader, not SmallCNN's 2 layers. ``aten::item`` costs next to nothing on
a CPU. Loader processes take the decoding off the training process.
"""

bottleneck = "data loading"
fix = {"workers": 2}
