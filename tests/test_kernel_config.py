"""The launch settings of the SSD and Mamba-3 kernels as data: the shape rules, the errors.
(No kernel runs here; every kernel test runs under these configs.)"""

import dataclasses

import pytest
import torch

from mambalearn.mamba2 import config as C
from mambalearn.mamba3 import config as m3
from mambalearn.utils import check_chunk_size


def test_the_walk_is_split_only_where_the_gpu_would_idle():
    # one Mamba-2 2.7B sequence (h80, 2 state tiles): 160 programs on 132 SMs, 5 slots each
    assert C.split_walk(160, 256, 132) == 4
    assert C.split_walk(320, 128, 132) == 1  # two segments would walk as long as one
    assert C.split_walk(160, 16, 132) == 1  # too few chunks for ≥ 3 segments of ≥ 8
    assert C.split_walk(640, 32, 132) == 1  # b4: the GPU is full already


def test_shape_rules_of_the_gpu_default():
    b1 = C.gpu_config((1, 32768, 80, 64, 1, 128, 128), sms=132)
    b8 = C.gpu_config((8, 4096, 80, 64, 1, 128, 128), sms=132)
    assert (b1.states.split, b8.states.split) == (4, 1)
    assert b1.outputs.loop and b1.outputs.block_k == 32  # chunk 128: the pipelined loop
    q256 = C.gpu_config((1, 32768, 80, 64, 1, 128, 256), sms=132)
    assert not q256.outputs.loop  # chunk 256: the one-tile diagonal
    assert C.head_splits(80, 40, 132) == 8 and C.head_splits(80, 20480, 132) == 1
    assert C.default_config((1, 64, 2, 8, 1, 8, 16), "cpu") is C.CPU


def test_configs_are_data_and_say_what_is_wrong():
    cfg = C.CPU.replace(states=dict(split=2), backward=dict(dx=dict(num_warps=2)))
    assert (cfg.states.split, cfg.backward.dx.num_warps, C.CPU.states.split) == (2, 2, 1)
    with pytest.raises(ValueError, match="config.states has no field splits"):
        C.CPU.replace(states=dict(splits=2))
    with pytest.raises(ValueError, match="backward.nsplit"):
        C.CPU.replace(backward=dict(nsplit=0))
    with pytest.raises(TypeError, match="config must be"):
        C.resolve(dict(chunk=128), (1, 64, 2, 8, 1, 8, 16), "cpu")
    with pytest.raises(ValueError, match="state_stages"):
        m3.DEFAULT.replace(state_stages=0)
    with pytest.raises(TypeError, match="config must be"):
        m3.resolve({}, None, torch.device("cpu"))


@pytest.mark.parametrize("bad,error", [(12, ValueError), (0, ValueError), (-8, ValueError),
                                       (2.0, TypeError), ("64", TypeError), (True, TypeError),
                                       (None, TypeError)])
def test_chunk_size_has_one_rule(bad, error):
    # the kernels' rule (a power of two); a non-int is a TypeError, a bad int a ValueError
    with pytest.raises(error, match="chunk_size"):
        check_chunk_size(bad, power_of_two=True)
    assert check_chunk_size(64, power_of_two=True) == 64
    assert check_chunk_size(16, power_of_two=True, minimum=16) == 16
    assert check_chunk_size(12) == 12  # the PyTorch scans take any length ≥ 1
    with pytest.raises(ValueError, match="≥ 16"):
        check_chunk_size(8, power_of_two=True, minimum=16)


# --- one config style: a frozen dataclass deriving from mambalearn.triton.config.LaunchConfig --
KERNEL_PACKAGES = ("mamba1", "mamba2", "mamba3", "triton")
LAUNCH_OPTIONS = {"num_warps", "num_stages", "maxnreg", "stream"}
# a model's hyperparameters (chapter 13's ModelConfig style), not launch settings
MODEL_CONFIGS = {"mambalearn.mamba3.mixer.Mamba3Config"}


def _kernel_modules():
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "mambalearn"
    for package in KERNEL_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield path, importlib.import_module(name)


