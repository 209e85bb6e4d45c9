"""Entry point of the Bazel py_test targets: runs one test file under pytest."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", *sys.argv[1:]]))
