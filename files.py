"""
Files written whole or not at all, never through a symbolic link, and read as data only.

An out_dir or a data folder may come from someone else (copied, shared, unpacked), so
nothing here trusts what is already in it:
- a write goes to a temporary file created exclusively (O_CREAT | O_EXCL: a link planted
  at that name makes it fail instead of being followed), is fsynced, then renamed over the
  target (POSIX rename replaces the name itself, never what a link there points to);
- an append or a lock opens its file with O_NOFOLLOW and refuses a link, naming it;
- JSON is read by one function that tells a missing file from a damaged one.

  atomic_write(path, lambda f: f.write(b'...'))      # bytes, whole or not at all
  atomic_json({'loss': 1.2}, 'out/eval.json')
  res, why = read_json('out/eval.json')              # (None, None) if missing; (None, why) if damaged
"""
import errno
import json
import os
import shutil

__all__ = ['atomic_write', 'atomic_json', 'read_json', 'open_append', 'open_no_follow', 'link_or_copy', 'LinkRefused']


class LinkRefused(OSError):
    """A file we would write is a symbolic link: refused rather than followed out of its folder."""


def _refuse_link(path, e):
    if e.errno == errno.ELOOP or os.path.islink(path):
        target = os.readlink(path) if os.path.islink(path) else '?'
        raise LinkRefused(errno.ELOOP, f"{path} is a symbolic link (to {target}); nanoPE does not write through "
                                       f"links: remove it (rm {path}) and run again") from None
    raise e


def open_no_follow(path, flags, mode=0o644):
    """os.open that refuses a symbolic link at `path` (LinkRefused names it)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0), mode)
    except OSError as e:
        _refuse_link(path, e)


def atomic_write(path, write, binary=True):
    """Call write(f) on a fresh temporary file beside `path`, fsync it, rename it over `path`.
    A kill or a full disk mid-write leaves the previous file whole and no temporary behind.
    The temporary name is fixed (path.tmp) so a killed write leaves one stale file, not many;
    whatever stands there (a stale file, or a planted link) is unlinked, never opened."""
    tmp = path + '.tmp'
    try:
        os.unlink(tmp)  # removes a link itself, not its target
    except FileNotFoundError:
        pass
    fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, 'wb' if binary else 'w') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_json(obj, path):
    """A JSON file written whole or not at all (results read by sweep.py and compare.py)."""
    atomic_write(path, lambda f: json.dump(obj, f), binary=False)


def read_json(path):
    """(object, None) for a readable JSON file; (None, None) if there is none; (None, why) if it is
    damaged (truncated or corrupt, unreadable, a link, not a file): the caller names it and moves on."""
    if not os.path.lexists(path):
        return None, None
    if os.path.islink(path) or not os.path.isfile(path):
        return None, "not a regular file (a link or a folder)"
    try:
        with open(path, 'rb') as f:
            raw = f.read()
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    try:
        return json.loads(raw), None
    except ValueError as e:  # (UnicodeDecodeError is a ValueError too)
        return None, f"truncated or corrupt JSON ({len(raw)} bytes; {e})"


def read_result(path):
    """A result JSON (eval*.json, passkey*.json, sweep_args.json) -> (dict, None) when whole, (None, None) when
    missing, (None, why) when damaged (read_json: truncated or corrupt, a link, not a file), not a JSON object, or
    an evaluation that was stopped half way (complete: false). Never mixed into a report."""
    res, why = read_json(path)
    if why or res is None:
        return None, why
    if not isinstance(res, dict):
        return None, f"not a JSON object (a {type(res).__name__})"
    if res.get('complete') is False:
        return None, "incomplete (complete: false; its evaluation was stopped half way)"
    return res, None


def open_append(path):
    """A text file opened for appending, refusing a link (a line log such as metrics.jsonl)."""
    return os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 'a')


def link_or_copy(src, dst):
    """Make dst the same file as src: a hard link (no second write), or a copy where the file
    system has none; either way through a fresh temporary name and one rename."""
    tmp = dst + '.tmp'
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(src, tmp, follow_symlinks=False)
        os.replace(tmp, dst)
    except OSError:
        with open(src, 'rb') as f:
            atomic_write(dst, lambda out: shutil.copyfileobj(f, out))
