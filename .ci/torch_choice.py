"""`make install`'s choice of torch, kept in one file (VENV/.torch-choice) that the install stamp depends on.

TORCH names the version (torch==2.13.0); TORCH_VARIANT (cpu, cu126, cu128, ...) or TORCH_INDEX (a URL) the package
index it comes from (https://download.pytorch.org/whl/VARIANT; neither: PyPI, a CUDA build on Linux x86-64).
SYSTEM_TORCH=1 uses the torch already installed for PYTHON instead (a PyTorch image's): the venv sees PYTHON's
site-packages and torch is not installed again.

The choice file is rewritten only when its text changes (make's idiom for depending on variables: a target that
always runs but keeps its date when nothing changed), so a changed choice re-installs and the same one does nothing.
It is also a pip constraints file: with the image's torch it pins that torch, so installing legalnb can never
download another one.

The settings are data: make exports them, this script reads them from the environment (TORCH, TORCH_VARIANT,
TORCH_INDEX, SYSTEM_TORCH; the flags below override them) and checks each before anything runs; no shell line is
built from them (pip gets them as arguments), so a quote or `;` in one is refused in one line, never run.

  record  check the settings, write the choice file if its text changed (make runs it on every call: cheap)
  venv    create the venv (seeing PYTHON's site-packages with SYSTEM_TORCH=1), anew when that setting changed
  pip     install torch into the venv with pip, from the chosen index (--dry-run: print the command only)
"""
import argparse, json, os, re, shlex, subprocess, sys
from pathlib import Path
from urllib.parse import urlsplit

VARIANT = re.compile(r'^(cpu|cu\d{3}|rocm\d+(\.\d+)*|xpu)$')
# torch, optionally with version specifiers: torch==2.13.0, torch>=2.4,<2.14, torch==2.13.0+cpu
SPEC = r'\s*(===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9][A-Za-z0-9.*+!_-]*'
REQUIREMENT = re.compile(rf'^torch(?:{SPEC}(?:\s*,{SPEC})*)?$')
PYTORCH_INDEX = 'https://download.pytorch.org/whl/'
FIND_TORCH = ("import importlib.metadata as m, json; d = m.distribution('torch'); "
              "print(json.dumps([d.version, str(d.locate_file(''))]))")

def fail(message: str): sys.exit(f'make install: {message}')

def check_requirement(torch: str) -> str:
    "TORCH as given, when it is a requirement of torch; else one line."
    if not REQUIREMENT.match(torch):
        fail(f'TORCH must be a requirement of torch (torch, torch==2.13.0, torch>=2.4,<2.14), got {torch!r}')
    return torch

def check_index(url: str) -> str:
    "TORCH_INDEX as given, when it is an https URL (no spaces, quotes or control characters); else one line."
    try: parts = urlsplit(url)
    except ValueError: parts = None
    if not parts or parts.scheme != 'https' or not parts.hostname or re.search(r'[\s"\'`\\<>]|[^ -~]', url):
        fail(f'TORCH_INDEX must be an https URL of a package index (https://download.pytorch.org/whl/cpu), '
             f'got {url!r}')
    return url

def index_url(a) -> str:
    "The index torch comes from: TORCH_INDEX, the variant's PyTorch index, or '' (PyPI)."
    if a.variant and not VARIANT.match(a.variant):
        fail(f'TORCH_VARIANT must be cpu, cuNNN (cu126, cu128, ...), rocmX.Y or xpu, got {a.variant!r}')
    if a.index: check_index(a.index)
    if a.variant and a.index: fail(f'TORCH_VARIANT={a.variant} and TORCH_INDEX={a.index}: give one of them')
    return a.index or (PYTORCH_INDEX + a.variant if a.variant else '')

def image_torch(python: str) -> tuple[str, str] | None:
    "(version, folder) of the torch that `python` has installed, or None."
    p = subprocess.run([python, '-c', FIND_TORCH], capture_output=True, text=True)
    return tuple(json.loads(p.stdout)) if p.returncode == 0 else None

