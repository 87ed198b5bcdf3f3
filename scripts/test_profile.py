"""Sum a profiled test run: the slowest tests, files and fixtures.

    STASIS_TEST_PROFILE=/tmp/profile make test        # or any pytest run of tests/
    .venv/bin/python scripts/test_profile.py /tmp/profile [--tests 25] [--files 10] [--json out.json]
                                              [--durations tests/durations.json]

A test's time is its set-up, call and teardown; a file's is the sum of its tests'; a fixture's is the time
its own set-up took (a session fixture is paid once per worker, inside the first test that asks for it)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(directory: Path) -> list[dict]:
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def summarise(records: list[dict]) -> dict:
    tests: dict[str, float] = defaultdict(float)
    failed: set[str] = set()
    fixtures: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record["kind"] == "phase":
            tests[record["test"]] += record["seconds"]
            if record["outcome"] == "failed":
                failed.add(record["test"])
        else:
            fixtures[f"{record['name']} ({record['scope']})"].append(record["seconds"])
    files: dict[str, float] = defaultdict(float)
    for test, seconds in tests.items():
        files[test.split("::")[0]] += seconds
    by_fixture = {name: (sum(times), len(times)) for name, times in fixtures.items()}
    return {
        "total_seconds": sum(tests.values()),
        "test_count": len(tests),
        "failed": sorted(failed),
        "tests": sorted(tests.items(), key=lambda item: -item[1]),
        "files": sorted(files.items(), key=lambda item: -item[1]),
        "fixtures": sorted(by_fixture.items(), key=lambda item: -item[1][0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--tests", type=int, default=25)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--fixtures", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the whole summary here")
    parser.add_argument(
        "--durations",
        type=Path,
        help="write each file's seconds here (tests/durations.json orders the suite by them: the slowest files first)",
    )
    args = parser.parse_args()
    records = load(args.directory)
    if not records:
        print(f"no profile in {args.directory}: run the suite with STASIS_TEST_PROFILE={args.directory}")
        return 1
    summary = summarise(records)
    print(f"{summary['test_count']} tests, {summary['total_seconds']:.0f} test-seconds in all (over every worker)")
    print(f"\n{args.tests} slowest tests (set-up + call + teardown, s)")
    for test, seconds in summary["tests"][: args.tests]:
        print(f"{seconds:8.1f}  {test}")
    print(f"\n{args.files} slowest files (s)")
    for path, seconds in summary["files"][: args.files]:
        print(f"{seconds:8.1f}  {path}")
    print(f"\n{args.fixtures} costliest fixtures (their own set-up: total s, times set up)")
    for name, (seconds, count) in summary["fixtures"][: args.fixtures]:
        print(f"{seconds:8.1f}  {count:4d}x  {name}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if args.durations:
        args.durations.write_text(json.dumps({path: round(s) for path, s in summary["files"]}, indent=0) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
