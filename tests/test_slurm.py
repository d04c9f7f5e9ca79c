"""`legalnb slurm`: the batch scripts for train (torchrun) and finetune (accelerate launch) pass `bash -n`, ask SLURM
for what the flags say, and, run by bash as sbatch would on a 2-node job with stand-ins for srun, scontrol, torchrun
and accelerate (srun runs its command once per node with that node's SLURM_NODEID; the launchers record the arguments
they were given), start on every node the launcher that torch's and accelerate's own parsers read as nodes x GPUs
meeting at the first node and running the legalnb command with its flags, which legalnb's own parser reads back."""
import json, os, shlex, subprocess, sys
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.commands import command_settings

NODES = ['gpu-7', 'gpu-8']
STANDINS = {
    'srun': '#!/bin/bash\nfor ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@"; done\n',
    # one name at a time, as scontrol writes them: a reader that stops at the first (head -n1) gets the job killed by
    # SIGPIPE under `set -o pipefail`, every time rather than now and then
    'scontrol': '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && [ -n "$3" ] && for n in ' + ' '.join(NODES) +
                '; do echo $n; sleep 0.05; done\n',
    'torchrun': f'#!{sys.executable}\nimport json, os, sys\nopen(os.environ["RECORD"], "a").write(json.dumps('
                '[os.environ.get("SLURM_NODEID"), sys.argv[1:]]) + "\\n")\n'}
STANDINS['accelerate'] = STANDINS['torchrun']

