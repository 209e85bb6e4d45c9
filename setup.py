"""disco-xla: joint op-fusion and all-reduce bucketing for data-parallel XLA training."""

import glob
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The DISCO_XLA_FLAGS hook; see disco_xla/env_hook.py. Python runs site-packages'
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
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "protobuf==7.36.2",
        "numpy==2.4.6",
        "absl-py==2.5.1",
        "dm-haiku==0.0.17",
        "jraph==0.0.6.dev0",
        "optax==0.2.8",
        "tqdm==4.70.1",
        "PyYAML==6.0.4",
        "matplotlib==3.11.2",
    ],
    extras_require={"tf": ["tensorflow-cpu==2.21.0"]},
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
