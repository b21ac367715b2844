"""The topology matrix the renderer is pinned on: case name -> recipe overrides (shared by golden and load-back tests)."""
from __future__ import annotations

H100x8 = {"gpus_per_machine": 8, "gpu": "H100-80GB"}
TWO_NODES = {"machines": 2, "gpus_per_machine": 8, "gpu": "H100-80GB", "main_process_ip": "10.0.0.1"}

CASES: dict[str, dict] = {
    "cpu_single": {},
    "cpu_ddp_2": {"hardware": {"num_processes": 2}, "memory": {"distributed": "ddp"}},
    "cpu_zero2_2": {"hardware": {"num_processes": 2}, "memory": {"distributed": "deepspeed", "zero_stage": 2}},
    "cpu_zero3_2": {"hardware": {"num_processes": 2}, "memory": {"distributed": "deepspeed", "zero_stage": 3}},
    "gpu_single": {"hardware": {"gpus_per_machine": 1, "gpu": "A100-80GB"}},
    "gpu_ddp_8": {"hardware": H100x8, "memory": {"distributed": "ddp"}},
    "gpu_zero0_8": {"hardware": H100x8, "memory": {"distributed": "deepspeed", "zero_stage": 0}},
    "gpu_zero1_8": {"hardware": H100x8, "memory": {"distributed": "deepspeed", "zero_stage": 1}},
    "gpu_zero2_offload_cpu_8": {"hardware": H100x8, "memory": {"distributed": "deepspeed", "zero_stage": 2,
                                                               "offload_optimizer": "cpu"}},
    "gpu_zero3_offload_cpu_8": {"hardware": H100x8, "memory": {"distributed": "deepspeed", "zero_stage": 3,
                                                               "offload_optimizer": "cpu", "offload_params": "cpu"}},
    "gpu_zero3_nvme_8": {"hardware": {**H100x8, "nvme_path": "/local_nvme"},
                         "memory": {"distributed": "deepspeed", "zero_stage": 3,
                                    "offload_optimizer": "nvme", "offload_params": "nvme"}},
    "gpu_zero2_fp16_4": {"hardware": {"gpus_per_machine": 4, "gpu": "T4"}, "model": {"dtype": "float32"},
                         "memory": {"distributed": "deepspeed", "zero_stage": 2, "mixed_precision": "fp16"}},
    "gpu_fsdp_8": {"hardware": H100x8, "memory": {"distributed": "fsdp"}},
    "gpu_fsdp_offload_8": {"hardware": H100x8, "memory": {
        "distributed": "fsdp", "offload_optimizer": "cpu", "offload_params": "cpu",
        "fsdp": {"sharding_strategy": "shard_grad_op", "state_dict_type": "sharded", "cpu_ram_efficient_loading": False}}},
    "multinode_ddp_2x8": {"hardware": TWO_NODES, "memory": {"distributed": "ddp"}},
    "multinode_zero3_2x8_c10d": {"hardware": {**TWO_NODES, "rdzv_backend": "c10d", "main_process_port": 29400},
                                 "memory": {"distributed": "deepspeed", "zero_stage": 3}},
    "multinode_fsdp_hybrid_2x8": {"hardware": TWO_NODES,
                                  "memory": {"distributed": "fsdp", "fsdp": {"sharding_strategy": "hybrid_shard"}}},
    # tensor, context and sequence parallelism (the demo model: 4 heads, 2 KV heads, so tp/sp 2)
    "cpu_autotp_2": {"hardware": {"num_processes": 2}, "parallelism": {"tp": 2},
                     "memory": {"distributed": "deepspeed", "zero_stage": 1}},
    "gpu_autotp_zero2_8": {"hardware": H100x8, "parallelism": {"tp": 2},
                           "memory": {"distributed": "deepspeed", "zero_stage": 2}},
    "gpu_sp_zero3_8": {"hardware": H100x8, "parallelism": {"sp": 2},
                       "memory": {"distributed": "deepspeed", "zero_stage": 3, "attention": "sdpa"}},
    "gpu_fsdp_tp_8": {"hardware": H100x8, "parallelism": {"tp": 2}, "memory": {"distributed": "fsdp"}},
    "gpu_fsdp_cp_8": {"hardware": H100x8, "parallelism": {"cp": 2},
                      "memory": {"distributed": "fsdp", "attention": "sdpa", "max_seq_length": 4096}},
    "multinode_fsdp_tp_2x8": {"hardware": TWO_NODES, "parallelism": {"tp": 2, "dp_replicate": 2},
                              "memory": {"distributed": "fsdp"}},
    "gpu_qlora_zero3_8": {"hardware": H100x8, "method": {"kind": "qlora", "quantization": {"bits": 4}},
                          "memory": {"distributed": "deepspeed", "zero_stage": 3}},
}


def case_recipe(name: str):
    from tuner.recipe.io import validate_recipe

    return validate_recipe({"name": name, **CASES[name]})
