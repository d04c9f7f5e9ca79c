"""requirements.lock: every requirement of settings.ini is pinned in it, inside its range; `make lock` leaves torch to
TORCH and says what changed."""
import configparser, importlib.util, re
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location('lock', ROOT/'.ci'/'lock.py')
lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock)

def requirements() -> list[Requirement]:
    cfg = configparser.ConfigParser(delimiters=['=']); cfg.read(ROOT/'settings.ini')
    return [Requirement(r) for key in ('requirements', 'dev_requirements') for r in cfg['DEFAULT'][key].split()]

def test_every_requirement_is_pinned_inside_its_range():
    "A requirement added to settings.ini without `make lock` fails here, not on a user's machine."
    pins = {re.sub(r'[-_.]+', '-', p).lower(): v for p, v in lock.pins(lock.LOCK.read_text()).items()}
    for r in requirements():
        name = re.sub(r'[-_.]+', '-', r.name).lower()
        if name == 'torch': assert name not in pins, 'torch is chosen by TORCH in the Makefile'; continue
        assert name in pins, f'{r.name} is in settings.ini but not in requirements.lock: run make lock'
        assert r.specifier.contains(pins[name], prereleases=True), f'the lock pins {r.name} {pins[name]}, outside {r}'

def test_the_lock_leaves_torch_and_its_cuda_packages_to_TORCH():
    compiled = '\n'.join(['numpy==2.4.6', '    # via torch', 'nvidia-cublas==13.1.1.3', '    # via torch',
                          'torch==2.13.0', '    # via legalnb (setup.py)', 'triton==3.7.1', 'cuda-toolkit==13.0.3.0',
                          'tqdm==4.70.1', '    # via', '    #   legalnb (setup.py)'])
    out = lock.without_torch(compiled)
    assert lock.pins(out) == {'numpy': '2.4.6', 'tqdm': '4.70.1'} and out.startswith(lock.HEADER)
    assert '    # via torch' in out and out.count('# via') == 2, "each kept entry keeps its own 'via' lines"
    assert not any(lock.TORCH_ONLY.match(p) for p in lock.pins(lock.LOCK.read_text()))

def test_make_lock_says_what_changed():
    old, new = {'a': '1', 'b': '2', 'c': '3'}, {'a': '1', 'b': '2.1', 'd': '4'}
    assert lock.changes(old, new) == ['  + d==4', '  - c==3', '  b: 2 -> 2.1']
    assert lock.changes(old, old) == []
