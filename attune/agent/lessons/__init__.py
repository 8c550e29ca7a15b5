"""The lessons store: structured, user-owned lessons distilled from finished tuning runs.

A lesson says: *in this scope* (framework, model family, size bucket, accelerator, scale and the backend
whose trials measured it), *when this bottleneck shows*, *moving this knob this way* had *these measured
effects*. The evidence is counted by what the engine made of each trial:

- **supporting**: a gain of a change the engine *accepted* (the trial's record, or the loss check that
  settled it, says ``accepted``);
- **inconclusive**: a gain the engine rejected (within the noise floor, or it did not hold on a re-run);
- **counter**: a measured gain below ``min_gain``;
- **infeasible**: the trial failed (OOM, crash, timeout, divergence). A failure is not an effect value.

The status moves ``hypothesis → confirmed`` when at least two supporting measurements agree, is **demoted**
back to ``hypothesis`` by a counter-example or a failure, and becomes ``disproven`` when counter-examples
outnumber the rest. A lesson whose move failed (and that is not confirmed) is *infeasible*: the playbook
avoids that move in scope.

**A lesson is evidence with a scope, not an order.** Each measured effect is stored with the conditions it was
measured under (:func:`job_features`: the diagnosed bottleneck and the share of the step each phase took, memory
headroom, MFU, model size and shape, sequence length, scale and accelerator). On a new job,
:func:`estimate` weighs every effect by how alike its conditions are to what this job's own trials measure
(:func:`similarity`) and shrinks the weighted mean toward the playbook's own prior by the weight of that
evidence: many lessons from unlike jobs weigh almost nothing, so they converge to "no effect", not to a wrong
order. The playbook tries a move a lesson raised at most once per run, and drops the lessons of a knob as soon as
this run measures a counter-example. A lesson that never paid in :data:`FORGET_AFTER_RUNS` runs (no accepted gain, a mean below ``min_gain``) is
forgotten.

**Noise records.** Each run also leaves the run-to-run noise it measured (:class:`NoiseRecord`: the pooled log-sd of
what it ran more than once, and its degrees of freedom). A later run on the same cluster (framework, backend,
accelerator and scale: :func:`noise_in_scope`) starts with their pool as a noise prior (:func:`noise_prior_overrides`),
which the engine weighs against the run's own runs (``RunNoise.with_prior``).

Lessons steer only runs of the same framework and of the same kind of backend (another accelerator weighs less,
and never prunes): simulated
lessons (backend ``sim``) never steer a real run unless asked (``include_simulated``); lessons recorded before
backends were recorded are of unknown provenance and count as simulated.

The store is one JSON file the user controls: ``$ATTUNE_LESSONS``, or
``platformdirs.user_data_dir("attune")/lessons.json``; ``attune lessons list|show|forget`` edits it. Every
read-modify-write holds an ``flock`` on ``lessons.json.lock`` and re-reads the file under it, and the file is
replaced atomically (temporary file in the same directory, fsync, ``os.replace``), so concurrent runs lose
nothing. A file that cannot be read back is never overwritten: it is moved aside to
``lessons.json.corrupt-<time>`` (with a warning) and its readable lessons are kept.
"""

from __future__ import annotations

from attune.agent.lessons.distil import (
    Observation,
    distil,
    fold,
)
from attune.agent.lessons.model import (
    FORGET_AFTER_RUNS,
    INFEASIBLE_PRUNE_MATCH,
    MIN_EVIDENCE,
    NOISE_PRIOR_RUNS,
    PRIOR_WEIGHT,
    SIMULATED_BACKENDS,
    STORE_VERSION,
    UNKNOWN_SIMILARITY,
    Condition,
    Estimate,
    Lesson,
    LessonAction,
    LessonStoreError,
    NoiseRecord,
    Scope,
    Status,
    Verdict,
    backend_compatible,
    backend_kind,
    direction_of,
    estimate,
    job_features,
    never_paid,
    noise_in_scope,
    param_count,
    scale_bucket,
    scope_match,
    scope_of,
    similarity,
    size_bucket,
)
from attune.agent.lessons.store import (
    STEER_BY_DEFAULT,
    LessonStore,
    MemoryLessonStore,
    default_path,
    lessons_disabled,
    lessons_steer,
    noise_prior_overrides,
    record_run,
    run_noise,
)

__all__ = [
    "FORGET_AFTER_RUNS",
    "INFEASIBLE_PRUNE_MATCH",
    "MIN_EVIDENCE",
    "NOISE_PRIOR_RUNS",
    "PRIOR_WEIGHT",
    "SIMULATED_BACKENDS",
    "STEER_BY_DEFAULT",
    "STORE_VERSION",
    "UNKNOWN_SIMILARITY",
    "_CATEGORY_DISTANCE",
    "_FEATURE_SCALES",
    "Condition",
    "Estimate",
    "Lesson",
    "LessonAction",
    "LessonStore",
    "LessonStoreError",
    "MemoryLessonStore",
    "NoiseRecord",
    "Observation",
    "Scope",
    "Status",
    "Verdict",
    "_Contents",
    "_Op",
    "_fsync_dir",
    "_gain",
    "_lesson_id",
    "_migrate_v1",
    "backend_compatible",
    "backend_kind",
    "default_path",
    "direction_of",
    "distil",
    "estimate",
    "fold",
    "job_features",
    "lessons_disabled",
    "lessons_steer",
    "never_paid",
    "noise_in_scope",
    "noise_prior_overrides",
    "param_count",
    "record_run",
    "run_noise",
    "scale_bucket",
    "scope_match",
    "scope_of",
    "similarity",
    "size_bucket",
]
