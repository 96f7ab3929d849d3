"""``sluice demo``: the whole system live on this machine; ``--check`` runs it as a test.

Modules: :mod:`~pipeline.demo.app` (the command; its options in
:mod:`~pipeline.demo.options`), :mod:`~pipeline.demo.supervisor`
(child processes), :mod:`~pipeline.demo.components` (what runs, on which
ports), :mod:`~pipeline.demo.activity` (the demo's traffic and observers),
:mod:`~pipeline.demo.view` (the live terminal view), :mod:`~pipeline.demo.check`
and :mod:`~pipeline.demo.verify` (the scripted scenario), :mod:`~pipeline.demo.procs`
(the marker walk), :mod:`~pipeline.demo.prereq` (what the machine must have).
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    import importlib.util

    from pipeline.errors import ConfigError

    if any(arg in ("-h", "--help") for arg in argv):  # answered without the [demo] extra
        from pipeline.demo.options import parse

        parse(argv)  # prints the usage and exits
    if importlib.util.find_spec("rich") is None:  # comes with Airflow; the view needs it
        raise ConfigError("rich is not installed: pip install 'sluice[demo]' (or make install)")
    from pipeline.demo.app import main as run

    return run(argv)
