"""Rendered run files for a matrix of topologies: pinned by golden files, loaded back by their owners."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from fake_launchers import calls, install_fakes
from render_cases import CASES, case_recipe

from tuner.render.launch_command import launch_argv, preflight_argv
from tuner.render.run_directory import render_run_files, write_run_directory
from tuner.rundir.layout import (ACCELERATE_CONFIG, DEEPSPEED_CONFIG, ELASTIC_LOG_DIR, LAUNCH_SCRIPT, LOCK_FILE,
                                 SLURM_SCRIPT)

GOLDEN = Path(__file__).parent / "golden" / "render"
UPDATE = os.environ.get("TUNER_UPDATE_GOLDEN") == "1"


def rendered(name: str) -> dict[str, str]:
    files = render_run_files(case_recipe(name), f"runs/{name}")
    files.pop(LOCK_FILE)  # the lock file is the recipe dump, pinned by the recipe tests
    return files


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_files_match_golden(name, demo_model_path):
    files = rendered(name)
    directory = GOLDEN / name
    if UPDATE:
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
        for file, text in files.items():
            (directory / file).write_text(text)
    expected = {path.name: path.read_text() for path in directory.iterdir()}
    assert files == expected, f"rendering changed; if intended, rerun with TUNER_UPDATE_GOLDEN=1 and review the diff of {directory}"


@pytest.fixture
def isolated_environment():
    """Accelerate's loaders and TrainingArguments write os.environ and process-wide state: undo both."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    from accelerate.state import AcceleratorState, PartialState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


