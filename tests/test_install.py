"""`make install`'s torch (Makefile, .ci/torch_choice.py, .ci/check_lock.py): TORCH_VARIANT / TORCH_INDEX pick the
index, a changed choice installs again and the same one does nothing, and SYSTEM_TORCH=1 uses a PyTorch image's torch
without downloading it. The image is made here: a copy of this Python's interpreter beside links to its standard
library, with its own site-packages holding torch 2.13.0+cu128 (a dist-info and torch/__init__.py), so the venv
really sees it through --system-site-packages. make runs for real with -n (what it would run) and -q (whether the
install stamp is out of date); the choice and the venv steps run for real; nothing is downloaded."""
import os, re, shlex, shutil, subprocess, sys, sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE_TORCH = '2.13.0+cu128'
# the outer make's settings (`make test TORCH_VARIANT=cpu` passes them down in MAKEFLAGS) must not reach these
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ('TORCH', 'TORCH_VARIANT', 'TORCH_INDEX', 'SYSTEM_TORCH',
                                                              'PYTHONPATH', 'MAKEFLAGS', 'MFLAGS', 'MAKELEVEL', 'VENV')}

def add_package(site: Path, name: str, version: str):
    "An installed package as pip leaves one: its dist-info (and a module to import)."
    info = site/f'{name}-{version}.dist-info'
    info.mkdir(parents=True)
    (info/'METADATA').write_text(f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n')
    (site/name.replace('-', '_')).mkdir(exist_ok=True)
    (site/name.replace('-', '_')/'__init__.py').write_text(f'__version__ = {version!r}\n')

def fake_image(at: Path, packages: dict[str, str]) -> Path:
    "A Python installed at `at` (its own prefix) with `packages` {name: version} in its site-packages; its python."
    stdlib, lib = Path(sysconfig.get_paths()['stdlib']), at/'lib'/Path(sysconfig.get_paths()['stdlib']).name
    lib.mkdir(parents=True); (at/'bin').mkdir()
    for entry in stdlib.iterdir():
        if entry.name != 'site-packages': (lib/entry.name).symlink_to(entry)
    for so in Path(sysconfig.get_config_var('LIBDIR') or '/nonexistent').glob('libpython*.so*'):
        (at/'lib'/so.name).symlink_to(so)   # an interpreter linked to libpython finds it beside the copy too
    python = at/'bin'/'python3'
    shutil.copy2(Path(sys._base_executable).resolve(), python)   # a copy, not a link: its prefix is `at`
    site = Path(subprocess.check_output([python, '-c', 'import site; print(site.getsitepackages()[0])'], text=True).strip())
    assert site.is_relative_to(at), site
    for name, version in packages.items(): add_package(site, name, version)
    return python

def make(*args, **settings) -> subprocess.CompletedProcess:
    "make ARGS with SETTINGS (VENV=..., TORCH_VARIANT=...) in the checkout, its outer settings left out."
    cmd = ['make', '--no-print-directory', *args, *[f'{k}={v}' for k, v in settings.items()]]
    return subprocess.run(cmd, cwd=ROOT, env=CLEAN_ENV, capture_output=True, text=True, timeout=60)

def recipe(venv: Path, **settings) -> list[str]:
    "The lines `make install` would run (make -n)."
    p = make('-n', 'install', VENV=venv, PYTHON=settings.pop('PYTHON', sys.executable), **settings)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()

def torch_step(lines: list[str]) -> str | None:
    "make's step that installs torch (torch_choice.py pip), if the recipe has one."
    return next((l for l in lines if l.endswith('.ci/torch_choice.py --venv ' + l.split(' --venv ')[-1].split()[0] +
                                                 ' --python ' + l.split(' --python ')[-1].split()[0] + ' pip')), None)

def torch_line(venv: Path, env: dict | None = None, **settings) -> str:
    "The pip command that step runs, as make runs it (its settings in the environment), printed by --dry-run."
    p = subprocess.run(['make', '--no-print-directory', '--eval', 'torch-pip: ; @$(PIP_TORCH) --dry-run', 'torch-pip',
                        f'VENV={venv}', f'PYTHON={sys.executable}', *[f'{k}={v}' for k, v in settings.items()]],
                       cwd=ROOT, env={**CLEAN_ENV, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()

def rest_line(lines: list[str]) -> str:
    "The line that installs legalnb and every package but torch."
    return next(l for l in lines if l.endswith('-e ".[dev]"'))

def test_torch_comes_from_pypi_by_default_and_from_the_variant_index(tmp_path):
    lines, v = recipe(tmp_path/'v'), tmp_path/'v'
    assert torch_step(lines), 'torch is installed by a step of its own'
    assert torch_line(v) == f'{v}/bin/python -m pip install -q --no-compile torch==2.13.0', 'the default as before'
    assert any(l.endswith('pip install -q -c requirements.lock --upgrade pip uv') for l in lines), 'uv as the lock pins'
    assert rest_line(lines).startswith(f'{tmp_path}/v/bin/uv pip install -q --python {tmp_path}/v/bin/python '
                                       f'-c requirements.lock -c {tmp_path}/v/.torch-choice'), 'uv installs the rest'
    assert torch_line(v, TORCH_VARIANT='cu126').endswith(
        ' torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126')
    assert torch_line(v, TORCH='torch==2.12.1', TORCH_VARIANT='cpu').endswith(
        ' torch==2.12.1 --index-url https://download.pytorch.org/whl/cpu')
    assert torch_line(v, env=dict(TORCH='torch>=2.4,<2.14')).endswith(" 'torch>=2.4,<2.14'"), 'from the environment'
    recipe(tmp_path/'v', TORCH_INDEX='https://mirror.example/torch')
    assert torch_line(v, TORCH_INDEX='https://mirror.example/torch').endswith(
        '--index-url https://mirror.example/torch')
    assert '# TORCH=torch==2.13.0 from https://mirror.example/torch' in (tmp_path/'v'/'.torch-choice').read_text()

@pytest.mark.parametrize('settings,says', [
    (dict(TORCH_VARIANT='cuda12'), "TORCH_VARIANT must be cpu, cuNNN (cu126, cu128, ...), rocmX.Y or xpu, got 'cuda12'"),
    (dict(TORCH_VARIANT='cu126', TORCH_INDEX='https://x'), 'TORCH_VARIANT=cu126 and TORCH_INDEX=https://x: give one'),
    (dict(SYSTEM_TORCH='yes'), "SYSTEM_TORCH must be 1 (or empty), got 'yes'"),
])
def test_a_bad_torch_choice_is_one_line(tmp_path, settings, says):
    p = make('install', VENV=tmp_path/'v', PYTHON=sys.executable, **settings)
    ours = [l for l in p.stderr.splitlines() if l.startswith('make install:')]
    assert p.returncode != 0 and len(ours) == 1 and says in ours[0], p.stderr
    assert not (tmp_path/'v'/'bin').exists(), 'nothing installed'

QUOTED = 'cpu"; touch {x}; echo "'   # what a quote in a make variable ran before (issue 48)

@pytest.mark.parametrize('name,value,says', [
    ('TORCH_VARIANT', QUOTED, 'TORCH_VARIANT must be cpu, cuNNN'),
    ('TORCH', 'torch==2.13.0"; touch {x}; echo "', 'TORCH must be a requirement of torch'),
    ('TORCH', "torch' ; touch {x} ; '", 'TORCH must be a requirement of torch'),
    ('TORCH_INDEX', 'https://mirror.example/torch; touch {x}', 'TORCH_INDEX must be an https URL'),
    ('TORCH_INDEX', 'https://mirror.example/torch"&&touch {x}&&"', 'TORCH_INDEX must be an https URL'),
    ('TORCH_INDEX', 'http://mirror.example/torch', 'TORCH_INDEX must be an https URL'),
    ('TORCH_VARIANT', '$(shell touch {x})', 'TORCH_VARIANT must be cpu'),   # make does not expand it either
])
@pytest.mark.parametrize('given', ['command line', 'environment'])
def test_make_variables_are_data_make_n_runs_nothing(tmp_path, name, value, says, given):
    "A quote, `;` or `$(...)` in TORCH, TORCH_VARIANT or TORCH_INDEX: make -n (and make install) refuse it in one line "
    "from the checked settings; nothing it names runs, no venv is made."
    x, venv = tmp_path/'ran', tmp_path/'v'
    value = value.format(x=x)
    for args in (['-n', 'install'], ['install']):
        cmd = ['make', '--no-print-directory', *args, f'VENV={venv}', f'PYTHON={sys.executable}']
        p = subprocess.run(cmd + [f'{name}={value}'] * (given == 'command line'), cwd=ROOT,
                           env={**CLEAN_ENV, **({name: value} if given == 'environment' else {})},
                           capture_output=True, text=True, timeout=60)
        ours = [l for l in p.stderr.splitlines() if l.startswith('make install:')]
        assert p.returncode != 0 and len(ours) == 1 and says in ours[0] and repr(value) in ours[0], (args, p.stderr)
        assert not x.exists(), f'make {" ".join(args)} ran what {name} held'
        assert not (venv/'bin').exists() and not (venv/'.torch-choice').exists(), 'nothing made'

def test_a_changed_torch_choice_installs_again(tmp_path):
    "make -q: 0 when the install stamp is up to date, 1 when it would install; the choice file keeps its date unless "
    "its text changes."
    venv = tmp_path/'v'; stamp, choice = venv/'.installed-stamp', venv/'.torch-choice'
    out_of_date = lambda **s: make('-q', str(stamp), VENV=venv, PYTHON=sys.executable, **s).returncode == 1
    assert out_of_date(), 'nothing installed yet'
    venv.mkdir(exist_ok=True); stamp.touch()   # as the install's last step does
    written = choice.stat().st_mtime_ns
    assert not out_of_date() and not out_of_date(), 'the same choice: nothing to do'
    assert choice.stat().st_mtime_ns == written, 'the same choice leaves the file as it was'
    assert out_of_date(TORCH_VARIANT='cu126') and 'whl/cu126' in choice.read_text()
    stamp.touch(); assert not out_of_date(TORCH_VARIANT='cu126')
    assert out_of_date(TORCH_VARIANT='cu126', TORCH='torch==2.12.1'), 'TORCH is part of the choice'
    stamp.touch(); assert out_of_date(), 'back to the default: install again'

def test_the_images_torch_is_used_without_a_download(tmp_path):
    image = fake_image(tmp_path/'image', {'torch': IMAGE_TORCH})
    venv = tmp_path/'v'
    lines = recipe(venv, PYTHON=image, SYSTEM_TORCH=1)
    assert torch_step(lines) is None, 'no pip install of torch'
    assert f'torch=={IMAGE_TORCH}\n' in (venv/'.torch-choice').read_text(), 'the choice pins the image torch'
    assert f'-c {venv}/.torch-choice -e ".[dev]"' in rest_line(lines), 'so installing legalnb keeps it'
    assert rest_line(lines).startswith(f'{venv}/bin/python -m pip install'), "pip: uv would not see the image's torch"
    # make's venv step, run for real (without pip, which takes seconds to copy in), its setting in the environment
    step = shlex.split(next(l for l in lines if l.endswith(' venv'))) + ['--without-pip']
    p = subprocess.run(step, cwd=ROOT, env={**CLEAN_ENV, 'SYSTEM_TORCH': '1'}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and f'torch {IMAGE_TORCH} of the image' in p.stdout and 'not downloaded' in p.stdout, p
    assert 'include-system-site-packages = true' in (venv/'pyvenv.cfg').read_text()
    seen = subprocess.check_output([venv/'bin'/'python', '-c', 'import torch; print(torch.__version__, torch.__file__)'],
                                   env=CLEAN_ENV, text=True).split()
    assert seen[0] == IMAGE_TORCH and Path(seen[1]).is_relative_to(tmp_path/'image'), seen
    # pip, told the choice, finds legalnb's torch requirement met by the image's, with no index to download from
    pip = subprocess.run([sys.executable, '-m', 'pip', '--python', venv/'bin'/'python', 'install', '--no-index',
                          '-c', venv/'.torch-choice', 'torch>=2.4'], env=CLEAN_ENV, capture_output=True, text=True)
    assert pip.returncode == 0 and f'Requirement already satisfied: torch>=2.4' in pip.stdout, pip
    assert f'({IMAGE_TORCH})' in pip.stdout

def test_switching_to_the_images_torch_makes_the_venv_anew(tmp_path):
    "A venv with its own torch would hide the image's: SYSTEM_TORCH switching on (or off) makes the venv again."
    image, venv = fake_image(tmp_path/'image', {'torch': IMAGE_TORCH}), tmp_path/'v'
    step = lambda system: subprocess.run([image, ROOT/'.ci'/'torch_choice.py', 'venv', '--venv', venv, '--python',
                                          image, '--system', system, '--without-pip'],
                                         env=CLEAN_ENV, capture_output=True, text=True, timeout=60)
    assert step('').returncode == 0 and 'false' in (venv/'pyvenv.cfg').read_text()
    (venv/'.installed-stamp').touch()
    p = step('1')
    assert p.returncode == 0 and 'made anew, seeing the packages of' in p.stdout, p
    assert 'include-system-site-packages = true' in (venv/'pyvenv.cfg').read_text()
    assert not (venv/'.installed-stamp').exists(), 'everything installs again'
    assert f'torch=={IMAGE_TORCH}' in (venv/'.torch-choice').read_text(), 'the choice is written again after --clear'
    assert 'no longer seeing' in step('0').stdout and 'false' in (venv/'pyvenv.cfg').read_text()

def test_an_image_without_torch_is_one_line(tmp_path):
    image = fake_image(tmp_path/'image', {})
    p = make('install', VENV=tmp_path/'v', PYTHON=image, SYSTEM_TORCH=1)
    ours = [l for l in p.stderr.splitlines() if l.startswith('make install:')]
    assert p.returncode != 0 and len(ours) == 1, p.stderr
    assert f'SYSTEM_TORCH=1, but PYTHON={image} has no torch installed' in ours[0]
    assert 'leave SYSTEM_TORCH out to install torch==2.13.0' in ours[0] and not (tmp_path/'v'/'bin').exists()

def test_the_lock_check_takes_the_images_torch_and_checks_the_rest(tmp_path):
    "Everything the lock lists is checked as Python imports it; the image's torch and its other packages are not."
    numpy = re.search(r'^numpy==(\S+)', (ROOT/'requirements.lock').read_text(), re.M).group(1)
    image = fake_image(tmp_path/'image', {'torch': IMAGE_TORCH, 'numpy': '1.0.0', 'image-only-tool': '3.1'})
    venv = tmp_path/'v'
    subprocess.run([image, '-m', 'venv', '--without-pip', '--system-site-packages', venv], check=True)
    site = Path(subprocess.check_output([venv/'bin'/'python', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                                        text=True).strip())
    check = lambda: subprocess.run([venv/'bin'/'python', ROOT/'.ci'/'check_lock.py'], env=CLEAN_ENV,
                                   capture_output=True, text=True, timeout=60)
    p = check()
    assert p.returncode != 0 and f'numpy 1.0.0 is installed, the lock says {numpy}' in p.stderr, p
    assert 'torch' not in p.stderr and 'image-only-tool' not in p.stderr, p.stderr
    add_package(site, 'numpy', numpy)   # pip installs the lock's numpy into the venv, over the image's
    p = check()
    assert p.returncode == 0, p.stderr
    assert f"torch {IMAGE_TORCH} of the image ({image.parents[1]}" in p.stdout, p.stdout
    assert '1 other package(s) of the image' in p.stdout, p.stdout
    add_package(site, 'stray', '1.0')   # a package pip put into the venv that the lock lacks: a stale lock
    assert 'stray 1.0 is not in the lock' in check().stderr
