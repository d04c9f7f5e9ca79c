"""The `legalnb` command: every flag a command had before the commands were declared from documented functions is
still there, help is generated (defaults shown once), and bad flags give one line."""
import json, re
from pathlib import Path

import pytest

from legalnb.cli import COMMANDS, main

FLAGS = json.loads((Path(__file__).parent/'fixtures'/'cli_flags.json').read_text())

def help_flags(cmd: str, capsys) -> set[str]:
    "The option strings `legalnb CMD --help` lists in its options column."
    with pytest.raises(SystemExit) as e: main([cmd, '--help'])
    assert e.value.code == 0
    columns = [m.group(1) for line in capsys.readouterr().out.splitlines() if (m := re.match(r'\s+(-.*?)(?:\s{2,}|$)', line))]
    return {f for col in columns for f in re.findall(r'(?<![\w-])--?[A-Za-z][\w-]*', col)}

@pytest.mark.parametrize('cmd', sorted(COMMANDS))
def test_every_flag_is_kept(cmd, capsys):
    missing = set(FLAGS[cmd]) - help_flags(cmd, capsys)
    assert not missing, f'legalnb {cmd} lost flags {sorted(missing)}'

def test_every_command_has_its_recorded_flags():
    assert sorted(FLAGS) == sorted(COMMANDS)

@pytest.mark.parametrize('argv,expect', [
    (['quickstart', '--steps', 'many'], "--steps: expected a whole number, got 'many'; see legalnb quickstart --help"),
    (['quickstart', '--device', 'tpu'], "--device: invalid choice: 'tpu'"),
    (['quickstart', '--no-such-flag'], 'unrecognized arguments: --no-such-flag'),
])
def test_bad_flags_are_one_line(argv, expect, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err
