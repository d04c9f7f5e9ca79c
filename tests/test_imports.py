"The house's one rule of imports: a module imports only modules whose notebook comes before its own."
import ast, re
from pathlib import Path

import pytest

import legalnb

PACKAGE = Path(legalnb.__file__).parent


def notebook_of(module: Path) -> str:
    "The notebook a module is exported from (its header says which)."
    m = re.search(r'File to edit: \.\./nbs/(\S+)\.ipynb', module.read_text(encoding='utf-8'))
    assert m, f'{module.name}: no "File to edit" header'
    return m[1]


MODULES = {p.stem: notebook_of(p) for p in sorted(PACKAGE.glob('*.py'))
           if p.stem not in ('__init__', '_modidx')}


def imported(module: Path) -> set[str]:
    "The legalnb modules a module imports, at the top or inside a function."
    names = set()
    for node in ast.walk(ast.parse(module.read_text(encoding='utf-8'))):
        if isinstance(node, ast.ImportFrom):
            name = node.module or ''
            if node.level: names.add(name.split('.')[0])
            elif name.startswith('legalnb.'): names.add(name.split('.')[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split('.')[1] for a in node.names if a.name.startswith('legalnb.')}
    return names & set(MODULES)


@pytest.mark.parametrize('name', sorted(MODULES))
def test_a_module_imports_only_from_earlier_notebooks(name):
    later = sorted(m for m in imported(PACKAGE/f'{name}.py') if MODULES[m] >= MODULES[name])
    assert not later, (f'{name} ({MODULES[name]}.ipynb) imports {", ".join(later)}, whose notebook(s) '
                       f'{", ".join(MODULES[m] for m in later)} do not come before it')


def test_the_rule_sees_function_level_imports():
    "The check reads imports inside functions too (a lazy import is still an import back up)."
    assert 'models' in imported(PACKAGE/'data.py') and 'against' not in imported(PACKAGE/'evaluate.py')
    assert {'run', 'evaluate', 'compare'} <= imported(PACKAGE/'cli.py')
