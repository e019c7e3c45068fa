"""
What a person reads: a progress bar on a terminal, one line per finished stage in a log file
(CI, nohup, sweep logs), and one line, not a traceback, when Ctrl-C ends a script.

  with progress(total=40, desc='sliding @4L', unit='batch') as bar:
      for ...: bar.update()
  exit_on_ctrl_c('eval.py')        # at the top of a script's main
  end_on_closed_pipe()             # a script whose output is read through a pipe (sample.py | head)
"""
import os
import signal
import sys
import time


class _StageLine:
    """tqdm's interface, minus the bar: one line when the stage ends (if it ran to its end), and with `every`
    a line each `every` seconds while it runs (a stage of minutes, such as sampling, must not look hung)."""

    def __init__(self, total, desc, unit, every=None):
        self.n, self.total, self.desc, self.unit, self.t0, self.post = 0, total, desc, unit, time.time(), ''
        self.every, self.said = every, self.t0

    def update(self, k=1):
        self.n += k
        if self.every and self.desc is not None and time.time() - self.said >= self.every:
            self.said = time.time()
            print(f"{self.desc}: {self.n:,}" + (f"/{self.total:,}" if self.total else '') + f" {self.unit}(s) so far, "
                  f"{self.said - self.t0:.0f}s", file=sys.stderr, flush=True)

    def set_postfix_str(self, s):
        self.post = s

    def close(self):
        if self.desc is not None and (self.total is None or self.n >= self.total):
            print(f"{self.desc}: {self.n:,} {self.unit}(s) in {time.time() - self.t0:.1f}s"
                  + (f", {self.post}" if self.post else ''), file=sys.stderr, flush=True)
        self.desc = None  # once

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()


def progress(total=None, desc=None, unit='it', every=None):
    """A tqdm bar on stderr when it is a terminal; else one line per finished stage (and one each `every`
    seconds while it runs, if given). desc=None or a single step: silent."""
    quiet = desc is None or (total is not None and total <= 1)
    if sys.stderr.isatty():
        from tqdm import tqdm  # here: only a terminal gets a bar
        return tqdm(total=total, desc=desc, unit=unit, disable=quiet, leave=False, dynamic_ncols=True)
    return _StageLine(total, None if quiet else desc, unit, every)


def exit_on_ctrl_c(script, hint=''):
    """Ctrl-C (SIGINT) ends the script with one line instead of a KeyboardInterrupt traceback.
    Whatever the script writes is atomic, so what it had written before stays whole."""
    def handler(signum, frame):
        sys.stderr.flush()
        raise SystemExit(f"{script}: interrupted by Ctrl-C" + (f"; {hint}" if hint else ''))
    signal.signal(signal.SIGINT, handler)


def end_on_closed_pipe():
    """When the reader of stdout goes (`sample.py | head`), the next print raises BrokenPipeError: end quietly
    instead, as Unix tools do. stdout then points at /dev/null, so the interpreter's last flush cannot raise
    again; any other exception keeps its traceback."""
    shown = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
        shown(kind, value, tb)
    sys.excepthook = hook
