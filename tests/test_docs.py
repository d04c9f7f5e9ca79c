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

def code_cells(nb_path):
    return [c for c in json.loads(nb_path.read_text(encoding='utf-8'))['cells'] if c['cell_type'] == 'code']

# an `assert` inside `except` passes silently when nothing is raised: checks use fastcore's test_fail instead
EXCEPT_ASSERT = re.compile(r'except[^\n]*:[^\n]*\bassert\b|except[^\n]*:[ \t]*\n[ \t]+[^\n]*\bassert\b')

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_error_checks_can_fail(nb):
    weak = [i for i, c in enumerate(code_cells(nb)) if EXCEPT_ASSERT.search(''.join(c['source']))]
    assert not weak, f'{nb.name}: code cells {weak} check an error with an assert inside except; use test_fail'

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_outputs_hold_no_temporary_paths(nb):
    bad = [i for i, c in enumerate(code_cells(nb)) if '/tmp/' in json.dumps(c.get('outputs', []))]
    assert not bad, f'{nb.name}: code cells {bad} store /tmp/ paths in their outputs (they change on every run)'

@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.name)
def test_notebooks_name_their_kernel(nb):
    spec = json.loads(nb.read_text(encoding='utf-8'))['metadata'].get('kernelspec', {})
    assert spec.get('name') == 'python3', f'{nb.name}: no python3 kernelspec (Jupyter would ask which kernel to use)'

def test_exported_code_fits_in_120_columns():
    long = [f'{p.name}:{i}' for p in sorted((ROOT/'legalnb').glob('*.py')) if p.name != '_modidx.py'
            for i, line in enumerate(p.read_text(encoding='utf-8').splitlines(), 1)
            if len(line) > 120 and not line.startswith('__all__')]   # nbdev writes __all__ (wrapped at 120, then indented)
    assert not long, f'{len(long)} exported lines are over 120 characters: {long[:10]}'

def test_the_sidebar_lists_every_notebook_in_its_numbered_order():
    "The docs' sidebar is the notebooks' numbered order (which tests/test_imports.py makes the import order too)."
    import yaml
    def pages(contents):
        for c in contents: yield from pages(c['contents']) if isinstance(c, dict) else [c]
    listed = list(pages(yaml.safe_load((ROOT/'_quarto.yml').read_text())['website']['sidebar']['contents']))
    numbered = sorted(p.name for p in (ROOT/'nbs').glob('[0-9]*.ipynb'))
    assert listed == ['index.ipynb', *numbered], listed
