"""Render README.md from nbs/index.ipynb without quarto (nbdev_readme needs it).

Markdown cells are copied, code cells become ```python blocks followed by their text output;
cells marked `#| hide` are left out and `#|` directives are dropped. `--check` exits 1 when
README.md differs from what the notebook says."""
import json, sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]

def cell_text(cell): return ''.join(cell['source'])

def render(nb_path=root/'nbs'/'index.ipynb') -> str:
    nb = json.loads(Path(nb_path).read_text(encoding='utf-8'))
    parts = []
    for cell in nb['cells']:
        src = cell_text(cell)
        lines = src.splitlines()
        directives = [l for l in lines if l.startswith('#|')]
        if any(d.split()[1:2] == ['hide'] for d in directives): continue
        body = '\n'.join(l for l in lines if not l.startswith('#|')).strip()
        if cell['cell_type'] == 'markdown':
            if body: parts.append(body)
            continue
        if cell['cell_type'] != 'code' or not body: continue
        parts.append(f'```python\n{body}\n```')
        text, rich = '', []
        for o in cell.get('outputs', []):   # text as a code block; Markdown displays as Markdown; images are left out
            data = o.get('data', {})
            if o.get('output_type') == 'stream': text += ''.join(o.get('text', ''))
            elif 'text/markdown' in data: rich.append(''.join(data['text/markdown']).strip())
            elif not any(k.startswith('image/') for k in data): text += ''.join(data.get('text/plain', ''))
        if text.strip(): parts.append(f'```\n{text.rstrip()}\n```')
        parts += rich
    body = '\n\n'.join(parts)
    # the notebook's front matter title (first H1) leads the README
    return '<!-- Generated from nbs/index.ipynb by .ci/render_readme.py: edit the notebook, not this file. -->\n\n' + body + '\n'

if __name__ == '__main__':
    text, readme = render(), root/'README.md'
    if '--check' in sys.argv:
        if not readme.exists() or readme.read_text(encoding='utf-8') != text:
            sys.exit('README.md differs from nbs/index.ipynb: run `make sync` (or .venv/bin/python .ci/render_readme.py) and commit.')
        print('README.md matches nbs/index.ipynb')
    else:
        readme.write_text(text, encoding='utf-8')
        print(f'wrote {readme}')
