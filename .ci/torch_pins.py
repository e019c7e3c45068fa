"""Refresh .ci/torch_pins.txt: the Requires-Dist lines of the Linux CUDA wheel of the torch that requirements.txt
pins, as PyPI's metadata gives them (pip resolves the wheel without installing it; it downloads the wheel where the
index serves no separate metadata). tests/test_requirements.py checks requirements.txt against the file, so run this
whenever the torch pin moves:

    python .ci/torch_pins.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON, PLATFORM = '3.12', 'manylinux_2_28_x86_64'  # a GPU machine's Python and its wheel tag


def torch_pin(path=os.path.join(HERE, '..', 'requirements.txt')):
    for line in open(path):
        name, _, version = line.split('#')[0].strip().partition('==')
        if name.strip() == 'torch':
            return version.strip()
    sys.exit(f"{path} pins no torch (a line torch==VERSION)")


def main():
    version = torch_pin()
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, 'report.json')
        subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--dry-run', '--ignore-installed', '--no-deps',
                        '--only-binary=:all:', '--python-version', PYTHON, '--platform', PLATFORM,
                        '--target', os.path.join(tmp, 'target'), '--report', report, f'torch=={version}'],
                       check=True)
        meta = json.load(open(report))['install'][0]['metadata']
    lines = [f"# torch=={meta['version']}: the Requires-Dist lines of its wheel for CPython {PYTHON} on "
             f"{PLATFORM}, the",
             "# CUDA build. Written by python .ci/torch_pins.py; read by tests/test_requirements.py",
             *meta.get('requires_dist', [])]
    with open(os.path.join(HERE, 'torch_pins.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print(f"wrote .ci/torch_pins.txt: torch {meta['version']}, {len(lines) - 2} requirements")


if __name__ == '__main__':
    main()
