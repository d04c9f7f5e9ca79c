"""`bench/gpu_check.py --dry-run`: every check of the GPU check at toy size on the CPU, each in its own process, into a
report whose structure and values are asserted, so that the script cannot rot between GPU sessions. Also: a missing
optional package is a skip naming it, a check over its cap is stopped (with what it started) while the others run,
carried wheels are installed offline, and the calculator reads the report (`legalnb estimate --calibration`)."""
import base64, hashlib, json, os, re, subprocess, sys, zipfile
from pathlib import Path

import pytest

from conftest import ENV, ROOT
from legalnb.calculator import GpuCheck, Plan, estimate, estimate_memory, measured_activation_bytes, read_gpu_check
from legalnb.cli import main as cli

CHECKS = ['environment', 'train-resonance', 'train-gpt', 'long-resonance-8k', 'long-gpt-8k', 'long-resonance-32k',
          'long-gpt-32k', 'generate', 'evaluate', 'hf-full', 'hf-lora', 'hf-qlora', 'torchrun-ddp', 'torchrun-fsdp',
          'deepspeed-zero3', 'recall-1k', 'recall-4k', 'compile-resonance', 'compile-gpt']
FIXTURE = ROOT/'tests'/'fixtures'/'gpu_check_dry_run.json'


def gpu_check(out: Path, *args, env=None) -> subprocess.CompletedProcess:
    "`python bench/gpu_check.py --dry-run --out OUT ARGS` from the checkout, as a user runs it."
    return subprocess.run([sys.executable, 'bench/gpu_check.py', '--dry-run', '--out', str(out), *map(str, args)],
                          cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope='module')
def dry(tmp_path_factory):
    "The whole dry run, once: its folder, its report and its process."
    out = tmp_path_factory.mktemp('gpu')/'gpu-check'
    # tests/cpu_deepspeed: DeepSpeed's CPU-only shared-memory inference all-reduce is not compiled (~80 CPU-s of g++)
    p = gpu_check(out, env={**ENV, 'PYTHONPATH': os.pathsep.join([str(ROOT/'tests'/'cpu_deepspeed'), str(ROOT)])})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, json.loads((out/'report.json').read_text()), p


def test_every_check_is_reported_with_its_status_cap_time_and_numbers(dry):
    out, r, p = dry
    assert r['kind'] == 'gpu-check' and r['dry_run'] is True and r['schema'] == 1
    assert list(r['checks']) == CHECKS, 'every check, in the order they ran'
    for name, c in r['checks'].items():
        assert c['status'] in ('pass', 'skip'), f"{name}: {c['status']} {c['notes']}"
        assert c['cap_s'] > 0 and c['about']
        if c['status'] == 'pass': assert c['numbers'] and 0 < c['seconds'] <= c['timeout_s'] + 5 and c['timeout_s'] <= c['cap_s']
        else: assert 'not installed' in c['notes'][0] or name == 'hf-qlora' and 'bitsandbytes' in c['notes'][0]
    assert r['summary']['pass'] + r['summary']['skip'] == len(CHECKS) and r['summary']['fail'] == 0
    assert f"{r['summary']['pass']} passed, 0 failed" in p.stdout
    assert not (out/'work').exists(), 'the runs are removed after the report (--keep-work keeps them)'
    assert sorted(f.name for f in (out/'logs').iterdir()) == sorted(f'{n}.log' for n in CHECKS
                                                                    if r['checks'][n]['status'] == 'pass')
    env = r['environment']
    assert env['torch'] and env['packages']['transformers'] and env['gpu'] is None and env['matmul_tflops'] > 0
    print(f"dry run: {r['elapsed_s']:.0f} s; " + ', '.join(f"{n} {c['seconds']:.0f} s" for n, c in r['checks'].items()))


