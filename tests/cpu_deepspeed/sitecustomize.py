"""Test processes that run DeepSpeed on the CPU skip the build of its shared-memory all-reduce.

DeepSpeed's CPU backend JIT-compiles `deepspeed_shm_comm` (two C++ files against torch's headers: ~80 CPU-seconds of
g++ on a clean machine, once per checkout path) when its communication starts. Only `inference_all_reduce` calls it
(deepspeed/comm/torch.py); ZeRO training all-reduces through torch.distributed (gloo) with or without it. A test puts
this folder first on PYTHONPATH of the processes it starts (tests/test_hf.py, tests/test_gpu_check.py); users' runs
and GPU runs are unchanged. Should DeepSpeed move the call, nothing is skipped and the tests only take longer."""
import importlib.abc, importlib.machinery, sys


class _NoShmBuild(importlib.abc.MetaPathFinder):
    "When `deepspeed.comm.torch` loads, its `build_shm_op` returns None, as it does where the op is not compatible."
    def find_spec(self, name, path, target=None):
        if name != 'deepspeed.comm.torch': return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, 'exec_module'): return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            if hasattr(module, 'build_shm_op'): module.build_shm_op = lambda: None
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoShmBuild())
