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

@pytest.mark.parametrize('env', [{}, {'LOCAL_RANK': '1', 'RANK': '1', 'WORLD_SIZE': '2'}])
def test_the_command_exits_with_its_code_and_all_its_output(env, tmp_path):
    "As a rank of a launched run the process skips the interpreter's teardown (`exit_process`): its code and every "
    "line it wrote still arrive."
    import os, subprocess, sys
    from legalnb import __version__
    env = {**os.environ, **env}
    for argv, code, out, err in [(['--version'], 0, __version__, ''), (['nosuch'], 2, '', "unknown command 'nosuch'")]:
        p = subprocess.run([sys.executable, '-m', 'legalnb.cli', *argv], env=env, capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
        assert (p.returncode, p.stdout.strip()) == (code, out) and err in p.stderr, p
