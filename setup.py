"""disco-xla: joint op-fusion and all-reduce bucketing for data-parallel XLA training."""

import glob
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The DISCO_XLA_FLAGS hook; see disco_xla/frontends/env_hook.py. Python runs site-packages'
# .pth files in name order, and this one imports disco_xla, so it must come after
# the files that put the package on the path (easy-install.pth, __editable__*.pth).
HOOK = "zz_disco_xla_hook.pth"


class BuildWithHook(build_py):
    """Also puts the hook's .pth file at the root of the wheel, so that it lands in
    site-packages, where Python runs it at start-up. (Editable installs do not
    build a wheel: the Makefile copies the file into the venv instead.)"""

    def run(self):
        super().run()
        shutil.copy(HOOK, os.path.join(self.build_lib, HOOK))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, HOOK)]


setup(
    name="disco-xla",
    version="0.1.0",
    description="Joint op-fusion and all-reduce bucketing for data-parallel XLA programs (DisCo).",
    python_requires=">=3.11",
    # disco_xla and its subpackages: cli, hlo_passes, simulator, search, runtime, costmodel,
    # profiling, zoo.
    packages=find_packages(include=["disco_xla", "disco_xla.*"]),
    # Ranges, not pins: the package goes into a user's own environment, beside their JAX
    # (and its CUDA plugin) and TensorFlow, and must not replace them. Each range runs from
    # the version we test (requirements.txt, the exact lock of .venv and CI) to the next
    # release that may break us: the next minor for 0.x (and 0.0.x) packages, the next
    # major otherwise. jaxlib is not named: jax requires the jaxlib of its own release
    # (jax 0.10.2: >=0.10.1,<=0.10.2), so pip keeps the user's jaxlib, and the
    # jax-cuda12-plugin that must match it, when it already fits; so do scipy and
    # ml_dtypes, which we import too. docs/install.md lists the ranges.
    install_requires=[
        "jax>=0.10.2,<0.11",
        # jax needs none; tensorflow 2.21 takes >=6.31.1,<8, and we test 7.36.2.
        "protobuf>=6.31.1,<8",
        "numpy>=2.4,<3",
        "absl-py>=2.5,<3",
        "dm-haiku>=0.0.17,<0.1",
        # Only pre-releases exist; naming one lets pip take them without --pre.
        "jraph>=0.0.6.dev0,<0.1",
        "optax>=0.2.8,<0.3",
        "tqdm>=4.70,<5",
        "PyYAML>=6.0,<7",
        "matplotlib>=3.11,<4",
    ],
    # TensorFlow is optional: disco_xla.tf_function imports it when called. A TF user
    # already has one of two packages that both provide `import tensorflow`, and pip
    # cannot tell that either will do: `tensorflow` (on Linux, the build with GPU support)
    # or `tensorflow-cpu` (what CI tests). An extra that named the other one would install
    # a second TensorFlow over the first. So: no extra where TF is already installed
    # (bring your own), `[tf]` for the GPU build, `[tf-cpu]` for the CPU build. TF's
    # minor releases may change the XLA bridge we use (experimental_get_compiler_ir,
    # XlaCallModule), hence the one minor.
    extras_require={
        "tf": ["tensorflow>=2.21,<2.22"],
        "tf-cpu": ["tensorflow-cpu>=2.21,<2.22"],
    },
    # Cluster profiles, found by name at run time (see disco_xla/simulator/profiles.py).
    data_files=[
        ("share/disco-xla/configs/clusters", glob.glob("configs/clusters/*.yaml")),
        # XLA's measured GPU tables, as the simulator reads them (simulator/gpu_tables.py).
        ("share/disco-xla/configs/gpu_tables", glob.glob("configs/gpu_tables/*.json")),
        # Shipped GNN cost-model weights (see disco_xla/costmodel/weights.py).
        ("share/disco-xla/configs/costmodels/cpu", glob.glob("configs/costmodels/cpu/*")),
        ("share/disco-xla/configs/costmodels/h200", glob.glob("configs/costmodels/h200/*")),
    ],
    cmdclass={"build_py": BuildWithHook},
    entry_points={"console_scripts": ["disco-xla=disco_xla.cli:main"]},
)
