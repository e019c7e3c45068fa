"""
Compare runs: read the eval/passkey JSONs of several out_dirs and write a report folder
with a markdown table and PNG plots (report.py: what it holds and how it is made), by
default beside the runs: `report/` in the folder they share (one run: inside it).

  python compare.py out-rope out-alibi out-nope     # -> ./report (the folder the three share)
  python compare.py out-rope                        # -> out-rope/report
  python compare.py out-sweep/*                     # -> out-sweep/report, where sweep.py writes its own
  python compare.py out-rope out-alibi --report_dir=report-rope-alibi
  python compare.py --leaderboard=True out-lb out-tasks   # one leaderboard over sweeps' reports, to stdout
  python compare.py --leaderboard=True --columns=2L,sliding16L,sort out-lb out-tasks   # these columns, in order

Out_dirs of task runs (train.py --task=...) get the task suite's report instead.
"""
import os
import sys

from console import exit_on_ctrl_c

if __name__ == '__main__':  # Ctrl-C: one line, no traceback (every report file is replaced whole)
    exit_on_ctrl_c('compare.py', 'run it again')
from configurator import options  # noqa: E402
from report import load_json, make_report, make_task_report, sweeps_leaderboard  # noqa: E402


def beside(runs):
    """The default report folder: report/ in the deepest folder every run is in (one run: the run's own)."""
    common = os.path.commonpath([os.path.abspath(d) for d in runs])
    rel = os.path.relpath(common)
    return os.path.join(common if rel.startswith('..') else rel, 'report')


def main(argv):
    o = options(dict(report_dir='', runs=[], baseline='rope', leaderboard=False, columns=''), argv,
                positional='runs')
    missing = [d for d in o.runs if not os.path.isdir(d)]
    if missing or not o.runs:
        sys.exit(f"not a run directory: {', '.join(missing)}" if missing else "usage: python compare.py OUT_DIR "
                 "[OUT_DIR ...] [--report_dir=DIR (default: report/ in the folder the runs share)] [--baseline=rope]"
                 "  (no out_dir given)")
    try:
        if o.leaderboard:  # the folders are sweeps' --out folders, each with its report
            print(sweeps_leaderboard(o.runs, o.baseline, o.columns), end='')
        else:  # (a damaged eval.json is named by the report)
            found = [r for r in (load_json(os.path.join(d, 'eval.json')) for d in o.runs) if r]
            write = make_task_report if found and all('task' in r for r in found) else make_report
            print(f"wrote {write(o.runs, o.report_dir or beside(o.runs), baseline=o.baseline)}")
    except ValueError as e:  # nothing readable to report on
        sys.exit(str(e))


if __name__ == '__main__':
    main(sys.argv[1:])
