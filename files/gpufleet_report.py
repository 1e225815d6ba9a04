#!/usr/bin/env python
"""Write the fleet report of a saved collector document: the report's code without a playbook run.

Usage::

    .venv/bin/python files/gpufleet_report.py --out-dir DIR [--basename fleet-report] [--history-keep N]
        [--repeat-failures K] [--repeat-runs N] [--outlier-fraction F] < document.json

The document on stdin is the collector's (plugins/module_utils/fleet_report.py describes it; the action
gpufleet.fleet.fleet_report makes one from a verify.yml run). It writes the JSON, Markdown and JUnit files and
the history into DIR with the code the play's action writes with (imported as files/gpufleet_verify.py imports
it), prints the terminal table and exits 0 once the files are written, whatever the nodes' verdicts; 2 when
stdin is not such a document or a setting is wrong (nothing is written); 1 when the files cannot be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpufleet_verify import add_report_options, fleet_report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: the report directory, the files' name and the history's and outlier rule's settings."""
    parser = argparse.ArgumentParser(
        description="Write the fleet report (JSON, Markdown, JUnit XML) from the "
        "verification document on stdin; print the Markdown table."
    )
    parser.add_argument(
        "--out-dir", metavar="DIR", required=True, type=Path, help="directory for the three report files"
    )
    parser.add_argument(
        "--basename",
        metavar="NAME",
        default=fleet_report.DEFAULT_BASENAME,
        type=fleet_report.file_basename,
        help=f"file name without extension (default: {fleet_report.DEFAULT_BASENAME})",
    )
    add_report_options(parser, defaults=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Read the document, write the report files and the history, print the table; return the exit status."""
    args = parse_args(argv)
    try:
        document = json.loads(sys.stdin.buffer.read())
        fleet_report.check_history_settings(args.history_keep, args.repeat_failures, args.repeat_runs)
        fleet_report.check_fraction(args.outlier_fraction)
        if not isinstance(document, dict) or not isinstance(document.get("hosts"), dict):
            fleet_report.build_report(document)  # raises InputError, naming what is expected
    except ValueError as error:  # not JSON, not UTF-8, not the collector's document, or a wrong setting
        print(f"gpufleet_report.py: unreadable input, nothing written: {error}", file=sys.stderr)
        return 2
    try:
        report, _paths = fleet_report.write_run_report(
            document,
            args.out_dir,
            args.basename,
            args.history_keep,
            args.repeat_failures,
            args.repeat_runs,
            args.outlier_fraction,
        )
    except OSError as error:
        print(f"gpufleet_report.py: cannot write the report in {args.out_dir}: {error}", file=sys.stderr)
        return 1
    print(fleet_report.render_terminal(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