def launcher_arguments(config_file: Path):
    """What ``accelerate launch --config_file`` makes of the file: its own parser and validation."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "-m", "tuner.train", "lock.yaml"])
    args, defaults, _ = _validate_launch_command(args)
    return args, defaults


@pytest.mark.parametrize("name", sorted(CASES))
def test_accelerate_loads_the_config_and_picks_the_launcher(name, tmp_path, demo_model_path, isolated_environment):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    recipe = case_recipe(name)
    run_dir = write_run_directory(recipe, tmp_path / "run")
    config = load_config_from_file(str(run_dir / ACCELERATE_CONFIG))
    assert isinstance(config, ClusterConfig)
    assert config.num_processes == recipe.world_size and config.num_machines == recipe.hardware.machines
    assert config.use_cpu == (not recipe.uses_gpu)

    args, _ = launcher_arguments(run_dir / ACCELERATE_CONFIG)
    distributed = recipe.memory.distributed
    # several ranks on one or more machines go through torchrun (multi_gpu / deepspeed / fsdp launchers)
    assert args.multi_gpu == (distributed == "ddp" and recipe.world_size > 1)
    assert args.use_deepspeed == (distributed == "deepspeed")
    assert args.use_fsdp == (distributed == "fsdp")
    if distributed == "deepspeed":
        assert config.deepspeed_config["deepspeed_config_file"] == str(run_dir / DEEPSPEED_CONFIG)
        assert config.mixed_precision is None  # precision lives in deepspeed.json only; Accelerate refuses both
    if recipe.hardware.machines > 1:
        assert (config.main_process_ip, config.rdzv_backend) == ("10.0.0.1", recipe.hardware.rdzv_backend)


@pytest.mark.parametrize("name", [name for name in sorted(CASES) if "fsdp" in name])
def test_fsdp_plugin_accepts_the_config_and_finds_the_layer_class(name, tmp_path, demo_model_path, isolated_environment):
    """The launcher's environment builds Accelerate's FSDP2 plugin, whose wrap policy finds the class in the real model."""
    from accelerate.utils import FullyShardedDataParallelPlugin, patch_environment
    from accelerate.utils.launch import prepare_multi_gpu_env
    from transformers import AutoModelForCausalLM

    recipe = case_recipe(name)
    run_dir = write_run_directory(recipe, tmp_path / "run")
    args, _ = launcher_arguments(run_dir / ACCELERATE_CONFIG)
    args.main_process_port = 0  # a free port: the check below only needs the environment
    env = prepare_multi_gpu_env(args)
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    with patch_environment(**{k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}):
        plugin = FullyShardedDataParallelPlugin()
    fsdp = recipe.memory.fsdp
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward == (fsdp.sharding_strategy != "shard_grad_op")
    assert plugin.state_dict_type.name == ("FULL_STATE_DICT" if fsdp.state_dict_type == "full" else "SHARDED_STATE_DICT")
    assert plugin.cpu_ram_efficient_loading == fsdp.cpu_ram_efficient_loading
    assert (type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") == (recipe.memory.offload_params == "cpu")
    plugin.set_auto_wrap_policy(AutoModelForCausalLM.from_pretrained(demo_model_path))  # raises if the class is wrong


PARALLEL_CASES = sorted(name for name, case in CASES.items() if "parallelism" in case)


@pytest.mark.parametrize("name", PARALLEL_CASES)
def test_accelerate_launch_hands_the_ranks_the_recipes_parallel_layout(name, tmp_path, demo_model_path,
                                                                     isolated_environment):
    """What each rank's Accelerate builds from the environment `accelerate launch` gives it: the recipe's sizes.

    fsdp + tp: transformers shards the model at load (DistributedConfig), its mesh must cover the world, and the
    Trainer then builds ParallelismConfig(tp_size, dp_shard_size=the model's data-parallel size) over that
    environment (transformers/trainer.py, create_accelerator_and_postprocess), which must cover it too."""
    import math

    from accelerate import ParallelismConfig
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import patch_environment
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    from tuner.train.parallelism import distributed_config, loads_sharded

    recipe = case_recipe(name)
    par, world = recipe.parallelism, recipe.world_size
    run_dir = write_run_directory(recipe, tmp_path / "run")
    config = load_config_from_file(str(run_dir / ACCELERATE_CONFIG))
    args, _ = launcher_arguments(run_dir / ACCELERATE_CONFIG)
    args.main_process_port = 0  # a free port: the check below only needs the environment
    deepspeed = recipe.memory.distributed == "deepspeed"
    args.deepspeed_fields_from_accelerate_config = ",".join(config.deepspeed_config)  # as launch_command sets it
    env = prepare_deepspeed_cmd_env(args)[1] if deepspeed else prepare_multi_gpu_env(args)
    if deepspeed and par.sp == 1:  # AutoTP alone: the split lives in deepspeed.json, tested above
        assert config.parallelism_config == {} and "ACCELERATE_USE_PARALLELISM_CONFIG" not in env
        return
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    with patch_environment(**{k: v for k, v in env.items() if k.startswith("PARALLELISM_CONFIG_")}):
        if loads_sharded(recipe):
            loading = distributed_config(recipe)
            assert (loading.tp_size, loading.fsdp_size, loading.dp_replicate_size) == (par.tp, par.dp_shard,
                                                                                      par.dp_replicate)
            assert math.prod((loading.pp_size, loading.dp_replicate_size, loading.fsdp_size, loading.tp_size)) == world
            built = ParallelismConfig(tp_size=loading.tp_size, dp_shard_size=loading.dp_size)
        else:
            built = ParallelismConfig()  # what the Accelerator makes of ACCELERATE_USE_PARALLELISM_CONFIG
    assert (built.tp_size, built.cp_size, built.sp_size) == (par.tp, par.cp, par.sp)
    if par.sp > 1:  # DeepSpeed Ulysses: Accelerate leaves the sp x dp layout to DeepSpeed's own groups
        assert built.sp_backend == "deepspeed" and built.sp_handler.sp_attn_implementation == "sdpa"
        assert built.sp_handler.sp_seq_length_is_variable is True
    else:
        assert built.total_size == world
        assert built.data_parallel_size == recipe.data_parallel
        assert built.cp_backend == "torch"


def test_fsdp_layer_class_comes_from_the_model(demo_model_path):
    from tuner.recipe.schema import ModelSection
    from tuner.render.model_layers import decoder_layer_classes

    assert decoder_layer_classes(ModelSection(id=str(demo_model_path))) == ["LlamaDecoderLayer"]


@pytest.mark.parametrize("name", [name for name in sorted(CASES) if "zero" in name])
def test_deepspeed_parses_the_json_once_the_trainer_fills_auto(name, tmp_path, demo_model_path, isolated_environment):
    """The Trainer's own DeepSpeed integration fills every "auto" from the recipe's TrainingArguments; DeepSpeed's
    config parser then accepts the result and reads back the stage, offload and save settings."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import AutoModelForCausalLM

    from tuner.train.__main__ import training_arguments

    recipe = case_recipe(name)
    model = AutoModelForCausalLM.from_pretrained(demo_model_path)  # before the arguments: no ZeRO-3 sharded load here
    run_dir = write_run_directory(recipe, tmp_path / "run")
    on_this_machine = recipe.model_copy(deep=True)  # TrainingArguments refuses GPU settings on a CPU-only machine
    on_this_machine.hardware.gpus_per_machine = 0
    if on_this_machine.memory.mixed_precision == "fp16":
        on_this_machine.memory.mixed_precision = "no"
    args = training_arguments(on_this_machine, run_dir)
    hf_config = args.hf_deepspeed_config
    hf_config.trainer_config_finalize(args, model, 100)
    assert '"auto"' not in json.dumps(hf_config.config)
    parsed = DeepSpeedConfig(hf_config.config)
    mem = recipe.memory
    assert parsed.zero_optimization_stage == mem.zero_stage
    assert parsed.train_micro_batch_size_per_gpu == recipe.training.micro_batch_size
    assert parsed.gradient_accumulation_steps == recipe.training.gradient_accumulation_steps
    zero = parsed.zero_config
    assert (str(getattr(zero.offload_optimizer.device, "value", zero.offload_optimizer.device)) if zero.offload_optimizer else "none") == mem.offload_optimizer
    assert (str(getattr(zero.offload_param.device, "value", zero.offload_param.device)) if zero.offload_param else "none") == mem.offload_params
    if "nvme" in (mem.offload_optimizer, mem.offload_params):
        assert str(zero.offload_optimizer.nvme_path) == recipe.hardware.nvme_path
    # AutoTP: DeepSpeed splits the model over tp ranks, and gathers it whole on save
    assert parsed.tensor_parallel_config.autotp_size == (recipe.parallelism.tp if recipe.parallelism.tp > 1 else 0)
    if mem.zero_stage == 3 or recipe.parallelism.tp > 1:
        assert zero.gather_16bit_weights_on_model_save is True
    assert parsed.bfloat16_config.enabled == (on_this_machine.memory.mixed_precision == "bf16")
    assert parsed.float16_config.enabled is False


def test_deepspeed_json_sections():
    fp16 = json.loads(rendered("gpu_zero2_fp16_4")[DEEPSPEED_CONFIG])
    assert fp16["fp16"]["enabled"] == "auto" and fp16["bf16"]["enabled"] == "auto"
    nvme = json.loads(rendered("gpu_zero3_nvme_8")[DEEPSPEED_CONFIG])["zero_optimization"]
    assert nvme["offload_optimizer"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme"}
    assert nvme["offload_param"]["nvme_path"] == "/local_nvme"
    assert nvme["stage3_gather_16bit_weights_on_model_save"] is True


def test_launch_script_runs_the_exact_command_per_node(tmp_path):
    recipe = case_recipe("multinode_zero3_2x8_c10d")
    project = tmp_path / "project"
    run_dir = Path("runs") / "my run"  # a space: quoting must hold
    files = render_run_files(recipe, run_dir)
    for file in (LAUNCH_SCRIPT, SLURM_SCRIPT):
        (project / run_dir).mkdir(parents=True, exist_ok=True)
        (project / run_dir / file).write_text(files[file])
        (project / run_dir / file).chmod(0o755)
        subprocess.run(["bash", "-n", str(project / run_dir / file)], check=True)
    env = install_fakes(tmp_path / "fakes")
    script = project / run_dir / LAUNCH_SCRIPT
    for rank in (0, 1):
        subprocess.run([str(script), str(rank)], cwd=tmp_path, env=env, check=True)
        assert calls(env) == [[str(project), *preflight_argv(run_dir, rank)[1:]],
                              [str(project), *launch_argv(run_dir, machine_rank=rank, main_process_ip="10.0.0.1")[1:]]]
    subprocess.run([str(script), "1"], cwd=tmp_path, env={**env, "MAIN_PROCESS_IP": "node-a"}, check=True)
    assert calls(env)[-1] == [str(project), *launch_argv(run_dir, machine_rank=1, main_process_ip="node-a")[1:]]
    for bad in ([], ["2"], ["x"]):
        refused = subprocess.run([str(script), *bad], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert refused.returncode != 0 and "MACHINE_RANK" in refused.stderr and not calls(env)


def test_single_machine_launch_script_returns_to_the_project(tmp_path):
    recipe = case_recipe("cpu_ddp_2")
    run_dir = Path("runs/cpu")
    files = render_run_files(recipe, run_dir)
    assert SLURM_SCRIPT not in files  # Slurm scripts are for GPU runs
    (tmp_path / run_dir).mkdir(parents=True)
    script = tmp_path / run_dir / LAUNCH_SCRIPT
    script.write_text(files[LAUNCH_SCRIPT])
    script.chmod(0o755)
    env = install_fakes(tmp_path / "fakes")
    subprocess.run([str(script)], cwd="/", env=env, check=True)
    assert calls(env) == [[str(tmp_path), *launch_argv(run_dir)[1:]]]


@pytest.mark.parametrize("name", ["cpu_ddp_2", "gpu_single", "multinode_zero3_2x8_c10d"])
def test_every_launch_keeps_the_ranks_error_files_in_the_run_directory(name, tmp_path):
    """launch.sh (on each machine) and slurm.sbatch, not only `tuner run`, pass torchrun's --log_dir <run dir>/elastic,
    where tuner.launch.failures.raised_at reads each rank's error.json; the run dir is quoted as every other value."""
    recipe = case_recipe(name)
    project = tmp_path / "project"
    run_dir = Path("runs") / "it's a run"  # a space and a quote: quoting must hold
    elastic = str(run_dir / ELASTIC_LOG_DIR)
    files = render_run_files(recipe, run_dir)
    (project / run_dir).mkdir(parents=True)
    for file in (LAUNCH_SCRIPT, SLURM_SCRIPT):
        if file in files:
            (project / run_dir / file).write_text(files[file])
            (project / run_dir / file).chmod(0o755)
    assert f"--log_dir {shlex.quote(elastic)} " in files[LAUNCH_SCRIPT]
    assert files[LAUNCH_SCRIPT].count("--log_dir") == 1  # defined once, by launch_argv
    env = install_fakes(tmp_path / "fakes")
    machines = recipe.hardware.machines
    launches = []
    for rank in range(machines):
        args = [] if machines == 1 else [str(rank)]
        subprocess.run(["bash", str(project / run_dir / LAUNCH_SCRIPT), *args], cwd=tmp_path, env=env, check=True)
        launches.append(calls(env)[-1])
    if SLURM_SCRIPT in files:
        subprocess.run(["bash", str(project / run_dir / SLURM_SCRIPT)], cwd=project,
                       env={**env, "FAKE_NODES": str(machines)}, check=True)
        launches += [call for call in calls(env) if call[1] == "launch"]
    assert len(launches) == machines * (2 if SLURM_SCRIPT in files else 1)
    for call in launches:
        assert call[0] == str(project) and call[call.index("--log_dir") + 1] == elastic, call
    assert launch_argv(run_dir)[:6] == ["accelerate", "launch", "--config_file", str(run_dir / ACCELERATE_CONFIG),
                                        "--log_dir", elastic]


def test_slurm_script_starts_one_launch_per_node():
    script = rendered("multinode_fsdp_hybrid_2x8")[SLURM_SCRIPT]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "MAIN_PROCESS_IP=" in script and "$SLURM_NODEID" in script


def test_existing_run_directory_is_not_overwritten(tmp_path):
    from tuner.recipe.source import RecipeError

    recipe = case_recipe("cpu_single")
    write_run_directory(recipe, tmp_path / "run")
    with pytest.raises(RecipeError, match="--force"):
        write_run_directory(recipe, tmp_path / "run")
    write_run_directory(recipe, tmp_path / "run", force=True)