def test_native_training_measures_speed_loss_and_memory_against_the_calculator(dry):
    _, r, _ = dry
    for model in ('resonance', 'gpt'):
        n = r['checks'][f'train-{model}']['numbers']
        assert n['model'] == model and n['tokens_per_sec'] > 0 and n['loss_last'] < n['loss_first']
        assert n['mfu'] is None, 'no MFU on a CPU: no dense peak to divide by'
        assert n['peak_gib'] > 0 and n['predicted_gib'] > 0
        assert n['memory_ratio'] == pytest.approx(n['peak_gib'] / n['predicted_gib'])
        cal = r['checks'][f'train-{model}']['calibration']
        plan = Plan(**cal['plan'])
        assert (plan.seq_len, plan.micro_batch, plan.precision) == (64, 2, 'fp32') and plan.layers == 1
        assert estimate_memory(plan).total / 2**30 == pytest.approx(n['predicted_gib'])
        assert measured_activation_bytes(plan, cal['peak_bytes'], cal['params']) == pytest.approx(n['activation_bytes'])
    for model in ('resonance', 'gpt'):   # compiled: the first step holds the compilation; speed-up against eager
        n = r['checks'][f'compile-{model}']['numbers']
        assert n['compile_s'] > 0 and n['loss_last'] < n['loss_first']
        assert n['speedup'] == pytest.approx(n['tokens_per_sec'] / r['checks'][f'train-{model}']['numbers']['tokens_per_sec'])


def test_long_context_compares_resonance_with_gpt(dry):
    _, r, _ = dry
    for k, L in (('8k', 128), ('32k', 256)):
        a, b = (r['checks'][f'long-{m}-{k}']['numbers'] for m in ('resonance', 'gpt'))
        assert a['seq_len'] == b['seq_len'] == L and a['batch'] == 1
        assert a['tokens_per_sec_over_gpt'] == pytest.approx(a['tokens_per_sec'] / b['tokens_per_sec'])
        assert a['peak_over_gpt'] == pytest.approx(a['peak_gib'] / b['peak_gib'])


def test_generation_and_evaluation(dry):
    _, r, _ = dry
    g = r['checks']['generate']['numbers']
    assert g['same_tokens'] is True and g['compared_tokens'] == 3 and g['prompt'] == 128
    assert g['speedup'] == pytest.approx(g['recompute_ms_per_token'] / g['recurrent_ms_per_token'])
    e = r['checks']['evaluate']['numbers']
    assert e['tokens'] > 0 and e['ratio'] == pytest.approx(e['evaluate_tokens_per_sec'] / e['forward_tokens_per_sec'])


def test_hugging_face_path_full_lora_qlora(dry):
    _, r, _ = dry
    full, lora = r['checks']['hf-full']['numbers'], r['checks']['hf-lora']['numbers']
    assert full['lora_params'] is None and full['batches'].startswith('packed shards') and full['dtype'] == 'float32'
    assert 0 < lora['lora_params'] < lora['params'] == full['params'] and lora['batches'] == 'padding-free'
    for n in (full, lora): assert n['tokens_per_sec'] > 0 and n['steps'] == 3 and n['predicted_gib'] > 0
    q = r['checks']['hf-qlora']
    if q['status'] == 'pass':
        assert r['checks']['hf-qlora']['calibration']['plan']['qlora'] is True
    else: assert 'bitsandbytes' in q['notes'][0]


def test_launchers_train_save_and_resume(dry):
    _, r, _ = dry
    ddp, fsdp = r['checks']['torchrun-ddp']['numbers'], r['checks']['torchrun-fsdp']['numbers']
    for n in (ddp, fsdp):
        assert (n['first_exit'], n['resume_exit'], n['checkpoint'], n['resumed_from'], n['step'], n['world_size']) \
            == (0, 0, True, 2, 3, 1)
    assert fsdp['sharded'] and not ddp['sharded'], 'one rank under torchrun shards with FSDP2'
    ds = r['checks']['deepspeed-zero3']
    if ds['status'] == 'pass':
        n = ds['numbers']
        assert (n['distributed'], n['resumed_from'], n['steps'], n['zero3_sharded_at_load']) == \
            ('DEEPSPEED', 'checkpoint-2', 3, True)
    else: assert ds['notes'] == ['deepspeed not installed']


