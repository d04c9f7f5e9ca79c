"""Fail when `nbdev_clean` or `nbdev_export` would change anything, or README.md drifts from nbs/index.ipynb.

Works on a copy, so it never touches the working tree."""
import filecmp, shutil, subprocess, sys, tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[1]

def differing(a: Path, b: Path) -> list:
    "Files that differ between two trees, or exist in only one of them."
    cmp, out = filecmp.dircmp(a, b, ignore=['__pycache__']), []
    out += [str(a/f) for f in cmp.left_only + cmp.right_only + cmp.diff_files]
    for sub in cmp.common_dirs: out += differing(a/sub, b/sub)
    return out

def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in ('nbs', 'legalnb', '.ci'): shutil.copytree(root/name, tmp/name, ignore=shutil.ignore_patterns('__pycache__', '.ipynb_checkpoints'))
        for name in ('settings.ini', 'README.md'): shutil.copy(root/name, tmp/name)
        for cmd in (['nbdev_clean'], ['nbdev_export']):
            cmd = [str(Path(sys.executable).parent/cmd[0])]
            subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)
        problems = [f'not clean (run nbdev_clean): {p}' for p in differing(root/'nbs', tmp/'nbs')]
        problems += [f'not exported (run nbdev_export): {p}' for p in differing(root/'legalnb', tmp/'legalnb')]
        if problems: sys.exit('\n'.join(problems))
    subprocess.run([sys.executable, str(root/'.ci'/'render_readme.py'), '--check'], check=True)
    print('notebooks clean, library exported, README in step')

if __name__ == '__main__': main()
