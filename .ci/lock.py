"""`make lock`: resolve settings.ini's requirements (with the dev extras) to exact versions with uv, write
requirements.lock, and say what changed.

The lock is resolved for the CI machine (CPython 3.11, Linux x86_64) against the torch that `TORCH` names, and
leaves out torch and the CUDA packages only torch needs: `TORCH` chooses the build per machine, and a CUDA
build brings its own. `make install` uses the lock as pip constraints, so every other package it installs
is the version here."""
import os, re, subprocess, sys, tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[1]
LOCK = root/'requirements.lock'
TORCH_ONLY = re.compile(r'^(torch|triton|nvidia-[\w-]+|cuda-[\w-]+)$')   # chosen by TORCH, not by the lock
HEADER = '''# Exact versions that `make test` passes with, for CPython 3.11 on Linux x86_64 (the CI machine).
# Made by `make lock` (uv pip compile of settings.ini's requirements and dev extras); do not edit by hand.
# Used as pip constraints by `make install`; torch and its CUDA packages are left to TORCH in the Makefile.
'''

def pins(text: str) -> dict:
    "{package: version} of a lock's `name==version` lines."
    return dict(m.groups() for m in re.finditer(r'^([A-Za-z0-9][\w.-]*)==(\S+)', text, re.M))

def without_torch(text: str) -> str:
    "The compiled file without torch's own packages (each entry is its pin line and the `#` lines under it)."
    out, skip = [], False
    for line in text.splitlines():
        if line and not line.startswith(' '): skip = bool(TORCH_ONLY.match(line.split('==')[0].lower()))
        if not skip and not line.startswith('#'): out.append(line)
    return HEADER + '\n'.join(out).strip('\n') + '\n'

def compile_lock(torch: str) -> str:
    uv = Path(sys.executable).parent/'uv'
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp)/'torch.txt').write_text(torch + '\n')
        # --refresh-package: setup.py reads settings.ini, which uv's cache of legalnb's metadata does not watch
        cmd = [str(uv), 'pip', 'compile', 'setup.py', '--extra', 'dev', '--upgrade', '--python-version', '3.11',
               '--python-platform', 'x86_64-manylinux_2_28', '-c', str(Path(tmp)/'torch.txt'),
               '--no-header', '--quiet', '--refresh-package', 'legalnb', '-o', str(Path(tmp)/'lock.txt')]
        subprocess.run(cmd, cwd=root, check=True)
        return without_torch((Path(tmp)/'lock.txt').read_text())

def changes(old: dict, new: dict) -> list[str]:
    "One line per package added, removed or moved to another version."
    return ([f'  + {p}=={new[p]}' for p in sorted(new.keys() - old.keys())] +
            [f'  - {p}=={old[p]}' for p in sorted(old.keys() - new.keys())] +
            [f'  {p}: {old[p]} -> {new[p]}' for p in sorted(old.keys() & new.keys()) if old[p] != new[p]])

def main():
    from torch_choice import check_requirement   # TORCH is data: a requirement of torch, or one line
    torch = check_requirement(os.environ.get('TORCH', 'torch==2.13.0').strip())
    old = LOCK.read_text() if LOCK.exists() else ''
    new = compile_lock(torch)
    diff = changes(pins(old), pins(new))
    LOCK.write_text(new)
    print(f'{LOCK.name}: {len(pins(new))} packages for {torch}; ' +
          (f'{len(diff)} changed:\n' + '\n'.join(diff) if diff else 'nothing changed'))
    if diff: print('Run `make test` with the new lock (make install picks it up), then commit requirements.lock.')

if __name__ == '__main__': main()
