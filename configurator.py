"""
The one option mechanism of every nanoPE script (nanoGPT's configurator, with checks):

  python train.py config/rope.py --batch_size=16 --pos_options="{'max_distance': 32}"

A script keeps its defaults as plain globals (or a dict) and calls
`configure(globals(), sys.argv[1:], RULES)`. Config files are Python files whose
top-level assignments override the defaults; `--key=value` values are Python
literals (bare words are strings). A key that is not a default, a value of another
type than its default (an int is fine for a float), or a value that breaks a rule is
an error naming the key and the fix: one line per problem, no traceback.
"""
import ast
import difflib
import os
import sys

# rules a script can attach to its numeric options: name -> (test, what it must be)
RULES = {
    '>0': (lambda v: v > 0, 'a positive number'),
    '>=0': (lambda v: v >= 0, 'zero or more'),
    '[0,1)': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    '[0,1]': (lambda v: 0 <= v <= 1, 'in [0, 1]'),
}


def closest(word, choices):
    """The (at most 3) choices closest to a misspelt word, by difflib: the one rule every unknown name is met with."""
    return difflib.get_close_matches(word, sorted(choices), n=3)


def unknown_names(what, words, choices, listing='valid'):
    """One line for names that are not among `choices`: each one's closest choices, then all of them, e.g.
    "unknown pos_encoding 'ropee'; did you mean rope, mrope, ropepp? valid schemes: alibi, ..." """
    words = [words] if isinstance(words, str) else list(words)
    near = [(w, closest(w, choices)) for w in words]
    hint = '; '.join(', '.join(c) + (f" for {w!r}" if len(words) > 1 else '') for w, c in near if c)
    return (f"unknown {what} {', '.join(map(repr, words))}; " + (f"did you mean {hint}? " if hint else '')
            + f"{listing}: {', '.join(sorted(choices))}")


def _fail(problems):
    sys.exit('\n'.join(problems))


def read_config_file(path):
    """Top-level assignments of a config file -> dict; a broken file is named with its line."""
    if os.path.isdir(path):
        _fail([f"config file {path!r} is a directory; pass a .py file such as config/rope.py"])
    if not os.path.exists(path):
        _fail([f"config file {path!r} not found; see config/ for the available ones"])
    try:
        src = open(path, encoding='utf-8').read()
        scope = {}
        exec(compile(src, path, 'exec'), {}, scope)
    except SyntaxError as e:
        _fail([f"config file {path}, line {e.lineno}: {e.msg}: {(e.text or '').strip()!r}"])
    except UnicodeDecodeError:
        _fail([f"config file {path} is not UTF-8 text"])
    except Exception as e:  # noqa: BLE001 - any error raised by the file's own code
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        line = tb.tb_lineno if tb.tb_frame.f_code.co_filename == path else '?'
        _fail([f"config file {path}, line {line}: {type(e).__name__}: {e}"])
    return {k: v for k, v in scope.items() if not k.startswith('_')}


def parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string


def configure(defaults, argv, rules=None, positional=None, keys=None):
    """Apply config files and --key=value overrides to `defaults` (a dict, e.g. a script's
    globals(), changed in place). Returns the set of keys that were set explicitly.
    rules: {key: '>0' | '>=0' | '[0,1)' | '[0,1]' | (test, description)} checked after
    all overrides. positional: a key that collects the arguments that are not options
    (a list), for scripts whose plain arguments are not config files (compare.py).
    keys: the option names (default: every public key of a plain type in `defaults`)."""
    keys = sorted(keys or (k for k, v in defaults.items() if not k.startswith('_')
                           and isinstance(v, (int, float, bool, str, list, dict, type(None)))))
    explicit, problems, plain = set(), [], []

    def set_key(k, v, where):
        if k not in keys:
            close = closest(k, keys)
            problems.append(f"unknown config key {k!r}{where}" + (f"; did you mean {', '.join(close)}?" if close
                            else f"; valid keys: {', '.join(keys)}"))
            return
        old = defaults[k]
        if old is not None and v is not None and type(v) is not type(old):
            if isinstance(old, float) and type(v) is int:
                v = float(v)
            elif isinstance(old, list) and type(v) is tuple:  # --mults=1,2 parses as a tuple
                v = list(v)
            else:
                problems.append(f"config key {k!r} expects {type(old).__name__} (default {old!r}), got {v!r} "
                                f"({type(v).__name__}){where}; write it like the default, e.g. --{k}={old!r}")
                return
        defaults[k] = v
        explicit.add(k)

    for arg in argv:
        if arg.startswith('--'):
            if '=' not in arg:
                problems.append(f"bad argument {arg!r}: use --key=value")
                continue
            k, text = arg[2:].split('=', 1)
            set_key(k, parse_value(text), '')
        elif positional is not None:
            plain.append(arg)
        else:
            for k, v in read_config_file(arg).items():
                set_key(k, v, f" (in {arg})")
    if positional is not None and plain:
        defaults[positional] = plain
        explicit.add(positional)
    for k, rule in (rules or {}).items():
        test, what = RULES[rule] if isinstance(rule, str) else rule
        v = defaults.get(k)
        if v is None:
            continue
        ok = False
        try:
            ok = bool(test(v))
        except TypeError:
            pass
        if not ok:
            problems.append(f"--{k}={v!r}: must be {what}")
    if problems:
        _fail(problems)
    return explicit


def options(defaults, argv, rules=None, positional=None):
    """configure() over a dict of defaults -> a namespace (for scripts that are also libraries);
    its `explicit` attribute is the set of keys the command line set."""
    d = dict(defaults)
    explicit = configure(d, argv, rules, positional)
    return type('Options', (), {**d, 'explicit': explicit})