def test_every_launch_setting_class_is_a_frozen_launch_config():
    """A class holding launch settings (named *Config, defined in a ``config`` module, or with a
    field such as num_warps) derives from LaunchConfig and is a frozen dataclass: no dict of
    settings, no other base, no mutable config."""
    import dataclasses
    import inspect

    from mambalearn.triton.config import LaunchConfig

    seen = []
    for _, module in _kernel_modules():
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ != module.__name__ or cls is LaunchConfig
                    or f"{module.__name__}.{name}" in MODEL_CONFIGS):
                continue
            fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(
                cls) else set()
            if (name.endswith("Config") or module.__name__.endswith(".config")
                    or fields & LAUNCH_OPTIONS or any(f.startswith("block_") for f in fields)):
                seen.append(f"{module.__name__}.{name}")
                assert issubclass(cls, LaunchConfig), \
                    f"{module.__name__}.{name}: not a LaunchConfig"
                assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, \
                    f"{module.__name__}.{name}: not a frozen dataclass"
    assert {"mambalearn.mamba1.config.Config", "mambalearn.mamba2.config.Config",
            "mambalearn.mamba3.config.Config", "mambalearn.mamba3.config.MimoConfig",
            "mambalearn.mamba2.step.StepConfig"} <= set(seen), seen


def test_no_launcher_takes_settings_as_a_dict_or_loose_keywords():
    """Settings travel as a config: no default is a dict (a literal or a module's dict), no
    module keeps launch settings in a dict (``X = dict(BLOCK_D=64, num_warps=4)``), no
    keyword-only launch option (``block_*``, ``num_warps``, ...) outside a @triton.jit kernel."""
    import ast

    def settings(value):  # the keys of a dict literal or a dict(...) call that are launch options
        if isinstance(value, ast.Dict):
            keys = [k.value for k in value.keys if isinstance(k, ast.Constant)]
        elif isinstance(value, ast.Call) and ast.unparse(value.func) == "dict":
            keys = [k.arg for k in value.keywords if k.arg]
        else:
            return []
        return [k for k in keys if isinstance(k, str)
                and (k in LAUNCH_OPTIONS or k.lower().startswith("block_"))]

    bad = []
    for path, module in _kernel_modules():
        tree = ast.parse(path.read_text())
        dicts = {n.targets[0].id for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Dict)}
        bad += [f"{module.__name__}.{ast.unparse(n.targets[0])}: launch settings in a dict "
                f"{settings(n.value)}" for n in tree.body
                if isinstance(n, ast.Assign) and settings(n.value)]
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("jit" in ast.unparse(d) for d in f.decorator_list):
                continue
            defaults = f.args.defaults + [d for d in f.args.kw_defaults if d is not None]
            if any(isinstance(d, ast.Dict) or isinstance(d, ast.Name) and d.id in dicts
                   for d in defaults):
                bad.append(f"{module.__name__}.{f.name}: a dict default")
            loose = [a.arg for a in f.args.kwonlyargs
                     if a.arg in LAUNCH_OPTIONS or a.arg.startswith("block_")]
            if loose:
                bad.append(f"{module.__name__}.{f.name}: keyword-only launch options {loose}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("make", [
    lambda: __import__("mambalearn.mamba1.config", fromlist=["x"]).default_config(16, "cpu"),
    lambda: C.CPU, lambda: m3.DEFAULT, lambda: m3.MIMO_DEFAULT,
    lambda: __import__("mambalearn.mamba2.step", fromlist=["x"]).DEFAULT,
], ids=["mamba1", "mamba2", "mamba3", "mimo", "step"])
def test_replace_names_the_fields_of_every_family_config(make):
    config = make()
    with pytest.raises(ValueError, match="config has no field bogus; its fields: "):
        config.replace(bogus=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.__setattr__(next(iter(config.__dataclass_fields__)), None)


def test_the_entry_points_refuse_a_dict_of_settings():
    # the config is checked first, before any tensor
    from mambalearn.mamba2.step import StepConfig, selective_state_update
    from mambalearn.mamba3.mimo_api import mamba3_mimo_combined

    with pytest.raises(TypeError, match="config must be a mambalearn.mamba2.step.StepConfig"):
        selective_state_update(*[None] * 6, config=dict(block_p=2))
    with pytest.raises(TypeError, match="config must be a mambalearn.mamba3.config.MimoConfig"):
        mamba3_mimo_combined(*[None] * 12, config=dict(tree_fan=2))
    with pytest.raises(ValueError, match="block_p must be None or a power of two"):
        StepConfig(block_p=3)
    with pytest.raises(ValueError, match="tree_fan must be ≥ 2"):
        m3.MIMO_DEFAULT.replace(tree_fan=1)
    assert m3.MIMO_DEFAULT.replace(forward_warps=4).forward_warps == 4
