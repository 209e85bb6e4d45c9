"""disco-xla: joint op-fusion and all-reduce bucketing for data-parallel XLA training."""

import glob

from setuptools import find_packages, setup

setup(
    name="disco-xla",
    version="0.1.0",
    description="Joint op-fusion and all-reduce bucketing for data-parallel XLA programs (DisCo).",
    python_requires=">=3.11",
    # disco_xla and its subpackages: hlo_passes, simulator, search, runtime, zoo.
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
    data_files=[("share/disco-xla/configs/clusters", glob.glob("configs/clusters/*.yaml"))],
    entry_points={"console_scripts": ["disco-xla=disco_xla.cli:main"]},
)
