"""Run a training module with torchvision told the md5 sums of the test's CIFAR-10 files.

    TEST_CIFAR_MD5='{...}' PYTHONPATH=tests torchrun ... -m cifar_checksums source_code.training.ddp ARGS

Everything else is the real entry point reading the real file format (tests/dataset_files.py).
"""
import json
import os
import runpy
import sys

from dataset_files import use_checksums

if __name__ == "__main__":
    use_checksums(json.loads(os.environ["TEST_CIFAR_MD5"]))
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
