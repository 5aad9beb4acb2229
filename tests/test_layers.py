"""The layers of pyproject.toml's import contracts hold, and every module of the project is in one of them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layers() -> list[list[str]]:
    (contract,) = [c for c in CONFIG["contracts"] if c["id"] == "layers"]
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def test_no_module_imports_one_above_it_and_the_core_stays_pure() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout, done.stdout


def test_every_module_of_the_project_is_in_a_layer() -> None:
    layers = [name for layer in _layers() for name in layer]
    assert sorted(set(CONFIG["root_packages"])) == sorted({name.split(".")[0] for name in layers})
    unlayered = []
    for package in CONFIG["root_packages"]:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__" or "migrations" in parts:
                continue
            module = ".".join(parts)
            if not any(module == name or module.startswith(name + ".") for name in layers):
                unlayered.append(module)
    assert not unlayered, f"modules in no layer of pyproject.toml's import contract: {unlayered}"
