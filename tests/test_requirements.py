"""requirements.txt against the pins of the torch it names: on a Linux GPU machine pip takes PyPI's CUDA build of
that torch, whose own Requires-Dist lines (.ci/torch_pins.txt, refreshed by python .ci/torch_pins.py) pin triton and
CUDA's libraries; a line of ours that excludes one of those versions makes the install unresolvable there."""
import os
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

PINS = os.path.join(ROOT, '.ci', 'torch_pins.txt')
# the machines the README's install serves: Linux (GPU or CPU) on the Pythons torch has wheels for, and a Mac
ENVIRONMENTS = [dict(platform_system=system, sys_platform=plat, python_version=f'3.{minor}',
                     python_full_version=f'3.{minor}.0', platform_machine=machine, extra='')
                for system, plat, machine in (('Linux', 'linux', 'x86_64'), ('Linux', 'linux', 'aarch64'),
                                              ('Darwin', 'darwin', 'arm64'))
                for minor in (10, 11, 12, 13, 14)]


def requirements(lines):
    """The Requirement of each line that names one (comments and blanks skipped)."""
    return [Requirement(line) for line in (raw.split('#')[0].strip() for raw in lines) if line]


def torch_pins():
    """(the torch version the pins are of, [Requirement] of its wheel)."""
    lines = open(PINS).read().splitlines()
    version = re.match(r'# torch==(\S+):', lines[0]).group(1)
    return version, requirements(lines)


def conflicts(ours, pins):
    """Each (environment, our requirement, its pin) where our line admits no version the torch wheel pins: for
    every requirement of ours on a package that torch pins exactly (==), in every environment where both apply."""
    found = []
    for env in ENVIRONMENTS:
        for pin in pins:
            exact = [s.version for s in pin.specifier if s.operator == '==']
            if not exact or (pin.marker and not pin.marker.evaluate(env)):
                continue
            for r in ours:
                applies = not r.marker or r.marker.evaluate(env)
                if applies and canonicalize_name(r.name) == canonicalize_name(pin.name) \
                        and not r.specifier.contains(exact[0], prereleases=True):
                    found.append((f"{env['platform_system']} {env['platform_machine']} py{env['python_version']}",
                                  str(r), str(pin)))
    return found


def ours():
    return requirements(open(os.path.join(ROOT, 'requirements.txt')).read().splitlines())


def test_the_pins_are_of_the_torch_we_pin():
    """.ci/torch_pins.txt is of the torch requirements.txt names: refreshed whenever the torch pin moves."""
    version, pins = torch_pins()
    torch_req = [r for r in ours() if r.name == 'torch']
    assert len(torch_req) == 1 and str(torch_req[0].specifier) == f'=={version}', \
        f"requirements.txt pins {torch_req[0]}, .ci/torch_pins.txt is of torch=={version}: python .ci/torch_pins.py"
    assert any(p.name == 'triton' for p in pins), "the pins of torch's CUDA wheel name no triton: a bad refresh"


def test_no_requirement_excludes_a_version_torch_pins():
    _, pins = torch_pins()
    assert conflicts(ours(), pins) == []


@pytest.mark.parametrize('line', ['triton==3.9.0; platform_system == "Linux"', 'triton>=3.8',
                                  'nvidia-cudnn-cu13<9.20', 'nvidia-nccl-cu13==2.29.6'])
def test_a_line_that_excludes_a_pinned_version_is_found(line):
    """The check finds a line that excludes the version torch's CUDA wheel pins: the triton==3.9.0 that once made
    the install unresolvable on a GPU machine, a range, a pin of CUDA's libraries."""
    _, pins = torch_pins()
    found = conflicts(requirements([line]), pins)
    assert found and all(f[0].startswith('Linux') for f in found), found
