"""Project rules checked as tests: layers, migrations, no pickle, lint and types."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

PACKAGE = Path(__file__).resolve().parent.parent / "django_delayq"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_engine_never_imports_django():
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(m for m in imported_modules(path)
                                               if m == "django" or m.startswith("django."))
        for path in (PACKAGE / "engine").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_engine_imports_without_django_loaded():
    code = ("import sys; import django_delayq.engine; "
            "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_no_pickle_anywhere():
    for path in PACKAGE.rglob("*.py"):
        mods = imported_modules(path)
        assert not mods & {"pickle", "cPickle", "marshal", "shelve", "dill"}, path


@pytest.mark.django_db
def test_migrations_are_up_to_date():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["mypy"]], ids=["ruff", "mypy"])
def test_the_code_passes_the_linter_and_the_type_checker(tool):
    bin_dir = Path(sys.executable).parent
    done = subprocess.run([str(bin_dir / tool[0]), *tool[1:]], cwd=PACKAGE.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
