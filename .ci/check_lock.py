"""After `make install`: every installed package is the version requirements.lock names (torch and its CUDA
packages aside, which TORCH chooses). A package the lock does not list, or another version of one it does,
means the lock is stale: run `make lock`. With --report (make test-latest) it lists the differences and passes.

A venv that sees the system's packages (SYSTEM_TORCH=1: a PyTorch image's) uses the image's torch, whichever
version it is; the image's packages the lock does not list are left alone (legalnb does not use them), and every
package the lock lists is checked as Python imports it (pip installs the lock's version over an image's other one)."""
import re, sys
from importlib.metadata import distributions
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lock import LOCK, TORCH_ONLY, changes, pins

norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()

def importable() -> dict[str, tuple[str, Path]]:
    "{package: (version, folder)} of each installed package as Python imports it: the first one on sys.path."
    found = {}
    for d in distributions():
        if d.metadata['Name']: found.setdefault(norm(d.metadata['Name']), (d.version, Path(d.locate_file(''))))
    return found

def sees_system() -> bool:
    "Whether this venv sees the system's site-packages (pyvenv.cfg's include-system-site-packages)."
    cfg = Path(sys.prefix)/'pyvenv.cfg'
    return cfg.exists() and bool(re.search(r'^include-system-site-packages\s*=\s*true', cfg.read_text(), re.M | re.I))

def outside(folder: Path) -> bool: return not folder.resolve().is_relative_to(Path(sys.prefix).resolve())

def main():
    locked = {norm(p): v for p, v in pins(LOCK.read_text()).items()}
    found, image = importable(), sees_system()
    theirs = {p for p, (_, where) in found.items() if image and outside(where) and p not in locked}
    installed = {p: v for p, (v, _) in found.items() if p != 'legalnb' and not TORCH_ONLY.match(p) and p not in theirs}
    if '--report' in sys.argv:
        diff = changes(locked, installed)
        return print(f'this environment against {LOCK.name} ({len(diff)} differ):\n' + '\n'.join(diff))
    problems = [f'{p} {v} is installed, the lock says {locked[p]}' if p in locked else f'{p} {v} is not in the lock'
                for p, v in sorted(installed.items()) if locked.get(p) != v]
    if problems: sys.exit(f'{LOCK.name} does not match this environment (make lock refreshes it):\n  ' + '\n  '.join(problems))
    torch = found.get('torch')
    if image and torch and outside(torch[1]):
        torch = (f'; torch {torch[0]} of the image ({torch[1]}); {len(theirs - {"torch"})} other package(s) of the '
                 'image, not in the lock, left alone')
    else: torch = f'; torch {torch[0]}' if torch else ''
    print(f'{len(installed)} packages installed, each as {LOCK.name} pins it{torch}')

if __name__ == '__main__': main()
