"""Every name inside a run directory, defined once: render writes them, training fills them, launch, infer,
merge, demo and the wizard read them.  Pure constants (bottom floor): any module may import them.

runs/<name>/
  recipe.lock.yaml   the resolved recipe (every default explicit): the training entrypoint's only input
  tuner_files.json   what tuner wrote here, each file with its size and SHA-256: the only files a re-render replaces
  accelerate.yaml    Accelerate's launch config;  deepspeed.json  when DeepSpeed is used
  launch.sh          the exact launch command;     slurm.sbatch    for GPU and multi-machine runs
  events.jsonl       one JSON object per line (started, step, eval, checkpoint, memory, finished, error)
  train.log          every rank's output
  memory.json        the plan's prediction beside the measured peak, written at the end
  model_snapshot.json  a hub model's commit and files, downloaded before launch: what every rank and machine loads
  checkpoints/checkpoint-N/  the Trainer's checkpoints, each with tuner_checkpoint.json written last
  final/             the trained model or adapter, its tokenizer and the lock recipe
  merged/            an adapter merged into its base (output.save: merged, or `tuner merge`), with its own tuner_files.json
  slurm-<job>.log    Slurm's output of each job submitted with slurm.sbatch
  offload/           weights placed on disk by device_map="auto" at inference
  serve/             what `tuner serve` hands transformers' server: links to the model (or base + adapter) and
                     tokenizer, and the chat template of the run's prompt format when the tokenizer has none
  profile/           the torch profiler trace of `--profile N`
  eval/              `tuner eval` results, one JSON file per evaluated model and tasks (tuner/evaluate/results.py)
  export/<quant>/    `tuner export`: the GGUF file (and, with --format ollama, its Modelfile), with tuner_files.json
  probe/             what `tuner probe` ran: a run directory of its own with probe_request.json (what the ranks are
                     asked to measure) and probe.json (the measurements beside the plan)
  tensorboard/       TensorBoard event files (training.report_to: [tensorboard])
  mlruns/            the MLflow file store (report_to: [mlflow]);  wandb/  W&B offline runs;  trackio/  trackio's database
and beside it, runs/.<name>.tuner-run.lock while a tuner writes or runs it (tuner/rundir/lock.py).
"""

LOCK_FILE = "recipe.lock.yaml"
ACCELERATE_CONFIG = "accelerate.yaml"
DEEPSPEED_CONFIG = "deepspeed.json"
LAUNCH_SCRIPT = "launch.sh"
SLURM_SCRIPT = "slurm.sbatch"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "train.log"
MEMORY_REPORT = "memory.json"
MODEL_SNAPSHOT = "model_snapshot.json"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"  # the Trainer's own folder names: checkpoint-<global step>
CHECKPOINT_INFO = "tuner_checkpoint.json"  # written last into a checkpoint: its settings, and that it is complete
FINAL_DIR = "final"
MERGED_DIR = "merged"
OFFLOAD_DIR = "offload"
SERVE_DIR = "serve"
PROFILE_DIR = "profile"
EVAL_DIR = "eval"
EXPORT_DIR = "export"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
WANDB_DIR = "wandb"  # W&B names it: WANDB_DIR points at the run directory and W&B writes its wandb/ folder there
TRACKIO_DIR = "trackio"
PREVIOUS_RUNS_DIR = "previous"
PROBE_DIR = "probe"  # `tuner probe` launches into <run dir>/probe, never into the run itself
PROBE_REQUEST = "probe_request.json"  # in a probe's run directory: the training entrypoint probes instead of training
PROBE_REPORT = "probe.json"  # in a probe's run directory: every rank's measurements per phase, beside the plan
RUN_LOCK = ".tuner-run.lock"  # suffix of the lock file beside the run directory
SLURM_LOG = "slurm-%j.log"  # sbatch's name pattern (%j: the job id)
# Written last into every folder tuner writes (run directories, probe/, merged/, export/<quant>/, `tuner presets cp`'s
# folder): each file tuner wrote there with its size and SHA-256 (tuner/rundir/manifest.py).  Only what it proves is tuner's.
MANIFEST = "tuner_files.json"

# What `tuner render` writes: the files a re-render may replace (the rest of a run directory is the run's own).
RENDERED_FILES = (LOCK_FILE, ACCELERATE_CONFIG, DEEPSPEED_CONFIG, LAUNCH_SCRIPT, SLURM_SCRIPT)
ELASTIC_LOG_DIR = "elastic"  # torchrun's --log_dir: <id>/attempt_<n>/<local rank>/error.json, each rank's traceback

# What a run adds to its directory (a re-render keeps all of it): files, then folders; Slurm's logs match SLURM_LOG.
RUN_OUTPUT_FILES = (EVENTS_FILE, LOG_FILE, MEMORY_REPORT, MODEL_SNAPSHOT, PROBE_REQUEST, PROBE_REPORT)
RUN_OUTPUT_DIRS = (CHECKPOINTS_DIR, FINAL_DIR, MERGED_DIR, OFFLOAD_DIR, SERVE_DIR, PROFILE_DIR, EVAL_DIR, EXPORT_DIR,
                   TENSORBOARD_DIR, MLFLOW_DIR, WANDB_DIR, TRACKIO_DIR, PROBE_DIR, ELASTIC_LOG_DIR)
RUN_OUTPUTS = RUN_OUTPUT_FILES + RUN_OUTPUT_DIRS
