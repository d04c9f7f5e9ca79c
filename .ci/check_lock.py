"""After `make install`: every installed package is the version requirements.lock names (torch and its CUDA
packages aside, which TORCH chooses). A package the lock does not list, or another version of one it does,
means the lock is stale: run `make lock`. With --report (make test-latest) it lists the differences and passes."""
import re, sys
from importlib.metadata import distributions
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lock import LOCK, TORCH_ONLY, changes, pins

norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()

def main():
    locked = {norm(p): v for p, v in pins(LOCK.read_text()).items()}
    installed = {norm(d.metadata['Name']): d.version for d in distributions()}
    installed = {p: v for p, v in installed.items() if p != 'legalnb' and not TORCH_ONLY.match(p)}
    if '--report' in sys.argv:
        diff = changes(locked, installed)
        return print(f'this environment against {LOCK.name} ({len(diff)} differ):\n' + '\n'.join(diff))
    problems = [f'{p} {v} is installed, the lock says {locked[p]}' if p in locked else f'{p} {v} is not in the lock'
                for p, v in sorted(installed.items()) if locked.get(p) != v]
    if problems: sys.exit(f'{LOCK.name} does not match this environment (make lock refreshes it):\n  ' + '\n  '.join(problems))
    print(f'{len(installed)} packages installed, each as {LOCK.name} pins it')

if __name__ == '__main__': main()
