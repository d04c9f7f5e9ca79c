"""The documentation site, checked without quarto: every notebook is a page with a title and a description,
the sidebar lists every notebook, and links between pages resolve."""
import json, re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'

def notebooks(): return sorted(NBS.glob('*.ipynb'))

def markdown(nb_path):
    nb = json.loads(nb_path.read_text(encoding='utf-8'))
    return [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown']

def sidebar_files(node):
    "Every file named in a quarto sidebar `contents` tree."
    if isinstance(node, str): return [node]
    if isinstance(node, dict): return sidebar_files(node.get('contents', []))
    return [f for item in node for f in sidebar_files(item)]

def test_quarto_config_is_the_one_nbdev_reads():
    assert (NBS/'_quarto.yml').resolve() == (ROOT/'_quarto.yml').resolve()
    cfg = yaml.safe_load((ROOT/'_quarto.yml').read_text())
    assert cfg['project']['type'] == 'website'

def test_sidebar_lists_every_notebook_and_nothing_else():
    cfg = yaml.safe_load((ROOT/'_quarto.yml').read_text())
    listed = sidebar_files(cfg['website']['sidebar']['contents'])
    assert sorted(listed) == sorted(p.name for p in notebooks())

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_every_page_has_title_and_description(nb):
    first = markdown(nb)[0].strip().splitlines()
    assert first[0].startswith('# ') and len(first[0]) > 3, f'{nb.name}: first markdown cell must start with an H1 title'
    assert len(first) > 1 and first[1].startswith('> ') and len(first[1]) > 20, f'{nb.name}: the H1 must be followed by a one-line `> description`'

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_every_page_explains_itself(nb):
    words = sum(len(m.split()) for m in markdown(nb))
    assert words >= 120, f'{nb.name}: only {words} words of prose; each page explains its stage to a new user'

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_links_between_pages_resolve(nb):
    for text in markdown(nb):
        for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', text):
            if re.match(r'[a-z]+://|mailto:', target): continue
            stem = Path(target).with_suffix('')
            candidates = [NBS/target, (NBS/stem).with_suffix('.ipynb'), ROOT/target]
            assert any(c.exists() for c in candidates), f'{nb.name}: link to {target} does not resolve'

def test_readme_says_how_to_render_the_site():
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    assert 'nbdev_docs' in readme and 'quarto' in readme.lower()