@pytest.fixture
def cluster(tmp_path):
    "A folder of stand-ins (the job's --bin-dir, first on its PATH) and the run of a job script as sbatch would run it."
    bin_dir = tmp_path/'bin'; bin_dir.mkdir()
    for name, text in STANDINS.items(): (bin_dir/name).write_text(text); (bin_dir/name).chmod(0o755)
    def run(job: Path) -> list[tuple[str, list[str]]]:
        record = tmp_path/'launched.jsonl'
        env = {**os.environ, 'SLURM_JOB_NODELIST': 'gpu-[7-8]', 'SLURM_NNODES': '2', 'SLURM_JOB_ID': '4242',
               'RECORD': str(record)}
        p = subprocess.run(['bash', job], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return [tuple(json.loads(l)) for l in record.read_text().splitlines()]
    return bin_dir, run

def sbatch_lines(job: Path) -> dict[str, str]:
    return dict(l.removeprefix('#SBATCH --').split('=', 1) for l in job.read_text().splitlines() if l.startswith('#SBATCH'))

def write(tmp_path, command: str, flags: list[str], args: list[str]) -> Path:
    job = tmp_path/'job.slurm'
    assert main(['slurm', command, *flags, '-o', job, '--', *args]) == 0
    assert subprocess.run(['bash', '-n', job]).returncode == 0, 'bash reads it'
    return job

def test_train_runs_torchrun_on_every_node_meeting_at_the_first(tmp_path, cluster):
    from torch.distributed.run import get_args_parser
    bin_dir, run = cluster
    args = ['--data', 'split', '--size', 'medium', '--preset', 'fast', '--out', 'run dir']
    job = write(tmp_path, 'train', ['--nodes', '2', '--gpus-per-node', '4', '--time', '1-12:00:00', '--partition', 'gpu',
                                    '--account', 'lab-7', '--bin-dir', bin_dir], args)
    assert sbatch_lines(job) == {'job-name': 'legalnb-train', 'nodes': '2', 'ntasks-per-node': '1', 'gpus-per-node': '4',
                                 'cpus-per-task': '32', 'time': '1-12:00:00', 'partition': 'gpu', 'account': 'lab-7',
                                 'output': '%x-%j.out'}
    srun = shlex.split(job.read_text().split('\n\n')[-1].replace('\\\n', ' '))
    assert srun[:2] == ['srun', 'torchrun'] and srun[srun.index('-m'):] == ['-m', 'legalnb.cli', 'train', *args]
    launched = run(job)
    assert [node for node, _ in launched] == ['0', '1'], 'one torchrun per node'
    for _, argv in launched:
        t = get_args_parser().parse_args(argv)
        assert (t.nnodes, t.nproc_per_node, t.rdzv_backend, t.rdzv_endpoint, t.rdzv_id) == \
               ('2', '4', 'c10d', 'gpu-7:29500', '4242'), argv
        assert t.module and t.training_script == 'legalnb.cli' and t.training_script_args == ['train', *args]
        assert command_settings('train', t.training_script_args[1:])['out'] == 'run dir'

def test_finetune_runs_accelerate_on_every_node_with_its_rank(tmp_path, cluster):
    from accelerate.commands.launch import launch_command_parser
    from legalnb.hf import launch_environment
    bin_dir, run = cluster
    (tmp_path/'corpus').mkdir()   # a corpus folder: continued pretraining, whose preset spreads with ZeRO-3
    args = ['--model', '/models/my-7b', '--data', str(tmp_path/'corpus'), '--preset', 'fast', '--full', '--out', 'cpt']
    job = write(tmp_path, 'finetune', ['--nodes', '2', '--gpus-per-node', '4', '--port', '29611', '--bin-dir', bin_dir],
                args)
    assert sbatch_lines(job)['job-name'] == 'legalnb-finetune' and 'partition' not in sbatch_lines(job)
    launched = run(job)
    assert [node for node, _ in launched] == ['0', '1'], 'one accelerate launch per node'
    for node, argv in launched:
        assert argv[0] == 'launch'
        a = launch_command_parser().parse_args(argv[1:])
        assert (a.num_machines, a.machine_rank, a.main_process_ip, a.main_process_port, a.num_processes) == \
               (2, int(node), 'gpu-7', 29611, 8), argv
        assert a.use_deepspeed and a.zero_stage == 3 and a.deepspeed_multinode_launcher == 'standard'
        assert a.module and a.training_script == 'legalnb.cli' and a.training_script_args == ['finetune', *args]
        # accelerate's own launcher takes the flags together, as it would on the node
        assert launch_environment(argv[1:argv.index('-m')])['ACCELERATE_USE_DEEPSPEED'] == 'true'

def test_lora_finetune_spreads_with_ddp_and_a_given_strategy_wins(tmp_path, cluster):
    bin_dir, run = cluster
    (tmp_path/'examples.jsonl').write_text('{"text": "x"}\n')
    args = ['--model', 'm', '--data', str(tmp_path/'examples.jsonl'), '--out', 'sft']
    argv = run(write(tmp_path, 'finetune', ['--bin-dir', bin_dir], args))[0][1]
    assert '--multi_gpu' in argv and '--num_processes' in argv and argv[argv.index('--num_processes') + 1] == '16'
    job = tmp_path/'fsdp.slurm'
    assert main(['slurm', 'finetune', '--strategy', 'fsdp', '--bin-dir', bin_dir, '-o', job, '--', *args]) == 0
    argv = run(job)[-1][1]
    assert '--use_fsdp' in argv and argv[argv.index('--fsdp_version') + 1] == '2'

@pytest.mark.parametrize('argv,says', [
    (['train', '--', '--data', 'split'], 'legalnb train needs --out: give it after --'),
    (['train', '--', '--data', 'split', '--out', 'r', '--max-steps', 'lots'],
     "the flags of legalnb train after --: --max-steps: expected a whole number, got 'lots'"),
    (['evaluate', '--', '--data', 'x'], "invalid choice: 'evaluate'"),
    (['train', '--time', '3 days', '--', '--data', 'split', '--out', 'r'], "--time '3 days': expected MINUTES"),
    (['finetune', '--', '--model', 'm', '--data', 'nowhere', '--out', 'r'], '--data nowhere: not found here'),
])
def test_a_job_that_would_fail_on_the_cluster_is_refused_in_one_line(argv, says, capsys, tmp_path):
    assert main(['slurm', *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err

def test_an_existing_script_is_replaced_only_with_overwrite(tmp_path, capsys):
    job = tmp_path/'job.slurm'; job.write_text('#!/bin/bash\n# my own job\n')
    argv = ['slurm', 'train', '-o', job, '--', '--data', 'split', '--out', 'run']
    assert main(argv) == 2 and job.read_text() == '#!/bin/bash\n# my own job\n'
    assert f'-o {job}: exists; pass --overwrite to replace it' in capsys.readouterr().err
    assert main([*argv[:2], '--overwrite', *argv[2:]]) == 0 and 'legalnb.cli train' in job.read_text()
    assert f'submit it with  sbatch {job}' in capsys.readouterr().out
    assert main(['slurm', 'train', '--', '--data', 'split', '--out', 'run']) == 0, 'no -o: printed'
    assert capsys.readouterr().out.startswith('#!/bin/bash\n')
