"""Every size cap of the contracts, in one place (documented in services/scheduler/README.md).

A job spec travels whole in `SubmitJob`, `EnqueueJob` and `JobQueued`, and its command, env
and mounts in every `StartWorker`; NATS refuses a message over its max_payload (1 MiB by
default), and an event that cannot be published would block its service's outbox. The whole
spec is therefore capped (SPEC_BYTES, its JSON as sent), and so is each list and string a
user fills, so that a refusal names the part that is too big.

A refusal of a cap carries the rule `limit:<name>` (e.g. `limit:spec_bytes`) and, as
`valid`, the cap itself.
"""

from __future__ import annotations

SPEC_BYTES = 64 * 1024  # a JobSpec's JSON, as the CLI sends it and the scheduler stores it

NAME_CHARS = 128  # names without a tighter cap of their own (region, datastore, reservation)
GPU_TYPES = 32  # entries of gpu_types (the catalogue has 15 models; duplicates are dropped)
WORKERS = 64  # workers of a training job; worker_commands has one command per worker
DATASETS = 32
CHECKPOINTS = 32
ENV_VARS = 128  # environment variables of a job
ENV_NAME_CHARS = 128
ENV_VALUE_CHARS = 4096
COMMAND_ARGS = 256  # arguments of one command (command, each of worker_commands, server)
ARG_CHARS = 4096  # characters of one argument
ROUTES = 64  # routes of an endpoint
ROUTE_PARAMS = 64  # body parameters of one route
PACKAGES = 256  # entries of each of packages.apt / conda / pip, and of image_packages
PACKAGE_CHARS = 256  # characters of one package specification
NODE_CPUS = 1024  # CPUs a node may offer to CPU-only jobs (the scheduler claims each one)
NODE_ENVIRONMENTS = 256  # mapped base environments a node may announce (its operator's map)
XID_EVENTS = 16  # XIDs one GPU reports in one heartbeat (the newest kept)
# A worker's mounts (scheduler mounts.py): each dataset and checkpoint, the two roots they
# share when there are several, the input, the model code and the output.
MOUNTS = DATASETS + CHECKPOINTS + 5
# A worker's sealed secrets (StartWorker.sealed_secrets), base64: more than any StartWorker
# that fits a NATS message (1 MB by default) can carry.
SEALED_SECRETS_CHARS = 2 * 1024 * 1024
# Alert rules (gpufleet_contracts.alerts): what one rule may hold.
ALERT_MATCHERS = 16  # label matchers of a rule's series
ALERT_LABELS = 16  # labels (and annotations) a rule adds to its alerts
ALERT_LABEL_CHARS = 256  # a label's or a matcher's value
ALERT_ANNOTATION_CHARS = 1024  # an annotation's value
ALERT_EXPR_CHARS = 2000  # an operator's PromQL expression