def test_recall_at_two_lengths(dry):
    _, r, _ = dry
    for k, L in (('1k', 64), ('4k', 128)):
        n = r['checks'][f'recall-{k}']['numbers']
        assert n['seq_len'] == L and 0 <= n['resonance_acc'] <= 1 and 0 <= n['gpt_acc'] <= 1


def test_report_md_names_the_machine_every_check_and_the_calculator_table(dry):
    out, r, _ = dry
    md = (out/'report.md').read_text()
    assert md.startswith('# legalnb GPU check (DRY RUN on the CPU') and f"torch {r['environment']['torch']}" in md
    for name in CHECKS: assert f'| {name} ' in md
    assert '## The calculator against the measurements' in md and re.search(r'\| hf-full +\| +hf-llama +\| +64 \|', md)


def test_the_calculator_reads_the_report(dry, capsys):
    out, r, _ = dry
    g = read_gpu_check(out/'report.json')
    assert isinstance(g, GpuCheck) and g.dry_run and g.gpu is None
    assert {m.check for m in g.runs} == {n for n, c in r['checks'].items() if c.get('calibration') and c['status'] == 'pass'}
    m = g.nearest('resonance', 100)
    assert m.check == 'long-resonance-8k', '128 tokens is nearer 100 than 64 or 256 (by ratio)'
    plan, lines, warnings = g.calibrate(Plan(steps=10, seq_len=128, params=1e6, layers=1, d_model=32), 'resonance')
    assert plan.activation_bytes == pytest.approx(m.activation_bytes) and 'long-resonance-8k' in plan.activation_source
    assert lines == [] and any('CPU dry run' in w for w in warnings), 'no MFU on a CPU; the dry run is said'
    flags = ['estimate', '--calibration', str(out/'report.json'), '--model-size', 'small', '--seq-len', '2048',
             '--steps', '100', '--gpu', 'h100-sxm']
    assert cli(flags) == 0
    table = capsys.readouterr().out   # 2,048 tokens: the run at 256 is the nearest by ratio
    assert f'B × 1 × 2,048 × 768 (no checkpointing; measured: long-resonance-32k of {out/"report.json"}: resonance at 256 tokens on a CPU (dry run)' in table
    assert cli(flags + ['--json']) == 0
    j = json.loads(capsys.readouterr().out)
    plain = estimate(Plan(**{**r['checks']['train-resonance']['calibration']['plan'], 'activation_bytes': None}))
    assert j['memory_gib'] > 0 and any('CPU dry run' in w for w in j['warnings']) and plain.memory.total > 0
    assert cli(['estimate', '--calibration', str(out/'report.md'), '--steps', '10']) == 2
    assert "--calibration" in capsys.readouterr().err


def test_the_fixture_is_a_dry_run_report():
    g = read_gpu_check(FIXTURE)
    assert g.dry_run and {m.model for m in g.runs} == {'resonance', 'gpt', 'hf-llama'}


def test_a_missing_package_is_a_skip_naming_it(tmp_path):
    "On a machine without bitsandbytes and deepspeed (hidden here by an import hook) their checks are skipped."
    hook = tmp_path/'hook'; hook.mkdir()
    (hook/'sitecustomize.py').write_text(
        'import sys\n'
        'class Hidden:\n'
        '    def find_spec(self, name, path=None, target=None):\n'
        '        if name.split(".")[0] in ("bitsandbytes", "deepspeed"): raise ModuleNotFoundError(name)\n'
        'sys.meta_path.insert(0, Hidden())\n')
    env = {**ENV, 'PYTHONPATH': f'{hook}{os.pathsep}{ENV["PYTHONPATH"]}'}
    p = gpu_check(tmp_path/'out', '--only', 'hf-qlora', 'deepspeed-zero3', env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path/'out'/'report.json').read_text())
    assert list(r['checks']) == ['environment', 'hf-qlora', 'deepspeed-zero3'], 'the environment is always reported'
    assert r['checks']['hf-qlora']['status'] == r['checks']['deepspeed-zero3']['status'] == 'skip'
    assert r['checks']['hf-qlora']['notes'] == ['bitsandbytes not installed']
    assert r['checks']['deepspeed-zero3']['notes'] == ['deepspeed not installed']
    assert r['environment']['packages']['deepspeed'] is not None, 'installed, but not importable here'


