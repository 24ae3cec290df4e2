"""Hunt with the fleet simulation (``tests/unit/test_fleet_simulation.py``): how many examples until it fails.

Runs the simulation once per seed with a larger budget than CI's, without shrinking, and prints for each seed the
number of examples it ran and the first failure's message (or "no failure"). Point ``PYTHONPATH`` at another tree's
``src`` and root to hunt in that tree, e.g. an older commit checked out in a worktree:

    PYTHONPATH=/tmp/old/src:/tmp/old .venv/bin/python -m bench.fleet_sim_hunt --seeds 1,2,3 --examples 300

(the worktree needs this file and the simulation copied in when it predates them).
"""

from __future__ import annotations

import logging
import re
import unittest

import structlog
import typer
from hypothesis import HealthCheck, Phase, seed, settings

app = typer.Typer(add_completion=False)


def hunt(one_seed: int, examples: int, steps: int) -> tuple[str | None, int]:
    """(the first failure's message or None, how many examples ran) for one seed."""
    from tests.unit import test_fleet_simulation as sim

    count = [0]
    plain_init = sim.FleetSimulation.__init__

    def counting_init(machine: sim.FleetSimulation) -> None:
        count[0] += 1
        plain_init(machine)

    sim.FleetSimulation.__init__ = counting_init  # type: ignore[method-assign,assignment]
    case = sim.FleetSimulation.TestCase
    case.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=False,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    seed(one_seed)(case.runTest)
    result = unittest.TestResult()
    case("runTest").run(result)
    sim.FleetSimulation.__init__ = plain_init  # type: ignore[method-assign]
    failures = result.failures + result.errors
    if not failures:
        return None, count[0]
    found = re.findall(r"(\w+Error: .*)", failures[0][1])
    return (found[-1] if found else failures[0][1][-300:]), count[0]


@app.command()
def main(
    seeds: str = typer.Option("1,2,3,4", help="Comma-separated seeds, one run each."),
    examples: int = typer.Option(300, help="Examples per seed at most."),
    steps: int = typer.Option(30, help="Steps per example at most."),
) -> None:
    """Run the fleet simulation per seed and print examples-to-failure."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    for one in (int(s) for s in seeds.split(",")):
        message, ran = hunt(one, examples, steps)
        print(f"seed {one}: {message or 'no failure'} (examples run: {ran})", flush=True)


if __name__ == "__main__":
    app()
