"""Reference solutions of the notebooks' exercises, one module per notebook (nbNN_topic.py); tests pass them to the same check functions the notebooks use."""
