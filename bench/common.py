"""What the bench scripts share: the hardware line, the header with the date, markdown tables, and running a
documented function as the script's command.

A bench script declares its flags once, as the parameters of its `main` function with a comment on each (the
docments style of `legalnb.options.command_parser`, the same helper the `legalnb` commands use), and ends with
`if __name__ == '__main__': sys.exit(run(main))`. Each prints `header(__file__)` first, then its table.
"""
from __future__ import annotations
import inspect, os, platform, sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from legalnb.core import LegalnbError
from legalnb.options import command_parser
from legalnb.core import markdown_table as core_markdown_table


def cpu_name() -> str:
    "The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` knows."
    try:
        with open('/proc/cpuinfo') as f:
            return next(l.split(':', 1)[1].strip() for l in f if l.startswith('model name'))
    except (OSError, StopIteration): return platform.processor() or platform.machine()


def memory_gib() -> float:
    "Physical memory in GiB."
    try: return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    except (ValueError, OSError, AttributeError): return float('nan')


def _torch() -> str | None:
    "torch's version, its CPU threads and the GPU, when the script has imported torch (importing it costs seconds)."
    torch = sys.modules.get('torch')
    if torch is None: return None
    gpu = f'GPU {torch.cuda.get_device_name()}' if torch.cuda.is_available() else 'no GPU'
    threads = torch.get_num_threads()
    return f'torch {torch.__version__} ({threads} thread{"s" * (threads != 1)}, {gpu})'


def hardware(*packages: str) -> str:
    "One line for the record: CPU, cores, memory, load, OS, Python, torch when loaded, and the versions of `packages`."
    parts = [f'Python {platform.python_version()}', _torch()]
    for name in packages:
        try: parts.append(f'{name} {version(name)}')
        except PackageNotFoundError: parts.append(f'{name} not installed')
    return (f'{cpu_name()}, {os.cpu_count()} cores, {memory_gib():.0f} GiB RAM, load {os.getloadavg()[0]:.1f}, '
            f'{platform.system()} {platform.release()}; ' + ', '.join(p for p in parts if p))


def header(script: str, *packages: str) -> None:
    "Print the two lines every table starts with: the script and the date (UTC), then `hardware(*packages)`."
    print(f'# bench/{Path(script).name}  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC')
    print(f'# {hardware(*packages)}')


def markdown_table(columns: list[str], rows: list[list], align: str | None = None) -> str:
    "`legalnb.core.markdown_table`, a None cell printed empty."
    return core_markdown_table(columns, rows, align, empty='')


def run(main: Callable,               # the script's function: its parameters, with their comments, are the flags
        argv: list[str] | None = None  # the arguments (default: the command line)
        ) -> int:
    "Parse the flags `main` declares and call it; a bad flag (or a LegalnbError) is one line on stderr and exit 2."
    prog = f'bench/{Path(inspect.getfile(main)).name}'
    try: return main(**vars(command_parser(main, prog).parse_args(sys.argv[1:] if argv is None else argv))) or 0
    except LegalnbError as e:
        print(f'{prog}: error: {e}', file=sys.stderr)
        return 2
