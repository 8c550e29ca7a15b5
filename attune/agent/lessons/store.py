"""The store: one JSON file the user owns, read and written under a lock, replaced atomically, never overwritten
when it cannot be read back; what a run records into it and the noise prior it gives the next run."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from attune.agent.lessons.distil import (
    Observation,
    _migrate_v1,
    distil,
    fold,
)
from attune.agent.lessons.model import (
    NOISE_PRIOR_RUNS,
    STORE_VERSION,
    Lesson,
    LessonStoreError,
    NoiseRecord,
    _Contents,
    _lesson_id,
    never_paid,
    noise_in_scope,
    scope_match,
    scope_of,
)
from attune.recipe.model import Recipe

log = logging.getLogger(__name__)

# -- the store ----------------------------------------------------------------------------------------

def lessons_disabled() -> bool:
    """True when ``ATTUNE_LESSONS`` is ``off`` (or ``0``/``none``): no lessons are read or written."""
    return os.environ.get("ATTUNE_LESSONS", "").strip().lower() in ("off", "0", "none", "false")


STEER_BY_DEFAULT = False
"""Whether the user's lessons steer a run unless asked otherwise. Off: on the shipped suite the lessons benchmark
(``attune bench --lessons loo``) does not yet show warm runs reaching 0.95 of the optimum in 0.75 of cold's trials'
worth (README, "Lessons"); runs still record what they teach, and ``ATTUNE_LESSONS_STEER=on`` lets them steer."""


def lessons_steer() -> bool:
    """True when the user's lessons steer proposals: ``ATTUNE_LESSONS_STEER=on``/``off``, else
    :data:`STEER_BY_DEFAULT`; never when lessons are off altogether."""
    if lessons_disabled():
        return False
    v = os.environ.get("ATTUNE_LESSONS_STEER", "").strip().lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    return STEER_BY_DEFAULT


def default_path() -> Path:
    """``$ATTUNE_LESSONS`` or the per-user data directory's ``lessons.json``."""
    env = os.environ.get("ATTUNE_LESSONS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("attune")) / "lessons.json"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_Op = Callable[[dict[str, Lesson]], Any]


class LessonStore:
    """A JSON file of lessons, safe for concurrent writers.

    ``add`` and ``forget`` change the lessons in memory and remember the change; ``save`` takes the store's
    lock, re-reads the file, replays the remembered changes onto what is there now and replaces the file
    atomically, so a lesson another process wrote in the meantime is kept. Reads are re-done whenever the file
    changed on disk.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self._lessons: dict[str, Lesson] | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._pending: list[_Op] = []
        self._mutex = threading.RLock()  # one store may serve several threads (the sidecar's)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- file access --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, *, write: bool) -> Iterator[bool]:
        """Hold the store's exclusive ``flock`` (on the side lock file); yields whether it is held. A read
        where no lock file can be made (a read-only directory) goes ahead without one."""
        fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            if write or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
                raise LessonStoreError(f"cannot lock the lessons store {self.path}: {err.strerror}") from None
        if fd is None:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self, *, locked: bool) -> dict[str, Lesson]:
        """The lessons in the file; a file that cannot be read back whole is moved aside (when ``locked``)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return _Contents()
        except OSError as err:
            raise LessonStoreError(f"cannot read the lessons store {self.path}: {err.strerror}") from None
        if not raw.strip():
            return _Contents()
        problems: list[str] = []
        lessons = _Contents()
        items: list[Any] = []
        noise_items: list[Any] = []
        version: Any = STORE_VERSION
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            problems.append(f"not valid JSON ({err})")
        else:
            if not isinstance(data, dict) or not isinstance(data.get("lessons", []), list):
                problems.append("not a lessons file (expected an object with a 'lessons' list)")
            else:
                version = data.get("version", 1)
                items = data.get("lessons", [])
                noise_items = data.get("noise", [])
                if not isinstance(noise_items, list):
                    problems.append("'noise' is not a list")
                    noise_items = []
                if version not in (1, STORE_VERSION):
                    problems.append(f"store version {version!r} is not one this attune reads (1, {STORE_VERSION})")
                    items = noise_items = []
        for i, item in enumerate(items):
            try:
                lesson = Lesson.model_validate(_migrate_v1(item) if version == 1 else item)
            except ValidationError as err:
                first = err.errors()[0]
                problems.append(f"lesson #{i + 1}: {'.'.join(map(str, first['loc'])) or 'item'}: {first['msg']}")
                continue
            lessons[lesson.id] = lesson
        for i, item in enumerate(noise_items):
            try:
                rec = NoiseRecord.model_validate(item)
            except ValidationError as err:
                first = err.errors()[0]
                problems.append(f"noise record #{i + 1}: {'.'.join(map(str, first['loc'])) or 'item'}: {first['msg']}")
                continue
            lessons.noise[rec.run] = rec
        if problems:
            where = self._move_aside() if locked else None
            if where is not None:  # the readable lessons stay in the live store; the whole file is kept aside
                self._write(lessons)
            log.warning("the lessons store %s is corrupt (%s%s); %s; %d readable lesson(s) kept",
                        self.path, "; ".join(problems[:3]), f"; and {len(problems) - 3} more" if len(problems) > 3
                        else "", f"the file was moved aside to {where} (never overwritten)" if where
                        else "the file is left as it is", len(lessons))
        return lessons

    def _move_aside(self) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
            if aside.exists():
                continue
            try:
                os.link(self.path, aside)  # never replaces an existing file
            except FileExistsError:
                continue
            except OSError:
                try:
                    os.replace(self.path, aside)
                except OSError as err:
                    raise LessonStoreError(f"the lessons store {self.path} is corrupt and cannot be moved aside: "
                                           f"{err.strerror}") from None
                return aside
            os.unlink(self.path)
            _fsync_dir(self.path.parent)
            return aside
        raise LessonStoreError(f"the lessons store {self.path} is corrupt and cannot be moved aside")

    def _write(self, lessons: dict[str, Lesson]) -> None:
        parent = self.path.parent
        payload: dict[str, Any] = {"version": STORE_VERSION,
                                   "lessons": [lz.model_dump(mode="json") for lz in lessons.values()]}
        noise = getattr(lessons, "noise", {})
        if noise:
            payload["noise"] = [n.model_dump(mode="json") for n in noise.values()]
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".lessons-", suffix=".json.tmp")
        except OSError as err:
            raise LessonStoreError(f"cannot write the lessons store {self.path}: {err.strerror}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(err, OSError):
                raise LessonStoreError(f"cannot write the lessons store {self.path}: {err.strerror}") from None
            raise
        _fsync_dir(parent)

    def _load(self) -> dict[str, Lesson]:
        with self._mutex:
            return self._load_unlocked()

    def _load_unlocked(self) -> dict[str, Lesson]:
        stamp = self._stat()
        if self._lessons is None or stamp != self._stamp:
            with self._locked(write=False) as locked:
                lessons = self._read(locked=locked)
                self._stamp = self._stat()
            for op in self._pending:  # changes not saved yet stay applied
                op(lessons)
            self._lessons = lessons
        return self._lessons

    # -- the API ------------------------------------------------------------------------------------------
    def save(self) -> None:
        """Write the changes made through this store: under the lock, onto the file as it is now."""
        with self._mutex, self._locked(write=True):
            lessons = self._read(locked=True)
            for op in self._pending:
                op(lessons)
            self._write(lessons)
            self._stamp = self._stat()
            self._pending.clear()
            self._lessons = lessons

    def all(self) -> list[Lesson]:
        with self._mutex:
            lessons = list(self._load_unlocked().values())
        return sorted(lessons, key=lambda lz: (lz.scope.key(), lz.action.knob, lz.id))

    def get(self, lesson_id: str) -> Lesson | None:
        with self._mutex:
            lessons = dict(self._load_unlocked())
        if lesson_id in lessons:
            return lessons[lesson_id]
        matches = [lz for k, lz in lessons.items() if k.startswith(lesson_id)]
        return matches[0] if len(matches) == 1 else None

    def forget(self, lesson_id: str) -> bool:
        lesson = self.get(lesson_id)
        if lesson is None:
            return False

        def drop(lessons: dict[str, Lesson]) -> None:
            lessons.pop(lesson.id, None)

        self._change(drop)
        self.save()
        return True

    def add(self, observations: Iterable[Observation], run_id: str, min_gain: float = 0.02) -> list[Lesson]:
        """Fold observations of run ``run_id`` into the lessons (a run already folded in is skipped); ``save``
        writes them."""
        obs = list(observations)

        def fold_in(lessons: dict[str, Lesson]) -> list[Lesson]:
            touched: dict[str, Lesson] = {}
            # idempotent per run: a lesson that already holds this run's evidence is not folded again
            done = {lid for lid, lz in lessons.items() if run_id in lz.runs}
            for o in obs:
                lid = _lesson_id(o.scope, o.condition.bottleneck, o.action)
                if lid in done:
                    continue
                lessons[lid] = fold(lessons.get(lid), o, run_id, min_gain)
                touched[lid] = lessons[lid]
            for lid in [lid for lid in touched if never_paid(lessons[lid], min_gain)]:
                log.info("lesson %s forgotten: %s", lid, f"measured in {len(lessons[lid].runs)} runs, never paid")
                del lessons[lid]
                touched.pop(lid)
            return list(touched.values())

        return self._change(fold_in)

    def add_noise(self, record: NoiseRecord) -> None:
        """Keep the noise a run measured (a run already recorded is replaced); ``save`` writes it."""

        def put(lessons: dict[str, Lesson]) -> None:
            noise = lessons.noise if isinstance(lessons, _Contents) else {}
            noise[record.run] = record

        self._change(put)

    def noise_records(self) -> list[NoiseRecord]:
        """The runs' noise records, oldest first."""
        with self._mutex:
            lessons = self._load_unlocked()
            records = list(lessons.noise.values()) if isinstance(lessons, _Contents) else []
        return sorted(records, key=lambda n: (n.recorded, n.run))

    def noise_prior(self, recipe: Recipe, *, backend: str | None = None) -> tuple[float, int, int] | None:
        """(log-sd, degrees of freedom, runs) of the run-to-run noise that the last :data:`NOISE_PRIOR_RUNS` runs
        on this cluster (:func:`noise_in_scope`) measured, pooled; None where no run in scope recorded any."""
        target = scope_of(recipe, backend)
        mine = [n for n in self.noise_records() if noise_in_scope(n.scope, target)][-NOISE_PRIOR_RUNS:]
        df = sum(n.df for n in mine)
        if not df:
            return None
        return math.sqrt(math.fsum(n.sigma ** 2 * n.df for n in mine) / df), df, len(mine)

    def _change(self, op: _Op) -> Any:
        with self._mutex:
            lessons = self._load_unlocked()
            self._pending.append(op)
            return op(lessons)

    def in_scope(self, recipe: Recipe, *, backend: str | None = None,
                 include_simulated: bool = False) -> list[tuple[Lesson, float]]:
        """Lessons that apply to ``recipe`` run on ``backend`` with their scope match (best first); simulated
        lessons (and those of unknown provenance) steer a real run only with ``include_simulated``."""
        target = scope_of(recipe, backend)
        with self._mutex:
            lessons = list(self._load_unlocked().values())
        out = [(lz, scope_match(lz.scope, target, include_simulated)) for lz in lessons]
        return sorted([(lz, m) for lz, m in out if m > 0], key=lambda p: (-p[1], p[0].id))


class MemoryLessonStore(LessonStore):
    """Lessons held in memory only: a tenant's lessons sent with one request (the sidecar on Kubernetes, where
    each namespace's lessons live in that namespace, :mod:`attune.operator.lessons`). No file is read or written;
    ``add`` and ``save`` change only this object."""

    def __init__(self, lessons: Iterable[Lesson] = (), noise: Iterable[NoiseRecord] = ()) -> None:
        super().__init__(Path("/nonexistent/attune-memory-lessons.json"))
        contents = _Contents()
        for lz in lessons:
            contents[lz.id] = lz
        for n in noise:
            contents.noise[n.run] = n
        self._lessons = contents

    def _load_unlocked(self) -> dict[str, Lesson]:
        assert self._lessons is not None
        return self._lessons

    def save(self) -> None:
        with self._mutex:
            self._pending.clear()

    def payload(self) -> dict[str, Any]:
        """The lessons and noise records as JSON-ready lists (what a propose request carries)."""
        with self._mutex:
            contents = self._load_unlocked()
            noise = list(contents.noise.values()) if isinstance(contents, _Contents) else []
            return {"lessons": [lz.model_dump(mode="json") for lz in contents.values()],
                    "noise": [n.model_dump(mode="json") for n in noise]}


#: baseline runs of a run that starts with a noise prior (two without one)
PRIOR_BASELINE_REPEATS = 1


def noise_prior_overrides(store: LessonStore | None, recipe: Recipe, *, backend: str | None) -> dict[str, Any]:
    """The run configuration's overrides (``TuneConfig``) that carry the noise prior of ``store`` for a run of
    ``recipe`` on ``backend``: none without a store, or where no past run on this cluster measured its noise.

    With a prior the run measures its baseline once, not twice, unless the recipe names ``baseline_repeats``
    itself: the prior stands in for the second run's estimate of the noise where the first candidate is screened
    and its window sized (which only ever rejects or measures longer, never keeps), and it is weighed against the
    run's own repeats (the best's reference runs, the candidate's pair) before any decision keeps a change on it,
    and set aside where they contradict it (``RunNoise.with_prior``)."""
    prior = store.noise_prior(recipe, backend=backend) if store is not None else None
    if prior is None:
        return {}
    sigma, df, _runs = prior
    out: dict[str, Any] = {"noise_prior_sigma": sigma, "noise_prior_df": df}
    if "baseline_repeats" not in recipe.tuning.model_fields_set:
        out["baseline_repeats"] = PRIOR_BASELINE_REPEATS
    return out


def run_noise(state: Any, *, backend: str | None = None) -> NoiseRecord | None:
    """The run-to-run noise a finished run measured (every recipe it ran more than once, its certification runs
    among them, pooled), or None where it ran nothing twice."""
    from attune.engine.acceptance import RunNoise
    from attune.engine.state import repeated_runs

    noise = RunNoise.pooled(repeated_runs(state, kinds=("baseline", "reference", "candidate", "confirm", "certify")))
    if noise.df < 1 or not noise.sigma > 0 or not math.isfinite(noise.sigma):
        return None
    return NoiseRecord(run="", scope=scope_of(state.baseline, backend), sigma=noise.sigma, df=noise.df,
                       recorded=time.time())


def record_run(state: Any, store: LessonStore | str | Path | None = None, run_id: str | None = None, *,
               backend: str | None = None) -> list[Lesson]:
    """Distil lessons from a finished :class:`~attune.engine.loop.RunState` into ``store`` and save it.

    ``backend`` (default: the state's ``backend``) is recorded in each lesson's scope.
    """
    if not isinstance(store, LessonStore):
        if store is None and lessons_disabled():
            return []
        store = LessonStore(store)
    min_gain = getattr(getattr(state, "config", None), "min_gain", 0.02)
    backend = backend if backend is not None else getattr(state, "backend", None)
    obs = distil(state.baseline, state.records, min_gain, backend=backend)
    noise = run_noise(state, backend=backend)
    if not obs and noise is None:
        return []
    rid = run_id or hashlib.sha1(
        json.dumps([r.signature for r in state.records] + [state.baseline.name]).encode()).hexdigest()[:8]
    touched = store.add(obs, rid, min_gain)
    if noise is not None:
        store.add_noise(noise.model_copy(update={"run": rid}))
    store.save()
    log.info("recorded %d lesson(s) from run %s into %s", len(touched), rid, store.path)
    return touched


__all__ = ["STEER_BY_DEFAULT", "LessonStore", "MemoryLessonStore", "default_path", "lessons_disabled", "lessons_steer", "noise_prior_overrides",
           "record_run", "run_noise"]
