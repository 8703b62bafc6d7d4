"""django-delayq's worker command lines: each one ``runworker`` accepts, meaning what its
row says (the rows run them only in ``make bench`` and its smoke run)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import load_command_class

from bench.adapters import delayq_bench


def _options(variant: str | None, procs: int = 2) -> tuple[dict[str, Any], int]:
    argv, count = delayq_bench.worker_argv(variant, procs)
    assert argv[1:4] == ["-m", "django", "runworker"]
    parser = load_command_class("django_delayq", "runworker").create_parser(
        "django-admin", "runworker")
    return vars(parser.parse_args(argv[4:])), count


def test_the_tuned_worker_is_as_the_peers_run() -> None:
    options, count = _options(None)
    assert count == 2
    assert (options["queues"], options["concurrency"], options["no_mirror"],
            options["verbosity"]) == (["bench"], delayq_bench.THREADS, True, 0)
    assert options["processes"] is None
    assert options["timeout"] is None


def test_the_pool_is_one_supervisor_of_n_tuned_children() -> None:
    options, count = _options("pool", 2)
    assert count == 1
    assert options["processes"] == 2
    assert (options["concurrency"], options["no_mirror"], options["verbosity"]) == (
        delayq_bench.THREADS, True, 0)


def test_the_time_limit_is_the_only_difference() -> None:
    tuned, _ = _options(None)
    limited, _ = _options("timeout")
    assert {k for k in tuned if tuned[k] != limited[k]} == {"timeout"}
    assert limited["timeout"] == delayq_bench.TIMEOUT_S


@pytest.mark.parametrize("variant", ["defaults", "defaults_no_mirror"])
def test_the_defaults_set_nothing(variant: str) -> None:
    options, count = _options(variant)
    assert count == 1
    defaults = load_command_class("django_delayq", "runworker").create_parser(
        "django-admin", "runworker").parse_args([])
    changed = {k for k, v in options.items() if v != getattr(defaults, k)}
    assert changed == ({"settings", "no_mirror"} if variant == "defaults_no_mirror"
                       else {"settings"})


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="no worker variant"):
        delayq_bench.worker_argv("turbo", 1)
