"""The gate's rule set: one pure function that admits or refuses a candidate recipe.

:func:`evaluate` is the only decision procedure. The engine calls it before every trial, the CLI's
``attune gate check`` calls it for people, and the Kubernetes admission webhook calls it on every
recipe update, so all three refuse exactly the same changes. It never runs anything: it compares
recipes, consults the framework's knob catalogue, and says which empirical checks a change still owes.

What it checks, in order:

1. *Validity*: a candidate given as a mapping must validate as a recipe; every problem is reported.
   Knob names outside the catalogue and values outside a knob's domain are reported per knob.
2. *Constraints*: every catalogue constraint the candidate violates (e.g. a micro-batch that no
   longer divides the global batch), by rule name.
3. *Contract*: the **effective** training contract of candidate and baseline must be identical: every
   field of ``training`` (batch, sequence, steps, optimizer, schedule, data, seeds, precision, dropout),
   the model architecture, the framework, and quantities derived from knobs that decide what is
   learned (tokens per step; the padded vocabulary where the framework pads it by tensor parallelism).
   ``training.numerics_opt_in`` may not be edited by a candidate: only the owner's baseline grants it.
4. *Knob semantics*: every knob that differs from the baseline is classified with
   ``Knob.semantics_of(value)``. ``contract`` knobs are refused; ``numerics_changing`` knobs are
   refused unless the baseline's ``training.numerics_opt_in`` lists the knob's ``numerics_class``.
   Knobs that differ from the *parent* decide what is owed: ``numerics_drift`` and opted-in
   ``numerics_changing`` changes owe ``loss_equivalence``; ``preserving`` changes owe nothing.
   A change of ``resources`` (device count) re-splits the data-parallel work: it counts as one more
   coupling group (``resources``) and owes ``loss_equivalence``.
   An *exploratory* knob (numerics class ``exploratory``: a setting the framework's discovery found but attune
   does not classify) is refused unless the baseline's ``tuning.explore`` names it (a numerics opt-in does not
   grant it); an explored change is ``numerics_changing``, owes ``loss_equivalence``, and its coupling group
   (``exploratory:NAME``) marks it in the verdict.
5. *History*: an exact repeat of a configuration already tried is refused, and so is a change that
   moves knobs of more than one coupling group relative to the parent, except two groups the catalogue declares
   coupled (``Catalogue.coupled_groups``) where moving either one alone is predicted infeasible (a violated
   constraint, or out of memory by the catalogue's memory model): that move is one change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from attune.errors import GateRefusal
from attune.frameworks.base import ContractField
from attune.frameworks.discover import EXPLORATORY
from attune.gate.verdict import LOSS_EQUIVALENCE, Reason, ReasonCode, Verdict, worst_semantics
from attune.recipe.catalogue import Catalogue, KnobValue, Semantics, format_value
from attune.recipe.change import signature
from attune.recipe.io import format_validation_error
from attune.recipe.model import Recipe

_RESTART_HINT = "to train a different model, make the changed recipe a new baseline instead of tuning toward it"


# ---------------------------------------------------------------------------------------------- public API


def whole_recipe(verdict: Verdict) -> Verdict:
    """``verdict`` without the one-coupling-group rule: the gate's view of a whole recipe, not of one step to it (the
    final best re-run for its references and certification, which reached it one group at a time; the benchmark's
    baselines, which propose whole configurations). Every other reason stands; where the group rule was the only
    one, the recipe is admitted and owes the loss check its semantics call for."""
    if verdict.admitted:
        return verdict
    rest = [r for r in verdict.reasons if r.code != ReasonCode.MULTIPLE_GROUPS]
    if rest:
        return verdict.model_copy(update={"reasons": rest})
    owes = verdict.semantics in (Semantics.NUMERICS_DRIFT, Semantics.NUMERICS_CHANGING)
    return verdict.model_copy(update={"admitted": True, "reasons": [], "owed": [LOSS_EQUIVALENCE] if owes else []})


def evaluate(
    baseline: Recipe,
    candidate: Recipe | Mapping[str, Any],
    history: Iterable[Recipe] = (),
    *,
    parent: Recipe | None = None,
) -> Verdict:
    """The gate's verdict on ``candidate``.

    ``baseline`` is the user's original recipe (the contract reference and the source of
    ``numerics_opt_in``); ``parent`` is the recipe the change was made from (defaults to ``baseline``);
    ``history`` holds every configuration already tried. ``candidate`` may be an unvalidated mapping:
    if it does not validate, the verdict refuses it with every problem found.
    """
    parent = parent if parent is not None else baseline
    reasons: list[Reason] = []
    cand = _load_candidate(candidate, reasons)
    if cand is None:
        return Verdict(admitted=False, reasons=reasons, semantics=Semantics.CONTRACT)

    cat = cand.catalogue
    knobs_valid = _check_knob_values(cand, baseline, cat, reasons)
    if knobs_valid:
        _check_constraints(cand, cat, reasons)
    _check_contract(baseline, cand, knobs_valid, reasons)

    base_eff, parent_eff, cand_eff = baseline.effective_knobs, parent.effective_knobs, cand.effective_knobs
    _check_knob_semantics(baseline, base_eff, cand_eff, cat, reasons)

    changed = {
        k: (parent_eff.get(k), cand_eff.get(k))
        for k in sorted(set(parent_eff) | set(cand_eff))
        if not _same(parent_eff.get(k), cand_eff.get(k))
    }
    groups = _groups(changed, cat)
    classes = [cat[k].semantics_of(new) if k in cat else Semantics.CONTRACT for k, (_, new) in changed.items()]
    if cand.resources != parent.resources:
        # more or fewer devices changes the data-parallel split (and so the reduction order), never the contract
        groups.setdefault("resources", [])
        classes.append(Semantics.NUMERICS_DRIFT)
    if any(r.code in (ReasonCode.CONTRACT, ReasonCode.OPT_IN_CHANGED, ReasonCode.CONTRACT_KNOB) for r in reasons):
        classes.append(Semantics.CONTRACT)
    semantics = worst_semantics(classes)

    _check_history(cand, history, changed, groups, cat, reasons, parent=parent)

    admitted = not reasons
    owes = admitted and any(c in (Semantics.NUMERICS_DRIFT, Semantics.NUMERICS_CHANGING) for c in classes)
    return Verdict(
        admitted=admitted,
        reasons=reasons,
        owed=[LOSS_EQUIVALENCE] if owes else [],
        changed_knobs=changed,
        changed_groups=sorted(groups),
        semantics=semantics,
    )


def equivalent_layout(recipe: Recipe, avoid: Sequence[str] = ()) -> dict[str, Any] | None:
    """A change the gate admits as pure reordering of sums (another micro-batch split) of ``recipe``.

    The loss-equivalence check trains the baseline under it to measure how far rounding alone moves the
    loss; ``None`` when the framework has no such move for this recipe.
    """
    layouts: list[dict[str, Any]] = recipe.framework_impl.equivalent_layouts(recipe, avoid)
    for change in layouts:
        v = evaluate(recipe, recipe.with_knobs(**change), (), parent=recipe)
        if v.admitted and v.semantics is Semantics.NUMERICS_DRIFT:
            return change
    return None


def enforce(
    baseline: Recipe,
    candidate: Recipe | Mapping[str, Any],
    history: Iterable[Recipe] = (),
    *,
    parent: Recipe | None = None,
) -> Verdict:
    """Like :func:`evaluate`, but raise :class:`GateRefusal` (with every reason) when refused."""
    verdict = evaluate(baseline, candidate, history, parent=parent)
    if not verdict.admitted:
        raise GateRefusal("the correctness gate refused the change:\n"
                          + "\n".join(f"  - {r.render()}" for r in verdict.reasons))
    return verdict


def effective_contract(recipe: Recipe, *, knobs_valid: bool = True) -> dict[str, Any]:
    """Every contract quantity of ``recipe`` as ``field path → value`` (edited or derived)."""
    out: dict[str, Any] = {"framework": recipe.framework}
    if recipe.model is not None:
        model = recipe.model.model_dump(mode="json")
        model["kv_groups"] = recipe.model.num_kv_groups  # None means "one group per head": compare effective
        _flatten("model", model, out)
    if recipe.training is not None:
        training = recipe.training.model_dump(mode="json")
        training.pop("numerics_opt_in")
        _flatten("training", training, out)
        out["training.tokens_per_step"] = recipe.training.tokens_per_step
    if knobs_valid:
        for path, derived in _derived(recipe).items():
            out[path] = derived.value
    return out


# ---------------------------------------------------------------------------------------------- checks


def _load_candidate(candidate: Recipe | Mapping[str, Any], reasons: list[Reason]) -> Recipe | None:
    """The candidate as a recipe whose contract validated; its knobs may still be illegal (checked later)."""
    if isinstance(candidate, Recipe):
        return candidate
    if not isinstance(candidate, Mapping):
        reasons.append(Reason(code=ReasonCode.INVALID_RECIPE, field="(recipe)",
                              message=f"expected a recipe mapping, got {type(candidate).__name__}; "
                                      "pass a Recipe or its dict form"))
        return None
    data = dict(candidate)
    try:
        return Recipe.model_validate(data)
    except ValidationError:
        pass  # re-validated piecewise below, so every problem gets its own reason
    knobs = data.get("knobs", {}) or {}
    if not isinstance(knobs, Mapping) or not all(isinstance(k, str) for k in knobs):
        reasons.append(Reason(code=ReasonCode.INVALID_RECIPE, field="knobs",
                              message=f"knobs must map knob names to values, got {knobs!r}; fix the knobs section"))
        knobs = None
    # validate everything but the knobs, so knob problems can be reported per knob and rule by rule
    tuning = data.get("tuning")
    search_space = tuning.get("search_space", ()) if isinstance(tuning, Mapping) else ()
    stripped = {**data, "knobs": {}}
    if search_space:  # names knobs too: checked against the candidate's catalogue below
        assert isinstance(tuning, Mapping)  # search_space is only non-empty when tuning is a mapping
        stripped["tuning"] = {**tuning, "search_space": ()}
    try:
        without_knobs = Recipe.model_validate(stripped)
    except ValidationError as err:
        for line in format_validation_error(err):
            reasons.append(_reason_from_line(line, data))
        return None
    cat = without_knobs.catalogue
    for name in search_space if isinstance(search_space, (list, tuple)) else [search_space]:
        if not isinstance(name, str) or name not in cat:
            reasons.append(Reason(code=ReasonCode.INVALID_RECIPE, field="tuning.search_space",
                                  message=f"{cat.unknown_knob_message(str(name))} Remove {name!r} from "
                                          "tuning.search_space"))
    if knobs is None:
        return None
    return without_knobs.model_copy(update={"knobs": dict(knobs)})


def _reason_from_line(line: str, data: Mapping[str, Any]) -> Reason:
    field, sep, msg = line.partition(": ")
    if not sep or " " in field:
        return Reason(code=ReasonCode.INVALID_RECIPE, field="(recipe)", message=f"{line}; fix the recipe")
    found, value = _lookup(data, field)
    got = f" (got {format_value(value)})" if found else ""
    return Reason(code=ReasonCode.INVALID_RECIPE, field=field, message=f"{msg}{got}; fix {field}")


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    node = data
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return False, None
    return True, node


def _check_knob_values(cand: Recipe, baseline: Recipe, cat: Catalogue, reasons: list[Reason]) -> bool:
    ok = True
    base_eff = baseline.effective_knobs
    for name, value in cand.knobs.items():
        if name not in cat:
            ok_hint = " Environment variables are knobs only where the catalogue lists them." \
                if name.startswith("env.") else ""
            reasons.append(Reason(
                code=ReasonCode.UNKNOWN_KNOB, field=f"knobs.{name}",
                message=f"{cat.unknown_knob_message(name)}{ok_hint} Remove knobs.{name} (set to {value!r}); "
                        "the gate cannot vouch for settings outside the catalogue."))
            continue
        problem = cat[name].check_value(value)
        if problem:
            ok = False
            reasons.append(Reason(
                code=ReasonCode.ILLEGAL_VALUE, field=f"knobs.{name}",
                message=f"{problem} (baseline: {base_eff.get(name)!r}); pick a legal value"))
    return ok


def _check_constraints(cand: Recipe, cat: Catalogue, reasons: list[Reason]) -> None:
    for constraint, message in cat.constraint_problems(cand):
        reasons.append(Reason(
            code=ReasonCode.CONSTRAINT, field=", ".join(f"knobs.{k}" for k in constraint.knobs),
            message=f"rule {constraint.name}: {message}"))


def _check_contract(baseline: Recipe, cand: Recipe, knobs_valid: bool, reasons: list[Reason]) -> None:
    base_c = effective_contract(baseline)
    cand_c = effective_contract(cand, knobs_valid=knobs_valid)
    derived = _derived(baseline)
    frozen = [p for p, d in derived.items() if d.kind != "derived"]
    if knobs_valid and frozen and not any(p in cand_c for p in frozen):
        lost = sorted(frozen, key=_contract_order)
        if lost:  # fail closed: an adapter that cannot read the candidate's launch states none of what it freezes
            problems = "; ".join(cand.framework_impl.check(cand)) or "its adapter states none of them"
            reasons.append(Reason(
                code=ReasonCode.CONTRACT, field=lost[0],
                message=f"the candidate's {baseline.framework} launch cannot be read for the settings the "
                        f"baseline's freezes ({', '.join(lost[:4])}{', …' if len(lost) > 4 else ''}: "
                        f"{len(lost)} in all): {problems}. The gate cannot vouch for a launch it cannot read; "
                        "restore the launch the baseline runs"))
    for path in sorted(set(base_c) | set(cand_c), key=_contract_order):
        if path not in base_c or path not in cand_c:
            continue  # a derived quantity is only comparable when both sides derive it
        old, new = base_c.get(path), cand_c.get(path)
        if _same(old, new):
            continue
        explain = derived[path].explain if path in derived else None
        if explain is not None:
            msg = explain(old, new)
        elif path in derived and derived[path].kind == "frozen":
            msg = (f"changed from {format_value(old)} (baseline) to {format_value(new)}, but attune does not model "
                   f"this {baseline.framework} setting: it is carried through verbatim and frozen; restore it to "
                   f"{format_value(old)}")
            if derived[path].fix:
                msg += f". {derived[path].fix}"
        elif path in derived and derived[path].kind == "contract":
            msg = (f"changed from {format_value(old)} (baseline) to {format_value(new)}, but this {baseline.framework} "
                   f"setting is part of the training contract; restore it to {format_value(old)} ({_RESTART_HINT})")
            if derived[path].fix:
                msg += f". {derived[path].fix}"
        elif path in derived:
            d = derived[path]
            moved = [dep for dep in d.depends_on if _dep_value(baseline, dep) != _dep_value(cand, dep)]
            because = f" because {', '.join(moved)} changed" if moved else ""
            msg = (f"changes from {format_value(old)} to {format_value(new)}{because}; "
                   f"this quantity decides what the model learns. {d.fix}")
        elif path == "training.tokens_per_step":
            assert baseline.training is not None  # effective_contract derives this path only from a training section
            msg = (f"tokens per optimizer step change from {format_value(old)} to {format_value(new)} "
                   f"(global_batch_size × seq_length); restore training.global_batch_size "
                   f"({baseline.training.global_batch_size}) and training.seq_length ({baseline.training.seq_length})")
        else:
            msg = (f"changed from {format_value(old)} (baseline) to {format_value(new)}, "
                   f"but it is part of the training contract; restore it to {format_value(old)} ({_RESTART_HINT})")
            hint = {**_FIELD_HINTS, **baseline.framework_impl.field_hints}.get(path)
            if hint:
                msg += f". {hint}"
        reasons.append(Reason(code=ReasonCode.CONTRACT, field=path, message=msg))
    base_opt, cand_opt = baseline.numerics_opt_in, cand.numerics_opt_in
    if tuple(base_opt) != tuple(cand_opt):
        reasons.append(Reason(
            code=ReasonCode.OPT_IN_CHANGED,
            field="training.numerics_opt_in" if baseline.training is not None else "launch.numerics_opt_in",
            message=f"only the recipe owner grants numerics opt-ins: baseline {list(base_opt)}, candidate "
                    f"{list(cand_opt)}; restore it to {list(base_opt)} (the owner may add a class to the "
                    "baseline recipe itself)"))


_FIELD_HINTS = {
    "training.precision": "Lower-precision execution belongs in a numerics_changing knob with an owner opt-in, "
                          "not in the contract",
    "model.vocab_size": "The tokenizer vocabulary is part of the model",
}


def _contract_order(path: str) -> tuple[int, str]:
    head = path.split(".", 1)[0]
    return ({"framework": 0, "training": 1, "model": 2}.get(head, 3), path)


def _check_knob_semantics(
    baseline: Recipe,
    base_eff: dict[str, KnobValue],
    cand_eff: dict[str, KnobValue],
    cat: Catalogue,
    reasons: list[Reason],
) -> None:
    """Refuse contract knobs and un-opted-in numerics changes that differ from the *baseline*.

    Comparing with the baseline (not the parent) means a chain of parents cannot launder a change.
    """
    opt_in = set(baseline.numerics_opt_in)
    explore = set(baseline.tuning.explore)
    for name in sorted(cand_eff):
        if name not in cat or _same(base_eff.get(name), cand_eff[name]):
            continue
        knob, old, new = cat[name], base_eff.get(name), cand_eff[name]
        if knob.check_value(new):
            continue  # reported as illegal_value
        sem = knob.semantics_of(new)
        if sem is Semantics.CONTRACT:
            reasons.append(Reason(
                code=ReasonCode.CONTRACT_KNOB, field=f"knobs.{name}",
                message=f"changes what the model learns ({format_value(old)} → {format_value(new)}); "
                        f"restore it to {format_value(old)} ({_RESTART_HINT})"))
        elif sem is Semantics.NUMERICS_CHANGING and knob.numerics_class == EXPLORATORY:
            if name not in explore:
                reasons.append(Reason(
                    code=ReasonCode.NUMERICS_NOT_OPTED_IN, field=f"knobs.{name}",
                    message=f"{format_value(old)} → {format_value(new)} changes an unclassified {baseline.framework} "
                            f"setting attune cannot vouch for, so it is frozen; restore it to {format_value(old)}, or "
                            f"have the recipe owner list {name!r} in the baseline's tuning.explore (then the change "
                            "is tried as numerics-changing and owes the loss-equivalence check)"))
        elif sem is Semantics.NUMERICS_CHANGING and knob.numerics_class not in opt_in:
            cls = knob.numerics_class or name
            reasons.append(Reason(
                code=ReasonCode.NUMERICS_NOT_OPTED_IN, field=f"knobs.{name}",
                message=f"{format_value(old)} → {format_value(new)} changes numerics by design (class {cls!r}) "
                        f"and the baseline's training.numerics_opt_in {sorted(opt_in)} does not list {cls!r}; restore it to "
                        f"{format_value(old)}, or have the recipe owner add {cls!r} to training.numerics_opt_in"))


def _groups(changed: Mapping[str, Any], cat: Catalogue) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in changed:
        group = cat[name].coupling_group if name in cat else name
        groups.setdefault(group, []).append(name)
    return groups


def _check_history(
    cand: Recipe,
    history: Iterable[Recipe],
    changed: Mapping[str, Any],
    groups: Mapping[str, list[str]],
    cat: Catalogue,
    reasons: list[Reason],
    parent: Recipe | None = None,
) -> None:
    if len(groups) > 1 and not _coupled_move(parent, cand, groups, cat):
        detail = "; ".join(f"{g}: {', '.join(ks) or 'resources'}" for g, ks in sorted(groups.items()))
        fields = [f"knobs.{k}" for k in changed] + (["resources"] if "resources" in groups else [])
        reasons.append(Reason(
            code=ReasonCode.MULTIPLE_GROUPS, field=", ".join(fields),
            message=f"the change moves {len(groups)} coupling groups at once ({detail}); change one group per "
                    "step so each effect is measured on its own"))
    sig = (signature(cand), cand.resources)
    for previous in history:
        if (signature(previous), previous.resources) == sig:
            label = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(cand.knobs.items())) or "all defaults"
            reasons.append(Reason(
                code=ReasonCode.REPEAT, field="knobs",
                message=f"this exact configuration ({label}) was already tried; propose a configuration "
                        "not in the history"))
            break


def _coupled_move(parent: Recipe | None, cand: Recipe, groups: Mapping[str, list[str]], cat: Catalogue) -> bool:
    """Two coupling groups the catalogue declares coupled, where moving one of them alone is predicted infeasible."""
    if parent is None or len(groups) != 2 or "resources" in groups or cand.resources != parent.resources:
        return False
    (a, ka), (b, kb) = sorted(groups.items())
    if not cat.coupled(a, b) or not all(k in cat for k in (*ka, *kb)):
        return False
    for names in (ka, kb):
        try:
            alone = parent.with_knobs(**{k: cand.knob(k) for k in names})
        except Exception:  # noqa: BLE001 - a part that is not even a valid recipe cannot run alone
            return True
        if cat.predicts_infeasible(alone):
            return True
    return False


# ---------------------------------------------------------------------------------------------- helpers


def _derived(recipe: Recipe) -> dict[str, ContractField]:
    fields: dict[str, ContractField] = recipe.framework_impl.contract(recipe)
    return fields


def _dep_value(recipe: Recipe, dep: str) -> Any:
    if dep.startswith("knobs."):
        return recipe.effective_knobs.get(dep.removeprefix("knobs."))
    obj: Any = recipe
    for part in dep.split("."):
        obj = getattr(obj, part, None)
    return obj


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _same(a: Any, b: Any) -> bool:
    """Equality that does not confuse True with 1 or 1 with 1.0 across types that mean different things."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)




def admissible_values(recipe: Recipe, knob: str) -> list[KnobValue]:
    """The values of ``knob`` the gate can admit whatever the other knobs are (per-value semantics, vocab)."""
    cat = recipe.catalogue
    k = cat[knob]
    opt_in = set(recipe.numerics_opt_in)
    base_val = recipe.knob(knob)
    out = []
    for v in k.values:
        if v != base_val or type(v) is not type(base_val):
            sem = k.semantics_of(v)
            if sem is Semantics.CONTRACT:
                continue
            if sem is Semantics.NUMERICS_CHANGING and k.numerics_class not in opt_in:
                continue
        out.append(v)
    # values that move a derived contract quantity (e.g. a TP size that changes the padded vocabulary) are out
    base_c = effective_contract(recipe)
    kept = []
    for v in out:
        cand = recipe.model_copy(update={"knobs": {**recipe.knobs, knob: v}})
        if effective_contract(cand) == base_c:
            kept.append(v)
    return kept


__all__ = ["admissible_values", "effective_contract", "enforce", "equivalent_layout", "evaluate"]