def choice_text(a) -> str:
    "The choice file: what decides torch, and (the image's torch) a pip constraint pinning it."
    head = '# the torch of this venv, written by `make install` (.ci/torch_choice.py); a change re-installs\n'
    check_requirement(a.torch)
    if a.system not in ('', '0', '1'): fail(f'SYSTEM_TORCH must be 1 (or empty), got {a.system!r}')
    if a.system != '1':
        url = index_url(a)
        return head + f'# TORCH={a.torch} from {url or "PyPI"}\n'
    if a.variant or a.index: fail('SYSTEM_TORCH=1 uses the torch already installed: drop TORCH_VARIANT/TORCH_INDEX')
    if not (found := image_torch(a.python)):
        fail(f'SYSTEM_TORCH=1, but PYTHON={a.python} has no torch installed: run on an image with PyTorch (PYTHON '
             f'its Python), or leave SYSTEM_TORCH out to install {a.torch}')
    version, where = found
    return head + f'# SYSTEM_TORCH=1: the torch of {a.python}, in {where}\ntorch=={version}\n'

def record(a):
    "Write the choice file if its text changed (its date then makes the stamp out of date), else leave it."
    text, path = choice_text(a), Path(a.venv)/'.torch-choice'
    if path.exists() and path.read_text() == text: return
    if path.exists(): print(f'{path}: the torch choice changed, install again:\n{text}', end='')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

def sees_system(venv: Path) -> bool:
    "Whether `venv` sees its Python's system site-packages."
    return bool(re.search(r'^include-system-site-packages\s*=\s*true', (venv/'pyvenv.cfg').read_text(), re.M | re.I))

def make_venv(a):
    "Create the venv; anew (--clear) when it exists but SYSTEM_TORCH changed whether it sees the system's packages."
    venv, system = Path(a.venv), a.system == '1'
    again = (venv/'bin'/'python').exists() and (venv/'pyvenv.cfg').exists() and sees_system(venv) != system
    if (venv/'bin'/'python').exists() and not again: return report(a) if system else None
    if again: print(f'{venv}: made anew, {"seeing" if system else "no longer seeing"} the packages of {a.python} '
                    '(SYSTEM_TORCH changed)')
    cmd = [a.python, '-m', 'venv', *['--system-site-packages'] * system, *['--clear'] * again,
           *['--without-pip'] * a.without_pip, str(venv)]
    print(' '.join(cmd)); subprocess.run(cmd, check=True)
    if again: record(a)   # --clear emptied the folder, the choice file too
    if system: report(a)

def report(a):
    "Say which torch the venv uses, and refuse one installed into the venv itself (it would hide the image's)."
    if not (found := image_torch(str(Path(a.venv)/'bin'/'python'))):
        fail(f'SYSTEM_TORCH=1, but {a.venv} sees no torch: delete {a.venv} and run make again')
    version, where = found
    if Path(where).resolve().is_relative_to(Path(a.venv).resolve()):
        fail(f'SYSTEM_TORCH=1, but {a.venv} holds its own torch {version}: delete {a.venv} and run make again')
    print(f'torch {version} of the image ({where}): used as it is, not downloaded')

def pip_torch(a):
    "Install torch (TORCH, from the chosen index) into the venv with pip: one argument list, no shell."
    url = (check_requirement(a.torch), index_url(a))[1]   # checked again, as `record` did
    cmd = [str(Path(a.venv)/'bin'/'python'), '-m', 'pip', 'install', '-q', '--no-compile', a.torch,
           *(['--index-url', url] if url else [])]
    print(shlex.join(cmd), flush=True)
    if not a.dry_run: sys.exit(subprocess.run(cmd).returncode)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    env = os.environ.get
    p.add_argument('step', choices=['record', 'venv', 'pip'])
    p.add_argument('--venv', required=True)
    p.add_argument('--python', default='python3', help='the Python that makes the venv (PYTHON)')
    p.add_argument('--torch', default=env('TORCH') or 'torch', help='the requirement (default: $TORCH)')
    p.add_argument('--variant', default=env('TORCH_VARIANT', ''), help='default: $TORCH_VARIANT')
    p.add_argument('--index', default=env('TORCH_INDEX', ''), help='default: $TORCH_INDEX')
    p.add_argument('--system', default=env('SYSTEM_TORCH', ''), help='default: $SYSTEM_TORCH')
    p.add_argument('--without-pip', action='store_true', help='a venv without pip (tests)')
    p.add_argument('--dry-run', action='store_true', help='pip: print the command, run nothing')
    a = p.parse_args(argv)
    a.torch, a.variant, a.index, a.system = a.torch.strip(), a.variant.strip(), a.index.strip(), a.system.strip()
    {'record': record, 'venv': make_venv, 'pip': pip_torch}[a.step](a)

if __name__ == '__main__': main()