def test_a_check_over_its_cap_is_stopped_with_what_it_started_and_the_others_run(tmp_path):
    out = tmp_path/'out'
    p = gpu_check(out, '--only', 'torchrun-ddp', 'recall-1k', '--cap', 'torchrun-ddp=6')
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((out/'report.json').read_text())
    c = r['checks']['torchrun-ddp']
    assert c['status'] == 'timeout' and c['cap_s'] == 6 and c['notes'] == ['stopped at its cap of 6 s']
    assert 6 <= c['seconds'] < 16 and r['checks']['recall-1k']['status'] == 'pass', 'the next check ran'
    left = [d for d in Path('/proc').iterdir() if d.name.isdigit() and str(out) in _cmdline(d)]
    assert not left, 'torchrun and its worker were ended with the check'
    assert gpu_check(tmp_path/'bad', '--cap', 'compile=5').returncode == 2


def bench_gpu_check(monkeypatch):
    "bench/gpu_check.py as a module, as `python bench/gpu_check.py` finds its helpers."
    import importlib.util
    monkeypatch.syspath_prepend(str(ROOT/'bench'))
    spec = importlib.util.spec_from_file_location('bench_gpu_check', ROOT/'bench'/'gpu_check.py')
    gc = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, 'bench_gpu_check', gc)   # its dataclasses look their module up
    spec.loader.exec_module(gc)
    return gc


def test_a_build_lock_left_by_an_ended_check_is_found(monkeypatch, tmp_path):
    "DeepSpeed JIT-builds its CPU ops; a check ended mid-build leaves torch's build lock, which would hang every later "
    "DeepSpeed start on the machine: the locks made during the check are found (and removed after a timeout)."
    import time
    gc = bench_gpu_check(monkeypatch)
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', str(tmp_path))
    old = tmp_path/'py311_cpu'/'older_op'/'lock'; old.parent.mkdir(parents=True); old.touch()
    os.utime(old, (time.time() - 3600,) * 2)
    t = time.time()
    new = tmp_path/'py311_cpu'/'deepspeed_shm_comm'/'lock'; new.parent.mkdir(parents=True); new.touch()
    assert gc.build_locks_since(t) == [new]


def test_end_tree_ends_processes_in_sessions_of_their_own(monkeypatch):
    "torchrun starts its workers in new sessions: ending a check's process group alone would leave them running."
    import time
    gc = bench_gpu_check(monkeypatch)
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "start_new_session=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, '-c', code])
    for _ in range(200):
        if (kids := gc.descendants(p.pid)): break
        time.sleep(0.05)
    assert kids and os.getsid(kids[0]) != os.getsid(p.pid), 'the grandchild runs in a session of its own'
    gc.end_tree(p.pid); p.wait(timeout=10)
    time.sleep(0.5)
    assert all(_state(k) in (None, 'Z') for k in kids), 'killed (gone, or a zombie waiting for init)'


def _state(pid: int) -> str | None:
    try: return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    except OSError: return None


