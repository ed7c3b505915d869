"""Job spec validation and the Training Summary: the one place where the spec's ranges and
defaults live (the proto comments state the same numbers; tests/test_spec_docs.py checks they agree).

`SPEC_FIELDS` (fields.py) declares the spec's user-facing fields once, a row each: path, label, help, range or
choices, default, and which reward or backend it applies to. Everything else is derived from it:
the CLI's flags and help (clients/commands/train.py), the console's form, hints and limits
(clients/web/forms.py, limits.py), the trainer's JobConfig (services/trainer/job/config.py, by field
name), the Training Summary's extra rows, docs/spec-fields.md and the proto-comment test. A plain
ranged field (`checked`) is validated from its row alone: adding one is its proto field and a row.

`resolve_spec` (resolve.py) takes the JobSpec a user sent and returns it with every default filled in and the
batch size rounded up to a multiple of the group size, plus the warnings to show; values out of
range raise one InvalidArgument naming every bad field, its value and its range (`Violations`). It is pure: no store, no
gRPC, so the CLI's dry run, the scheduler and the tests share it.

The package's modules, each importing only those above it: ranges.py (the numbers and enum keys),
fields.py (the rows), reward.py, environment.py, training.py and sft.py (the checks of each part of a spec),
resolve.py (`resolve_spec` and the Training Summary). Every public name is imported from here.
"""

from rlvr.jobspec.environment import (  # noqa: F401
    EnvironmentCatalog,
    EnvironmentChoices,
    environment_info,
)
from rlvr.jobspec.fields import (  # noqa: F401
    FIELDS_BY_PATH,
    SAMPLING_CONTROLS,
    SAMPLING_PATHS,
    SPEC_FIELDS,
    SpecField,
    fields_markdown,
    proto_field,
    reshaped_sampling,
    settings_of,
    value_of,
)
from rlvr.jobspec.ranges import (  # noqa: F401
    APPLIES_NOTES,
    BACKEND_KEYS,
    BACKEND_NAMES,
    BATCH_SIZE_DEFAULT,
    BATCH_SIZES,
    CHECKPOINT_EVERY,
    CHECKPOINTING_CHOICES,
    CHECKPOINTING_PARAMETERS,
    CLIPPED_LOSSES,
    DEFAULT_BASE_MODEL,
    DEFAULT_DATASET_SPLIT,
    DEFAULT_REWARD,
    EPISODE_TOKENS_PER_TURN,
    EPOCHS,
    EPSILON_HIGH,
    EVAL_EVERY,
    EVAL_SIZE,
    FORMAT_BONUS_WEIGHT,
    GIVE_UP_AFTER,
    GPU_MEMORY_FRACTION,
    GPU_SELECTION_RE,
    GREEDY_EPS,
    GROUP_SIZE,
    GSM8K_SPLITS,
    HEAD_TASK_NAMES,
    JOB_SEED,
    KL_BETA,
    LEARNING_RATE,
    LORA_ALPHA,
    LORA_INITS,
    LORA_RANK,
    LOSS_NAMES,
    MAX_ASYNC_STEPS,
    MAX_COMPLETION,
    MAX_DATASET_CHARS,
    MAX_ENVIRONMENT_SETTINGS,
    MAX_EPISODE_TOKENS,
    MAX_LABEL_CHARS,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_OPTION_CHARS,
    MAX_PATH_CHARS,
    MAX_REWARD_TERMS,
    MAX_ROUNDS,
    MAX_SETTING_CHARS,
    MAX_SPLIT_CHARS,
    MAX_STEPS_DEFAULT,
    MAX_STEPS_HIGH,
    MAX_TURNS,
    MERGE_DTYPES,
    METHOD_KEYS,
    METHOD_NAMES,
    MIN_GAIN,
    MIN_GAIN_ALLOWED,
    MIN_P,
    MINI_BATCHES,
    NAME_RE,
    NUM_ITERATIONS,
    NUM_NODES,
    NUM_PROCESSES,
    OWN_BOUNDS,
    PRECISION_KEYS,
    PRECISIONS,
    QUANT_KEYS,
    QUANT_NAMES,
    REPETITION_PENALTY,
    REWARD_FUNCTIONS,
    REWARD_KEYS,
    REWARD_WEIGHT,
    SEED_MAX,
    SETTING_KEY_RE,
    SFT_COLUMN_SETS,
    SHARDINGS,
    SYNTHETIC_PROMPTS,
    TARGET,
    TARGET_ALLOWED,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    Applies,
    Backend,
    C,
    FieldKind,
    FloatRange,
    IntRange,
    LossType,
    Method,
    Precision,
    Quantization,
    RewardName,
    Sharding,
    clip_inactive,
    merge_dtype,
    one_update_per_step,
)
from rlvr.jobspec.resolve import (  # noqa: F401
    ResolvedJob,
    check_sizes,
    default_name,
    job_status_name,
    job_status_value,
    resolve_spec,
    reward_title,
    summary,
)
from rlvr.jobspec.reward import (  # noqa: F401
    generates_prompts,
    reward_terms,
)
from rlvr.jobspec.sft import (  # noqa: F401
    SFT_DEFAULT_SPLIT,
    is_head,
    is_sft,
    is_supervised,
    sft_columns_problem,
    sft_steps,
    sft_total_steps,
)
from rlvr.jobspec.training import (  # noqa: F401
    ON_POLICY_EQUIVALENT,
    prompt_count,
    total_steps,
)
