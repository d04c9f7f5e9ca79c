"""The plans users are shown, run as written (issue 51): the README's (`legalnb run --write-plan > plan.yaml`, then
its quick trial), the notebooks' plan files and the quickstart's plan. A plan that stops working, or a flag of the
README's command lines that a stage no longer has, fails here."""
import contextlib, io, json, os, re, shlex
from pathlib import Path

import pytest

from legalnb.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_trial() -> list[str]:
    "The README's quick trial of a written plan (`legalnb run plan.yaml --build-corpus.seq-len 64 ...`), as words."
    text = ' '.join((ROOT/'README.md').read_text(encoding='utf-8').split())
    return shlex.split(text.split('a quick trial: `', 1)[1].split('`', 1)[0])


def notebook_plans() -> list[tuple[str, str]]:
    "Every plan file a notebook writes (`Path('plan.yaml').write_text('''...''')`): (notebook, its YAML)."
    found = []
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):
        for cell in json.loads(nb.read_text(encoding='utf-8'))['cells']:
            src = ''.join(cell['source'])
            found += [(nb.name, y) for y in re.findall(r"plan\.yaml'\)\.write_text\('''\\?\n(.*?)'''", src, re.S)]
    return found


def test_the_readme_plan_runs_its_quick_trial(tmp_path):
    "`legalnb run --write-plan > plan.yaml` as the README writes it, then the README's trial of it, on a sample."
    here = os.getcwd(); os.chdir(tmp_path)
    try:
        assert main(['sample', 'eurlex/formex', '--docs', '40']) == 0   # the written plan's input: eurlex/formex
        out = io.StringIO()
        with contextlib.redirect_stdout(out): assert main(['run', '--write-plan']) == 0
        Path('plan.yaml').write_text(out.getvalue())
        trial = readme_trial()
        assert trial[:3] == ['legalnb', 'run', 'plan.yaml'] and all('.' in w[2:] for w in trial if w.startswith('--')
                                                                   and w != '--yes'), trial   # dotted stage flags
        assert main(trial[1:]) == 0
    finally: os.chdir(here)
    report = (tmp_path/'work'/'report.md').read_text()
    assert '| train | `run/` | 10 steps' in report and 'bits per byte' in report, report


def test_every_notebook_plan_and_the_quickstarts_are_read_and_agree(tmp_path):
    "The notebooks' plan files and the quickstart's plan: read, their stages built, their values checked."
    from legalnb.cli import QuickstartConfig, quickstart_plan
    from legalnb.run import build_stages, check_plan, plan_of, read_plan
    plans = notebook_plans()
    assert [nb for nb, _ in plans] == ['28_run.ipynb'], plans   # a notebook that writes a new plan: tested here too
    for i, (nb, text) in enumerate(plans):
        (tmp_path/f'{i}.yaml').write_text(text)
        plan = read_plan(tmp_path/f'{i}.yaml')
        stages, top = build_stages(plan)
        check_plan(stages, top)
        assert [s.name for s in stages][-2:] == ['baseline', 'evaluate'], nb
    qs = plan_of(quickstart_plan(QuickstartConfig()) | {'input': ['sample'], 'out': 'qs', 'preset': 'none'})
    stages, top = build_stages(qs)
    check_plan(stages, top)
    assert next(s for s in stages if s.kind == 'train').config.max_steps == QuickstartConfig().steps


def test_a_new_config_field_is_a_plan_key_and_a_dotted_flag_with_no_edit_to_run(monkeypatch):
    "A field added to a stage's config dataclass: settable from a plan and from `legalnb run --STAGE.FIELD` at once."
    from dataclasses import dataclass
    from legalnb import commands, data, options, run
    from legalnb.data import SplitConfig

    @dataclass
    class SplitWithShuffle(SplitConfig):
        shuffle_seed: int = 7   # a new field: the seed of a shuffle before the split

    def clear():
        for f in (commands.command_flags, options._parser_of, run.run_parser): f.cache_clear()
    monkeypatch.setattr(data, 'SplitConfig', SplitWithShuffle)   # where the command table finds split's flags
    clear()
    try:
        plan = run.plan_of({'input': ['formex'], 'out': 'work', 'split': {'shuffle_seed': '3k'}})
        assert plan.sections['split'] == {'shuffle_seed': 3000}
        plan = run.with_command_line(plan, ['--split.shuffle-seed', '5'])
        split = next(s for s in run.build_stages(plan)[0] if s.kind == 'split')
        assert split.config.shuffle_seed == 5 and split.argv[-2:] == ['--shuffle-seed', '5']
        assert '  # shuffle_seed: 7' in run.write_plan()   # and in the plan --write-plan prints
        with pytest.raises(Exception, match="split.shuffle_seed: expected a whole number, got 'x'"):
            run.plan_of({'split': {'shuffle_seed': 'x'}})
    finally:
        monkeypatch.undo(); clear()