def _cmdline(proc: Path) -> str:
    try: return (proc/'cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
    except OSError: return ''


def test_carried_wheels_are_installed_offline_and_importable_in_every_check(tmp_path):
    wheels = tmp_path/'wheels'; wheels.mkdir()
    files = {'gpucheckprobe/__init__.py': 'VALUE = 42\n',
             'gpucheckprobe-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: gpucheckprobe\nVersion: 1.0\n',
             'gpucheckprobe-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n'
                                                  'Tag: py3-none-any\n'}
    digest = lambda t: base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()
    files['gpucheckprobe-1.0.dist-info/RECORD'] = ''.join(f'{k},sha256={digest(v)},{len(v)}\n' for k, v in files.items()) \
        + 'gpucheckprobe-1.0.dist-info/RECORD,,\n'
    with zipfile.ZipFile(wheels/'gpucheckprobe-1.0-py3-none-any.whl', 'w') as z:
        for k, v in files.items(): z.writestr(k, v)
    p = gpu_check(tmp_path/'out', '--only', 'environment', '--wheels', wheels)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path/'out'/'report.json').read_text())
    assert r['wheels'] == ['gpucheckprobe-1.0-py3-none-any.whl']
    assert r['environment']['wheel_modules'] == {'gpucheckprobe': True}
    empty = tmp_path/'empty'; empty.mkdir()
    p = gpu_check(tmp_path/'out2', '--wheels', empty)
    assert p.returncode != 0 and f'--wheels {empty}: no .whl files there' in p.stderr


def test_without_fastcore_it_says_how_to_carry_it(tmp_path):
    hook = tmp_path/'hook'; hook.mkdir()
    (hook/'sitecustomize.py').write_text(
        'import sys\n'
        'class Hidden:\n'
        '    def find_spec(self, name, path=None, target=None):\n'
        '        if name.split(".")[0] == "fastcore": raise ModuleNotFoundError(name)\n'
        'sys.meta_path.insert(0, Hidden())\n')
    p = gpu_check(tmp_path/'out', env={**ENV, 'PYTHONPATH': f'{hook}{os.pathsep}{ENV["PYTHONPATH"]}'})
    assert p.returncode != 0 and 'legalnb needs fastcore' in p.stderr and '--wheels' in p.stderr
    assert not (tmp_path/'out'/'report.json').exists()


def test_out_is_checked_before_anything_is_touched_and_a_users_files_are_never_deleted(tmp_path):
    "The GPU check writes like every command: a folder holding the user's logs/, work/, site/ or report.md (its own "
    "names, not its files) and a file as --out are refused in one line, every byte kept, before anything runs."
    user = tmp_path/'mine'
    for rel, text in (('report.md', 'my report'), ('logs/today.log', 'my log'), ('work/draft.txt', 'my work'),
                      ('site/index.html', '<p>my site</p>')):
        (user/rel).parent.mkdir(parents=True, exist_ok=True); (user/rel).write_text(text)
    (tmp_path/'file.txt').write_text('my notes')
    before = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    for out, said in ((user, f'--out {user} holds files legalnb did not write (logs/today.log, report.md, '
                             'site/index.html and 1 more)'),
                      (tmp_path/'file.txt', f'--out {tmp_path/"file.txt"} is not a folder')):
        p = gpu_check(out, '--only', 'environment')
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and 'Traceback' not in p.stderr, p.stderr[-2000:]
        assert said in lines[0], lines[0]
    assert {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()} == before, 'nothing deleted or replaced'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file.txt', 'mine'], 'no lock or folder left'


def test_its_own_folder_is_written_again_but_a_users_file_in_it_is_not_deleted(tmp_path):
    "A folder the GPU check wrote (by its records) is run again, its old logs replaced; a file the user put in its "
    "logs/ stops it, kept."
    out = tmp_path/'gpu-check'
    assert gpu_check(out, '--only', 'environment').returncode == 0
    first = json.loads((out/'report.json').read_text())['date']
    (out/'logs'/'mine.txt').write_text('my notes')
    p = gpu_check(out, '--only', 'environment')
    assert p.returncode == 2 and f'--out {out} holds files legalnb did not write (logs/mine.txt)' in p.stderr, p.stderr
    assert (out/'logs'/'mine.txt').read_text() == 'my notes'
    assert json.loads((out/'report.json').read_text())['date'] == first, 'its report not replaced either'
    (out/'logs'/'mine.txt').unlink()
    assert gpu_check(out, '--only', 'environment').returncode == 0
    assert sorted(p.name for p in (out/'logs').iterdir()) == ['environment.log']
